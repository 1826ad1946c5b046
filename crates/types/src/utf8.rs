//! Cutting byte streams on whole UTF-8 characters: output arrives in chunks that may split a character, and
//! whoever turns chunks into text holds back the split tail until the rest arrives. And telling text from binary:
//! output that JSON would blow up (NUL and other control characters become six-byte `\u00XX` escapes) travels in
//! base64 instead.

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

/// Whether `bytes` go into JSON as text: valid UTF-8, no NUL, and (beyond the first eight) at most one in eight bytes
/// a control character that JSON spells `\u00XX` (tab, newline, carriage return, backspace and form feed have short
/// escapes; the escape character of terminal colours is allowed at that rate). Anything else is binary: carried in
/// base64, which is never more than 4/3 of its size.
pub fn is_text(bytes: &[u8]) -> bool {
    if std::str::from_utf8(bytes).is_err() || bytes.contains(&0) {
        return false;
    }
    let long_escapes = bytes.iter().filter(|&&b| b < 0x20 && !matches!(b, b'\t' | b'\n' | b'\r' | 0x08 | 0x0c)).count();
    long_escapes.saturating_mul(8) <= bytes.len().saturating_add(64)
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

    #[test]
    fn text_is_utf8_without_nul_and_with_few_long_escapes() {
        assert!(is_text("grüß\tline\r\n".as_bytes()));
        assert!(is_text(b"\x1b[31mred\x1b[0m"));
        assert!(is_text(b""));
        assert!(!is_text(&[b'a', 0xff]), "not UTF-8");
        assert!(!is_text(b"text\0more text"), "a NUL");
        assert!(!is_text(&[0x01; 64]), "all control characters");
    }
}
