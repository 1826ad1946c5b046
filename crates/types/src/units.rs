//! Human-friendly units for limits: byte sizes (`256MiB`, `1G`, `4096`) and durations (`10s`, `500ms`, `2m`).

use thiserror::Error;

/// A size or duration string that could not be understood.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum UnitError {
    /// The text is not a number followed by a known unit.
    #[error("'{text}' is not a {what}: use {hint}")]
    Malformed {
        /// The text as given.
        text: String,
        /// "size" or "duration".
        what: &'static str,
        /// Examples of accepted spellings.
        hint: &'static str,
    },
    /// The number does not fit in 64 bits once the unit is applied.
    #[error("'{0}' is too large")]
    Overflow(String),
}

const SIZE_HINT: &str = "a number with an optional unit, e.g. 256MiB, 1GiB, 512K, 4096";
const DURATION_HINT: &str = "a number with a unit, e.g. 10s, 500ms, 2m, 1h";

fn split_number(text: &str) -> Option<(f64, &str)> {
    let trimmed = text.trim();
    let end = trimmed.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(end);
    let value: f64 = number.parse().ok()?;
    if !value.is_finite() || value < 0.0 {
        return None;
    }
    Some((value, unit.trim()))
}

/// Parses a byte size. `K`, `KB` and `KiB` all mean 1024 (and so on up to `T`): memory sizes are binary in practice,
/// and a silent 2.4 % difference between two spellings helps nobody.
pub fn parse_bytes(text: &str) -> Result<u64, UnitError> {
    let malformed = || UnitError::Malformed { text: text.to_owned(), what: "size", hint: SIZE_HINT };
    let (value, unit) = split_number(text).ok_or_else(malformed)?;
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(malformed()),
    };
    let bytes = value * multiplier as f64;
    if bytes > u64::MAX as f64 {
        return Err(UnitError::Overflow(text.to_owned()));
    }
    Ok(bytes.round() as u64)
}

/// Parses a duration into milliseconds. A bare number is refused: `10` could mean seconds or milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, UnitError> {
    let malformed = || UnitError::Malformed { text: text.to_owned(), what: "duration", hint: DURATION_HINT };
    let (value, unit) = split_number(text).ok_or_else(malformed)?;
    let multiplier: f64 = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return Err(malformed()),
    };
    let millis = value * multiplier;
    if millis > u64::MAX as f64 {
        return Err(UnitError::Overflow(text.to_owned()));
    }
    Ok(millis.round() as u64)
}

/// Formats a byte count the way `parse_bytes` reads it back (`256MiB`).
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{}{name}", bytes / size);
        }
    }
    format!("{bytes}B")
}

/// Formats milliseconds the way `parse_duration_ms` reads them back (`10s`, `1500ms`).
pub fn format_duration_ms(millis: u64) -> String {
    if millis.is_multiple_of(1_000) { format!("{}s", millis / 1_000) } else { format!("{millis}ms") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_and_without_units() {
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes("1.5K"), Ok(1536));
        assert_eq!(parse_bytes(" 64 MB "), Ok(64 << 20));
    }

    #[test]
    fn malformed_sizes_say_what_to_write() {
        let err = parse_bytes("lots").map(|_| ()).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("'lots' is not a size"), "{err}");
        assert!(parse_bytes("-1MiB").is_err());
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
    }

    #[test]
    fn durations_need_a_unit() {
        assert_eq!(parse_duration_ms("10s"), Ok(10_000));
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
        assert_eq!(parse_duration_ms("0.5s"), Ok(500));
        assert!(parse_duration_ms("10").is_err());
        assert!(parse_duration_ms("soon").is_err());
    }

    #[test]
    fn formatting_round_trips() {
        for bytes in [1, 1024, 256 << 20, 3 << 30, 1500] {
            assert_eq!(parse_bytes(&format_bytes(bytes)), Ok(bytes));
        }
        for millis in [1, 1000, 1500, 60_000] {
            assert_eq!(parse_duration_ms(&format_duration_ms(millis)), Ok(millis));
        }
    }
}
