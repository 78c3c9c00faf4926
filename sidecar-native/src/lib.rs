//! `gym_sidecar_native`: the native scanner of the sidecar's trace pipeline.
//!
//! `scan_traces` validates an OTLP ExportTraceServiceRequest exactly as upb's parser
//! (the `protobuf` package's backend) accepts or refuses it, applies the receiver's
//! nesting and message-count limits, and returns the index the pipeline works on
//! (`gym_sidecar.core.traces`): the ResourceSpans and ScopeSpans blocks of the request,
//! and for the scopes the derive stage reads, the few fields of each span it needs.
//! Nothing else of a span becomes a Python object, and no span is copied: only the few
//! fields of the derive tuples.
//!
//! The contract, and the pure-Python scanner it must agree with, are described in
//! `gym_sidecar_native.pyi` and docs/native.md.

mod count;
mod derive;
mod scan;
mod schema;
mod split;
mod wire;

use pyo3::exceptions::PyValueError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyFrozenSet, PyInt, PyList, PyString, PyTuple};

use crate::derive::{Keys, Value};
use crate::scan::{Index, Range, Refusal, Scan};

/// `limits.PARSER_MAX_DEPTH`: the receiver checks a configured depth only below it, and
/// leaves deeper requests to upb, which allows one level more (`scan::PARSER_LEVELS`).
const MAX_DEPTH_CAP: i64 = 100;

pyo3::create_exception!(
    gym_sidecar_native,
    DecodeError,
    PyValueError,
    "The bytes are not a valid ExportTraceServiceRequest (upb would refuse them). The \
     message is upb's own; `detail` says what is wrong and where, `offset` is that byte."
);
pyo3::create_exception!(
    gym_sidecar_native,
    TooDeep,
    PyValueError,
    "The request nests messages deeper than allowed: max_depth levels when it is below \
     100, else upb's own 101 (the request being level 1)."
);
pyo3::create_exception!(
    gym_sidecar_native,
    TooManyMessages,
    PyValueError,
    "The request holds more than max_messages protobuf messages (itself included)."
);

/// An int argument clamped into i64 (Python ints are unbounded).
fn clamp_int(value: &Bound<'_, PyInt>) -> i64 {
    match value.extract::<i64>() {
        Ok(v) => v,
        Err(_) => {
            if value.lt(0).unwrap_or(false) {
                i64::MIN
            } else {
                i64::MAX
            }
        }
    }
}

/// Validates `data` and applies the limits: the index, or why the request is refused.
///
/// Exactly the receiver's `decode_protobuf`, in its order: the message count first (as
/// `count_messages` counts, and only for bodies longer than 2 x `max_messages`), then
/// what upb refuses, in wire order, then, below 100, the configured depth on the parsed
/// tree.
fn validate<'a>(
    data: &'a [u8],
    max_depth: i64,
    max_messages: i64,
    derive_scopes: &'a [&'a [u8]],
    keys: &'a Keys<'a>,
    sparse: (&'a [&'a [u8]], &'a [&'a [u8]]),
) -> Result<Index, Refusal> {
    // decode_protobuf counts only bodies of more than 2 x the limit (a smaller one holds
    // at most limit + 1 messages: the index of such a body is bounded anyway).
    let counted = data.len() as i128 > 2 * i128::from(max_messages);
    let record_limit = if counted { max_messages } else { i64::MAX };
    let mut scan = Scan::new(data, record_limit, derive_scopes, keys, sparse);
    match scan.request() {
        Ok(deepest) => {
            // Accepted by upb: the pass counted what count_messages counts.
            if counted && i128::from(scan.count) > i128::from(max_messages) {
                return Err(Refusal::TooManyMessages);
            }
            // The configured depth, checked (as message_depth_exceeds) only below
            // upb's: at 100 and above, upb's own 101 levels are the limit.
            if max_depth < MAX_DEPTH_CAP {
                let limit = max_depth.max(1) as u32;
                if deepest > limit {
                    return Err(Refusal::TooDeep { levels: limit });
                }
            }
            Ok(scan.index)
        }
        Err(refusal) => {
            if counted && count::count_messages(data, max_messages) > max_messages {
                return Err(Refusal::TooManyMessages);
            }
            Err(refusal)
        }
    }
}

/// upb's own message for a refused request (what `ParseFromString` raises), so that the
/// receiver answers with the same text whichever scanner ran.
fn upb_message(status: &str) -> String {
    let request = schema::full_name(schema::Msg::Request);
    format!("Error parsing message with type '{request}': {status}")
}

/// A `DecodeError` whose message is upb's and whose `detail` and `offset` say what is
/// wrong and where.
fn decode_error(py: Python<'_>, status: &str, detail: String, offset: usize) -> PyErr {
    let err = DecodeError::new_err(upb_message(status));
    let value = err.value(py);
    if let Err(e) = value
        .setattr("detail", detail)
        .and_then(|()| value.setattr("offset", offset))
    {
        return e;
    }
    err
}

fn refusal_error(py: Python<'_>, refusal: Refusal, max_depth: i64, max_messages: i64) -> PyErr {
    let limit = max_depth.clamp(1, MAX_DEPTH_CAP);
    match refusal {
        Refusal::Corrupt { what, msg, at } => decode_error(
            py,
            "Wire format was corrupt",
            format!("{what} (in {}) at byte {at}", schema::short_name(msg)),
            at,
        ),
        Refusal::BadUtf8 { msg, field, at } => decode_error(
            py,
            "String field had bad UTF-8",
            format!(
                "string field {}.{} is not valid UTF-8, at byte {at}",
                schema::short_name(msg),
                schema::field_name(msg, field)
            ),
            at,
        ),
        Refusal::ParserTooDeep { at } => TooDeep::new_err(format!(
            "request nests deeper than {limit} message levels (the message at byte {at} is \
             past the parser's own limit)"
        )),
        Refusal::TooDeep { levels } => {
            TooDeep::new_err(format!("request nests deeper than {levels} message levels"))
        }
        Refusal::TooManyMessages => TooManyMessages::new_err(format!(
            "request holds more than {max_messages} protobuf messages"
        )),
    }
}

/// A new reference from the C API as a `Bound`, or the Python error it set.
///
/// # Safety
/// `ptr` must be a new (owned) reference or null with a Python error set.
unsafe fn owned<'py>(py: Python<'py>, ptr: *mut ffi::PyObject) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: as the caller promises.
    unsafe { Bound::from_owned_ptr_or_err(py, ptr) }
}

/// A tuple of `items`, each reference moved into it (`items` is left empty).
fn tuple<'py>(py: Python<'py>, items: &mut Vec<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyTuple_New returns a new reference (or null with an error); PyTuple_SetItem
    // steals the item's reference (`into_ptr`) and cannot fail on a fresh tuple's slot.
    unsafe {
        let out = owned(py, ffi::PyTuple_New(items.len() as ffi::Py_ssize_t))?;
        for (i, item) in items.drain(..).enumerate() {
            ffi::PyTuple_SetItem(out.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr());
        }
        Ok(out)
    }
}

fn bytes_object<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: PyBytes_FromStringAndSize copies `bytes` and returns a new reference.
    unsafe {
        owned(
            py,
            ffi::PyBytes_FromStringAndSize(bytes.as_ptr().cast(), bytes.len() as ffi::Py_ssize_t),
        )
    }
}

/// Converts one derive value.
fn value_object<'py>(py: Python<'py>, data: &[u8], value: Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::None => py.None().into_bound(py),
        Value::Str((s, e)) => PyString::new(py, utf8(&data[s..e])).into_any(),
        Value::Bool(b) => PyBool::new(py, b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Double(f) => f.into_pyobject(py)?.into_any(),
        Value::Bytes((s, e)) => bytes_object(py, &data[s..e])?,
    })
}

/// A string field the validating pass already checked.
fn utf8(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// The derive tuples of one block's spans; with `sparse` (the indexes of the sparse
/// keys in the values, and how many of the block's spans the pass read as a sparse
/// scope's), of its spans with a value for one of those keys only: looked for among the
/// spans the pass marked (`Index::marked`) when it read every span of the block so,
/// else among all.
///
/// Spans of a block mostly repeat their name and their values tuple (`(None, True,
/// None)`): equal ones share one object, as interned strings would; so do a value's
/// equal strings from one span to the next.
fn derive_block<'py>(
    py: Python<'py>,
    data: &[u8],
    index: &Index,
    first_span: usize,
    count: usize,
    keys: &Keys<'_>,
    sparse: Option<(&[usize], usize)>,
) -> PyResult<Bound<'py, PyAny>> {
    let (sparse, sparse_read) = match sparse {
        Some((marks, read)) => (Some(marks), read),
        None => (None, 0),
    };
    // SAFETY: PyList_New returns a new reference (or null with an error); PyList_SetItem
    // steals the item's reference and fills each slot of the fresh list exactly once. A
    // sparse block's list grows by appending (its length is not known in advance).
    let list = match sparse {
        None => unsafe { owned(py, ffi::PyList_New(count as ffi::Py_ssize_t))? },
        Some(_) => PyList::empty(py).into_any(),
    };
    let mut read = vec![Value::None; keys.len()];
    let mut last_values: Option<(Vec<Value>, Bound<'py, PyAny>)> = None;
    let mut last_name: Option<(Range, Bound<'py, PyAny>)> = None;
    // Per value: the last string made for it. A model server's calls repeat their model
    // and operation while their token counts differ (the values tuples are not shared):
    // one object per repeated string, hashed once where the derive stage keys on it.
    let mut last_strings: Vec<Option<(Range, Bound<'py, PyAny>)>> = vec![None; keys.len()];
    let mut items: Vec<Bound<'py, PyAny>> = Vec::with_capacity(keys.len().max(7));
    let mut records = index.records[index.records.partition_point(|r| r.span < first_span)..]
        .iter()
        .peekable();
    // The spans to read: the marked ones of a block read sparsely throughout, else all.
    let marked = if sparse.is_some() && sparse_read == count {
        let from = index.marked.partition_point(|&m| m < first_span);
        let to = index.marked.partition_point(|&m| m < first_span + count);
        Some(&index.marked[from..to])
    } else {
        None
    };
    let reads = marked.map_or(count, <[usize]>::len);
    for i in 0..reads {
        let span = marked.map_or(first_span + i, |m| m[i]);
        let record = records.next_if(|r| r.span == span);
        // The pass's record when it has a complete one, else read the span again.
        let fields_read;
        let (f, values) = match record {
            Some(r) if r.complete => (&r.fields, &index.values[r.values..r.values + keys.len()]),
            _ => {
                fields_read = derive::span(data, index.spans[span], keys, &mut read);
                (&fields_read, &read[..])
            }
        };
        if let Some(marks) = sparse {
            if marks.iter().all(|&m| values[m] == Value::None) {
                continue; // not one of the block's rare spans
            }
        }
        let name_bytes = &data[f.name.0..f.name.1];
        let name = match &last_name {
            Some((range, object)) if &data[range.0..range.1] == name_bytes => object.clone(),
            _ => {
                let object = PyString::new(py, utf8(name_bytes)).into_any();
                last_name = Some((f.name, object.clone()));
                object
            }
        };
        let values_object = match &last_values {
            Some((previous, object))
                if previous
                    .iter()
                    .zip(values)
                    .all(|(a, b)| derive::same(data, *a, *b)) =>
            {
                object.clone()
            }
            _ => {
                for (slot, &v) in values.iter().enumerate() {
                    let object = match v {
                        Value::Str((s, e)) => match &last_strings[slot] {
                            Some((range, object)) if data[range.0..range.1] == data[s..e] => {
                                object.clone()
                            }
                            _ => {
                                let object = PyString::new(py, utf8(&data[s..e])).into_any();
                                last_strings[slot] = Some(((s, e), object.clone()));
                                object
                            }
                        },
                        _ => value_object(py, data, v)?,
                    };
                    items.push(object);
                }
                let object = tuple(py, &mut items)?;
                last_values = Some((values.to_vec(), object.clone()));
                object
            }
        };
        items.extend([
            name,
            f.start_time.into_pyobject(py)?.into_any(),
            f.end_time.into_pyobject(py)?.into_any(),
            bytes_object(py, &data[f.trace_id.0..f.trace_id.1])?,
            bytes_object(py, &data[f.span_id.0..f.span_id.1])?,
            f.status_code.into_pyobject(py)?.into_any(),
            values_object,
        ]);
        let item = tuple(py, &mut items)?;
        if sparse.is_some() {
            list.cast::<PyList>()?.append(item)?;
        } else {
            // SAFETY: see above; `i` < the list's length.
            unsafe { ffi::PyList_SetItem(list.as_ptr(), i as ffi::Py_ssize_t, item.into_ptr()) };
        }
    }
    Ok(list)
}

fn ranges<'py>(py: Python<'py>, ranges: &[Range]) -> PyResult<Bound<'py, PyList>> {
    PyList::new(py, ranges.iter().map(|&(s, e)| (s, e)))
}

/// The str members of a frozenset of scope names (only those can equal a scope's name;
/// the final test stays `name in the set`); none for no set.
fn name_strings<'py>(names: Option<&Bound<'py, PyFrozenSet>>) -> Vec<Bound<'py, PyString>> {
    names.map_or_else(Vec::new, |set| {
        set.iter()
            .filter_map(|name| name.cast_into::<PyString>().ok())
            .collect()
    })
}

/// The UTF-8 bytes of `names` ([`name_strings`]), skipping any that has none.
fn name_bytes<'a>(names: &'a [Bound<'_, PyString>]) -> Vec<&'a [u8]> {
    names
        .iter()
        .filter_map(|name| name.to_str().ok().map(str::as_bytes))
        .collect()
}

/// The `(event name, attribute key)` pairs of `event_keys` (a tuple of 2-tuples of str).
fn event_key_strings<'py>(
    event_keys: Option<&Bound<'py, PyTuple>>,
) -> PyResult<Vec<(Bound<'py, PyString>, Bound<'py, PyString>)>> {
    let Some(event_keys) = event_keys else {
        return Ok(Vec::new());
    };
    event_keys
        .iter()
        .map(|pair| {
            let (name, key): (Bound<'py, PyString>, Bound<'py, PyString>) = pair.extract()?;
            Ok((name, key))
        })
        .collect()
}

/// The `split` list of one ScopeSpans block: `(name, start, end)` per span.
fn split_list<'py>(py: Python<'py>, data: &[u8], block: Range) -> PyResult<Bound<'py, PyList>> {
    let out = PyList::empty(py);
    for ((s, e), start, end) in split::spans(data, block) {
        out.append((PyString::new(py, utf8(&data[s..e])), start, end))?;
    }
    Ok(out)
}

/// Validates an OTLP trace export request and returns its index.
///
/// See gym_sidecar_native.pyi for the contract.
#[pyfunction]
#[pyo3(signature = (
    data, max_depth, max_messages, derive_scopes, attr_keys, resource_block, scope_block,
    event_keys=None, split_scopes=None, sparse_scopes=None, sparse_keys=None,
))]
#[allow(clippy::too_many_arguments)]
fn scan_traces<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyBytes>,
    max_depth: &Bound<'py, PyInt>,
    max_messages: &Bound<'py, PyInt>,
    derive_scopes: &Bound<'py, PyFrozenSet>,
    attr_keys: &Bound<'py, PyTuple>,
    resource_block: &Bound<'py, PyAny>,
    scope_block: &Bound<'py, PyAny>,
    event_keys: Option<&Bound<'py, PyTuple>>,
    split_scopes: Option<&Bound<'py, PyFrozenSet>>,
    sparse_scopes: Option<&Bound<'py, PyFrozenSet>>,
    sparse_keys: Option<&Bound<'py, PyTuple>>,
) -> PyResult<(Bound<'py, PyList>, Bound<'py, PyList>)> {
    let max_depth = clamp_int(max_depth);
    let max_messages = clamp_int(max_messages);
    let bytes = data.as_bytes();
    let keys_owned: Vec<Bound<'py, PyString>> = attr_keys
        .iter()
        .map(|k| k.cast_into::<PyString>().map_err(PyErr::from))
        .collect::<PyResult<_>>()?;
    let key_bytes: Vec<&[u8]> = keys_owned
        .iter()
        .map(|k| k.to_str().map(str::as_bytes))
        .collect::<PyResult<_>>()?;
    let events_owned = event_key_strings(event_keys)?;
    let event_bytes: Vec<(&[u8], &[u8])> = events_owned
        .iter()
        .map(|(name, key)| Ok((name.to_str()?.as_bytes(), key.to_str()?.as_bytes())))
        .collect::<PyResult<_>>()?;
    let keys = Keys::new(&key_bytes, &event_bytes);
    // The values that mark a sparse scope's spans: each sparse key's position in attr_keys.
    let mut marks: Vec<usize> = Vec::new();
    if let Some(sparse_keys) = sparse_keys {
        for key in sparse_keys.iter() {
            let key = key.cast_into::<PyString>().map_err(PyErr::from)?;
            let key = key.to_str()?.as_bytes();
            match key_bytes.iter().position(|k| *k == key) {
                Some(i) => marks.push(i),
                None => {
                    return Err(PyValueError::new_err(
                        "every sparse key must be one of attr_keys",
                    ));
                }
            }
        }
    }
    // The names to derive from, for the pass to record derive fields as it reads (only str
    // members can equal a scope name; the final test is `name in derive_scopes`).
    let scopes_owned = name_strings(Some(derive_scopes));
    let scope_bytes = name_bytes(&scopes_owned);

    // The sparse scopes' names and keys, for the pass to mark the spans it may report.
    let sparse_owned = name_strings(sparse_scopes);
    let sparse_scope_bytes = name_bytes(&sparse_owned);
    let sparse_key_bytes: Vec<&[u8]> = marks.iter().map(|&m| key_bytes[m]).collect();
    let sparse = (&sparse_scope_bytes[..], &sparse_key_bytes[..]);

    let index = validate(bytes, max_depth, max_messages, &scope_bytes, &keys, sparse)
        .map_err(|r| refusal_error(py, r, max_depth, max_messages))?;

    let blocks = PyList::empty(py);
    for block in &index.blocks {
        let resources = &index.resources[block.resources.0..block.resources.1];
        let resource = match resources {
            [] => None,
            [(s, e)] => Some(PyBytes::new(py, &bytes[*s..*e])),
            many => {
                let total = many.iter().map(|(s, e)| e - s).sum();
                let mut joined = Vec::with_capacity(total);
                for (s, e) in many {
                    joined.extend_from_slice(&bytes[*s..*e]);
                }
                Some(PyBytes::new(py, &joined))
            }
        };
        let scopes = PyList::empty(py);
        for scope in &index.scopes[block.scopes.0..block.scopes.1] {
            let name = match scope.name {
                Some((s, e)) => PyString::new(py, utf8(&bytes[s..e])),
                None => PyString::new(py, ""),
            };
            let derived = if derive_scopes.contains(&name)? {
                let sparse = match sparse_scopes {
                    Some(set) if set.contains(&name)? => Some((&marks[..], scope.sparse_read)),
                    _ => None,
                };
                Some(derive_block(
                    py,
                    bytes,
                    &index,
                    scope.first_span,
                    scope.spans,
                    &keys,
                    sparse,
                )?)
            } else {
                None
            };
            let split = match split_scopes {
                Some(set) if set.contains(&name)? => Some(split_list(py, bytes, scope.range)?),
                _ => None,
            };
            let block =
                scope_block.call1((scope.range.0, scope.range.1, name, scope.spans, derived))?;
            if let Some(split) = split {
                block.setattr("split", split)?;
            }
            scopes.append(block)?;
        }
        let others = ranges(py, &index.others[block.others.0..block.others.1])?;
        blocks.append(resource_block.call1((
            block.range.0,
            block.range.1,
            resource,
            scopes,
            others,
        ))?)?;
    }
    Ok((blocks, ranges(py, &index.top_other)?))
}

/// The schema compiled in: `(message full name, field number, field name, kind, message
/// type or None)` for every field, kind one of varint, fixed64, fixed32, bytes, string,
/// message. A test compares it with the installed opentelemetry-proto's descriptors.
#[pyfunction(name = "schema")]
fn schema_table() -> Vec<(
    &'static str,
    u32,
    &'static str,
    &'static str,
    Option<&'static str>,
)> {
    let mut out = Vec::new();
    for msg in schema::ALL {
        for number in 1..=schema::MAX_FIELD {
            let Some(kind) = schema::field(msg, number) else {
                continue;
            };
            let (kind_name, child) = match kind {
                schema::Kind::Varint => ("varint", None),
                schema::Kind::Fixed64 => ("fixed64", None),
                schema::Kind::Fixed32 => ("fixed32", None),
                schema::Kind::Bytes => ("bytes", None),
                schema::Kind::Str => ("string", None),
                schema::Kind::Message(m) => ("message", Some(schema::full_name(m))),
            };
            out.push((
                schema::full_name(msg),
                number,
                schema::field_name(msg, number),
                kind_name,
                child,
            ));
        }
    }
    out
}

/// How many messages `gym_sidecar.wire.protobuf.bounds.count_messages` counts in a trace
/// request (stopping past `limit`): its port, exposed so the tests compare the two.
#[pyfunction(name = "count_messages")]
fn count_messages_py(data: &Bound<'_, PyBytes>, limit: &Bound<'_, PyInt>) -> i64 {
    count::count_messages(data.as_bytes(), clamp_int(limit))
}

#[pymodule]
fn gym_sidecar_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_function(wrap_pyfunction!(scan_traces, m)?)?;
    m.add_function(wrap_pyfunction!(schema_table, m)?)?;
    m.add_function(wrap_pyfunction!(count_messages_py, m)?)?;
    m.add("DecodeError", py.get_type::<DecodeError>())?;
    m.add("TooDeep", py.get_type::<TooDeep>())?;
    m.add("TooManyMessages", py.get_type::<TooManyMessages>())?;
    Ok(())
}
