//! `gym_sidecar.wire.protobuf.bounds.count_messages`, step for step, for corrupt requests.
//!
//! On a request upb accepts, the validating pass counts exactly what `count_messages`
//! counts. On a corrupt one the receiver's answer depends on where `count_messages`
//! stops: it counts first and refuses for the count when it passes the limit before it
//! meets the corruption, in its own order (a stack: each message's fields in wire order,
//! then its last child first). The validating pass reads in another order, so for a
//! corrupt request the count is redone here the way the Python function does it:
//! unbounded positions (Python ints), a child's range not clipped to its parent's, and
//! any unreadable byte ending the count.

use crate::schema::{self, Kind, Msg};

/// `data[pos]`'s varint as `limits._varint` reads it: up to 10 bytes, the value
/// unbounded (70 bits fit a u128). None where Python raises IndexError.
fn varint(data: &[u8], pos: u128) -> Option<(u128, u128)> {
    let mut value: u128 = 0;
    for i in 0..10u32 {
        let at = usize::try_from(pos + u128::from(i)).ok()?;
        let b = *data.get(at)?;
        value |= u128::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((value, pos + u128::from(i) + 1));
        }
    }
    None
}

/// `limits._skip_group`: past the end-group tag closing group `number`.
fn skip_group(data: &[u8], mut pos: u128, number: u128) -> Option<u128> {
    let mut open = vec![number];
    while let Some(&innermost) = open.last() {
        let (tag, next) = varint(data, pos)?;
        pos = next;
        match tag & 7 {
            0 => pos = varint(data, pos)?.1,
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let (length, next) = varint(data, pos)?;
                pos = next + length;
            }
            3 => open.push(tag >> 3),
            4 if tag >> 3 == innermost => {
                open.pop();
            }
            _ => return None,
        }
    }
    Some(pos)
}

/// How many messages `count_messages(data, <trace request>, limit)` counts: the request
/// included, stopping at the first count above `limit`.
pub fn count_messages(data: &[u8], limit: i64) -> i64 {
    let mut count: i64 = 1;
    let mut stack: Vec<(u128, u128, Msg)> = vec![(0, data.len() as u128, Msg::Request)];
    while let Some((mut pos, end, msg)) = stack.pop() {
        while pos < end {
            let Some((tag, next)) = varint(data, pos) else {
                return count;
            };
            pos = next;
            match tag & 7 {
                0 => match varint(data, pos) {
                    Some((_, next)) => pos = next,
                    None => return count,
                },
                1 => pos += 8,
                5 => pos += 4,
                2 => {
                    let Some((length, next)) = varint(data, pos) else {
                        return count;
                    };
                    pos = next;
                    let child = u32::try_from(tag >> 3)
                        .ok()
                        .and_then(|number| schema::field(msg, number));
                    if let Some(Kind::Message(child)) = child {
                        count += 1;
                        if count > limit {
                            return count;
                        }
                        stack.push((pos, pos + length, child));
                    }
                    pos += length;
                }
                3 => match skip_group(data, pos, tag >> 3) {
                    Some(next) => pos = next,
                    None => return count,
                },
                _ => return count,
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_request_and_its_messages() {
        assert_eq!(count_messages(b"", 10), 1);
        // one ResourceSpans holding one ScopeSpans holding two spans
        let data = b"\x0a\x06\x12\x04\x12\x00\x12\x00";
        assert_eq!(count_messages(data, 10), 5);
        assert_eq!(count_messages(data, 2), 3);
    }

    #[test]
    fn skips_groups_and_stops_at_garbage() {
        // an unknown group holding what would be a ResourceSpans, then one
        assert_eq!(count_messages(b"\x13\x0a\x00\x14\x0a\x00", 10), 2);
        assert_eq!(count_messages(b"\x0a\x00\x0f\x0a\x00", 10), 2);
    }
}
