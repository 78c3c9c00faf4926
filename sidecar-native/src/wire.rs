//! Protobuf wire-format primitives, with upb's limits.
//!
//! Every read is bounded by the slice it is given: callers pass the bytes up to the end
//! of the message being read, so a field running past its message's end fails the same
//! way upb's does (a tag, varint or fixed value straddling a length-delimited message's
//! end is corrupt, not read from the next field).

/// A varint of at most 10 bytes starting at `pos`: its value (bits past 64 dropped, as
/// upb drops them) and the offset after it. None when it runs past `buf` or has no end
/// within 10 bytes.
#[inline(always)]
pub fn varint(buf: &[u8], pos: usize) -> Option<(u64, usize)> {
    let b0 = *buf.get(pos)?;
    if b0 < 0x80 {
        return Some((u64::from(b0), pos + 1));
    }
    // Two bytes (values below 16384: status codes, ports, small counts) without a call.
    if let Some(&b1) = buf.get(pos + 1)
        && b1 < 0x80
    {
        return Some((u64::from(b0 & 0x7f) | u64::from(b1) << 7, pos + 2));
    }
    varint_long(buf, pos, b0, 10)
}

#[inline(never)]
fn varint_long(buf: &[u8], pos: usize, b0: u8, max_len: usize) -> Option<(u64, usize)> {
    let mut value = u64::from(b0 & 0x7f);
    for i in 1..max_len {
        let b = *buf.get(pos + i)?;
        // i == 9: only the lowest bit of the 10th byte fits; upb drops the rest, as here.
        value |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some((value, pos + i + 1));
        }
    }
    None
}

/// A field tag as upb reads it: a varint of at most 5 bytes whose value fits 32 bits.
/// Returns (tag, offset after it).
#[inline(always)]
pub fn tag(buf: &[u8], pos: usize) -> Option<(u32, usize)> {
    let b0 = *buf.get(pos)?;
    if b0 < 0x80 {
        return Some((u32::from(b0), pos + 1));
    }
    tag_long(buf, pos, b0)
}

#[inline(never)]
fn tag_long(buf: &[u8], pos: usize, b0: u8) -> Option<(u32, usize)> {
    // upb decodes up to 10 bytes, then refuses more than 5 or a value above u32::MAX.
    let (value, next) = varint_long(buf, pos, b0, 10)?;
    if next - pos > 5 {
        return None;
    }
    u32::try_from(value).ok().map(|v| (v, next))
}

/// The length of a length-delimited field and the offset of its first byte, checked as
/// upb checks it: a varint of at most 5 bytes, below `i32::MAX`, within `buf`. Returns
/// (body start, body end).
#[inline(always)]
pub fn delimited(buf: &[u8], pos: usize) -> Option<(usize, usize)> {
    let b0 = *buf.get(pos)?;
    let (len, start) = if b0 < 0x80 {
        (u64::from(b0), pos + 1)
    } else {
        varint_long(buf, pos, b0, 5)?
    };
    if len >= i32::MAX as u64 {
        return None;
    }
    // No overflow: start <= buf.len() <= isize::MAX and len < 2^31.
    let end = start + len as usize;
    if end > buf.len() {
        return None;
    }
    Some((start, end))
}

/// Whether `bytes` is valid UTF-8 (RFC 3629: no overlongs, surrogates or values past
/// U+10FFFF), which is what upb's check of proto3 `string` fields accepts.
#[inline(always)]
pub fn utf8(bytes: &[u8]) -> bool {
    ascii(bytes) || std::str::from_utf8(bytes).is_ok()
}

/// Whether every byte is below 0x80. Almost every string on this wire is short ASCII:
/// a few overlapping word reads and one test, no per-byte loop.
#[inline(always)]
fn ascii(bytes: &[u8]) -> bool {
    let n = bytes.len();
    let p = bytes.as_ptr();
    // SAFETY: every read below lies within `bytes`: offsets `i..i + width` with
    // `i + width <= n`, unaligned reads of plain integers.
    unsafe {
        if n >= 16 {
            return ascii16(p, n);
        }
        if n >= 8 {
            let word =
                p.cast::<u64>().read_unaligned() | p.add(n - 8).cast::<u64>().read_unaligned();
            return word & 0x8080_8080_8080_8080 == 0;
        }
        if n >= 4 {
            let word =
                p.cast::<u32>().read_unaligned() | p.add(n - 4).cast::<u32>().read_unaligned();
            return word & 0x8080_8080 == 0;
        }
    }
    bytes.iter().all(|&b| b < 0x80)
}

/// `ascii` for `n >= 16` bytes at `p`: 16 bytes at a time, the last read overlapping.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn ascii16(p: *const u8, n: usize) -> bool {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128};
    // SAFETY: the caller guarantees `n >= 16` readable bytes at `p`; SSE2 is part of
    // every x86_64 target.
    unsafe {
        let load = |at: usize| _mm_loadu_si128(p.add(at).cast::<__m128i>());
        let mut acc = _mm_or_si128(load(0), load(n - 16));
        if n > 32 {
            // Most strings here are at most 32 bytes: no loop set-up for those.
            let mut i = 16;
            while i + 16 < n {
                acc = _mm_or_si128(acc, load(i));
                i += 16;
            }
        }
        _mm_movemask_epi8(acc) == 0
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
unsafe fn ascii16(p: *const u8, n: usize) -> bool {
    // SAFETY: the caller guarantees `n >= 16` readable bytes at `p`.
    unsafe {
        let mut acc = p.add(n - 8).cast::<u64>().read_unaligned();
        let mut i = 0;
        while i + 8 < n {
            acc |= p.add(i).cast::<u64>().read_unaligned();
            i += 8;
        }
        acc & 0x8080_8080_8080_8080 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints() {
        assert_eq!(varint(&[0x05], 0), Some((5, 1)));
        assert_eq!(varint(&[0x96, 0x01], 0), Some((150, 2)));
        assert_eq!(varint(&[0x96], 0), None);
        let ten = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
        assert_eq!(varint(&ten, 0), Some((u64::MAX, 10)));
        let eleven = [
            0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(varint(&eleven, 0), None);
    }

    #[test]
    fn tags() {
        assert_eq!(
            tag(&[0x90, 0x80, 0x80, 0x80, 0x0f], 0),
            Some((0xf000_0010, 5))
        );
        assert_eq!(tag(&[0x90, 0x80, 0x80, 0x80, 0x1f], 0), None); // above u32
        assert_eq!(tag(&[0x90, 0x80, 0x80, 0x80, 0x80, 0x00], 0), None); // 6 bytes
    }

    #[test]
    fn lengths() {
        assert_eq!(delimited(&[0x02, b'a', b'b'], 0), Some((1, 3)));
        assert_eq!(delimited(&[0x03, b'a', b'b'], 0), None);
        assert_eq!(delimited(&[0xff, 0xff, 0xff, 0xff, 0x07], 0), None); // i32::MAX
        assert_eq!(delimited(&[0x80, 0x80, 0x80, 0x80, 0x00], 0), Some((5, 5)));
        assert_eq!(delimited(&[0x80, 0x80, 0x80, 0x80, 0x80, 0x00], 0), None); // 6 bytes
    }

    #[test]
    fn utf8_checks() {
        assert!(utf8(b"gym_telemetry.rollout"));
        assert!(utf8(b""));
        for n in 0..40 {
            let mut ascii = vec![b'a'; n];
            assert!(utf8(&ascii));
            for i in 0..n {
                ascii[i] = 0xff;
                assert!(!utf8(&ascii), "{n} {i}");
                ascii[i] = b'a';
            }
        }
        assert!(utf8("naïve ✓ 𝄞".as_bytes()));
        assert!(!utf8(b"\xff"));
        assert!(!utf8(b"abcdefgh\xc0\x80")); // overlong NUL
        assert!(!utf8(b"\xed\xa0\x80")); // a surrogate
        assert!(!utf8(b"\xf4\x90\x80\x80")); // past U+10FFFF
    }
}
