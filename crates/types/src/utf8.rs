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

/// `bytes` without a trailing incomplete character (what is kept of output cut at a limit, so that a cut in the
/// middle of a character does not make text binary).
pub fn whole_characters(bytes: &[u8]) -> &[u8] {
    &bytes[..bytes.len() - incomplete_tail_len(bytes)]
}

/// Whether `bytes` go into JSON as text: UTF-8, no NUL, and spelt in JSON in at most twice its size (plus 64):
/// control characters other than tab, newline, carriage return, backspace and form feed take six bytes each
/// (`\u001b`), so terminal colours are text and a stream of control bytes is not. Anything else is binary, carried in
/// base64 (4/3 of its size). (Output cut at a limit is cut on a character boundary first: `whole_characters`.)
pub fn is_text(bytes: &[u8]) -> bool {
    if std::str::from_utf8(bytes).is_err() || bytes.contains(&0) {
        return false;
    }
    let json_len: usize = bytes
        .iter()
        .map(|&b| match b {
            b'"' | b'\\' | b'\t' | b'\n' | b'\r' | 0x08 | 0x0c => 2,
            0..0x20 => 6,
            _ => 1,
        })
        .sum();
    json_len <= bytes.len().saturating_mul(2).saturating_add(64)
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
        assert!(!is_text(&"a€".as_bytes()[..3]), "a character cut at the end");
        assert!(is_text(whole_characters(&"a€".as_bytes()[..3])), "unless it is cut on a character boundary first");
        assert!(is_text("\x1b[1;31m✗\x1b[0m ".repeat(100).as_bytes()), "colours all along");
    }
}
