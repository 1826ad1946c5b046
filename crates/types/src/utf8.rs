//! Cutting byte streams on whole UTF-8 characters: output arrives in chunks that may split a character, and
//! whoever turns chunks into text holds back the split tail until the rest arrives.

/// Length of a trailing UTF-8 lead byte plus continuation bytes that do not yet form a whole character (0 when
/// `bytes` ends on a character boundary, or in bytes that are not UTF-8 at all).
pub fn incomplete_tail_len(bytes: &[u8]) -> usize {
    for back in 1..=bytes.len().min(3) {
        let byte = bytes[bytes.len() - back];
        if byte & 0b1100_0000 == 0b1000_0000 {
            continue;
        }
        let needed = match byte {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if needed > back { back } else { 0 };
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_characters_are_held_back_and_whole_ones_are_not() {
        let text = "aä€😀".as_bytes();
        assert_eq!(incomplete_tail_len(text), 0);
        for (cut, held) in [(2, 1), (5, 2), (9, 3), (8, 2), (7, 1)] {
            assert_eq!(incomplete_tail_len(&text[..cut]), held, "cut at {cut}");
        }
        assert_eq!(incomplete_tail_len(b""), 0);
        assert_eq!(incomplete_tail_len(&[0xff, 0xfe]), 0, "not UTF-8: nothing to wait for");
    }
}
