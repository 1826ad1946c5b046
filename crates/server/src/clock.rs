//! Wall-clock time as the store and the API use it: milliseconds since the Unix epoch, and RFC 3339 text (written,
//! and read back from clients: list filters and cursors).

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// Formats milliseconds since the Unix epoch as RFC 3339 UTC with milliseconds (`2024-05-01T12:00:00.250Z`).
pub fn rfc3339(ms: i64) -> String {
    let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// Reads an RFC 3339 date-time (`2024-05-01T12:00:00Z`, `2024-05-01T14:00:00.123456+02:00`: a fraction of up to nine
/// digits, `Z` or a `±HH:MM` offset) as microseconds since the Unix epoch (digits past the microsecond are dropped);
/// `None` for anything else.
pub fn parse_rfc3339_us(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let digits = |from: usize, len: usize| -> Option<i64> {
        let part = bytes.get(from..from + len)?;
        part.iter().all(u8::is_ascii_digit).then(|| part.iter().fold(0, |n, d| n * 10 + i64::from(d - b'0')))
    };
    let at = |index: usize, expected: &[u8]| bytes.get(index).is_some_and(|byte| expected.contains(byte));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt ") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (digits(0, 4)?, digits(5, 2)?, digits(8, 2)?);
    let (hour, minute, second) = (digits(11, 2)?, digits(14, 2)?, digits(17, 2)?);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let valid_day = usize::try_from(month - 1).ok().and_then(|m| month_days.get(m)).is_some_and(|&last| day <= last);
    if !(1..=12).contains(&month) || day < 1 || !valid_day || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut index = 19;
    let mut micros = 0;
    if at(index, b".") {
        let start = index + 1;
        let len = bytes[start..].iter().take_while(|byte| byte.is_ascii_digit()).count();
        if len == 0 || len > 9 {
            return None;
        }
        let kept = len.min(6);
        micros = digits(start, kept)? * 10_i64.pow(u32::try_from(6 - kept).ok()?);
        index = start + len;
    }
    let offset_s = match bytes.get(index..)? {
        b"Z" | b"z" => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let (hours, minutes) = (digits(index + 1, 2)?, digits(index + 4, 2)?);
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = hours * 3600 + minutes * 60;
            if *sign == b'-' { -offset } else { offset }
        }
        _ => return None,
    };
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Some(seconds * 1_000_000 + micros)
}

/// (year, month, day) in the proleptic Gregorian calendar to days since 1970-01-01 (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_250), "2000-02-29T00:00:00.250Z");
        assert_eq!(rfc3339(1_714_564_800_000), "2024-05-01T12:00:00.000Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn reads_back_what_it_writes_and_what_clients_send() {
        for ms in [0, 951_782_400_250, 1_714_564_800_000, -1, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339_us(&rfc3339(ms)), Some(ms * 1000), "{}", rfc3339(ms));
        }
        // Python's `datetime.astimezone().isoformat()`: microseconds and an offset.
        assert_eq!(parse_rfc3339_us("2024-05-01T14:00:00.000250+02:00"), Some(1_714_564_800_000_250));
        assert_eq!(parse_rfc3339_us("2024-05-01T11:30:00-00:30"), Some(1_714_564_800_000_000));
        assert_eq!(parse_rfc3339_us("2024-05-01T12:00:00.123456789Z"), Some(1_714_564_800_123_456));
        for bad in [
            "",
            "2024-05-01",
            "2024-05-01T12:00:00",
            "2024-13-01T12:00:00Z",
            "2023-02-29T12:00:00Z",
            "2024-05-01T24:00:00Z",
            "2024-05-01T12:00:00.Z",
            "2024-05-01T12:00:00.1234567890Z",
            "2024-05-01T12:00:00+0200",
            "2024-05-01T12:00:00Zjunk",
            "２024-05-01T12:00:00Z",
        ] {
            assert_eq!(parse_rfc3339_us(bad), None, "{bad:?}");
        }
    }
}
