//! The JSON spellings of the well-known types: times, durations and bytes.

use std::fmt::Write;

/// `metav1.Time` (`fraction_digits` 0) and `metav1.MicroTime` (6) as RFC 3339 in UTC, as
/// their Go `MarshalJSON` writes them.
///
/// Written into a buffer on the stack: every Pod holds a few times, and a `get` from a
/// compact store decodes them all, so neither an allocation nor `fmt`'s machinery is spent
/// on text the visitor parses straight back.
pub(crate) fn rfc3339(seconds: i64, nanos: i32, fraction_digits: u32) -> Rfc3339 {
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let mut out = Rfc3339 {
        bytes: [0; RFC3339_CAPACITY],
        len: 0,
    };
    if year < 0 {
        out.push(b'-');
    }
    out.digits(year.unsigned_abs(), 4);
    out.push(b'-');
    out.digits(u64::from(month), 2);
    out.push(b'-');
    out.digits(u64::from(day), 2);
    out.push(b'T');
    let of_day = of_day.unsigned_abs();
    out.digits(of_day / 3600, 2);
    out.push(b':');
    out.digits(of_day / 60 % 60, 2);
    out.push(b':');
    out.digits(of_day % 60, 2);
    let fraction_digits = fraction_digits.min(9);
    if fraction_digits > 0 {
        let scaled = u32::try_from(nanos.clamp(0, 999_999_999)).unwrap_or(0)
            / 10u32.pow(9 - fraction_digits);
        out.push(b'.');
        out.digits(u64::from(scaled), fraction_digits as usize);
    }
    out.push(b'Z');
    out
}

/// The longest time [`rfc3339`] writes: a sign, a year of up to 20 digits (any `u64`; an
/// `i64` of seconds reaches 12), `-MM-DDTHH:MM:SS`, nine fraction digits with their point,
/// and `Z`.
const RFC3339_CAPACITY: usize = 1 + 20 + 15 + 10 + 1;

/// A time as [`rfc3339`] writes it.
pub(crate) struct Rfc3339 {
    bytes: [u8; RFC3339_CAPACITY],
    len: usize,
}

impl Rfc3339 {
    pub(crate) fn as_str(&self) -> &str {
        // Only ASCII digits and punctuation are ever written.
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default()
    }

    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.bytes.get_mut(self.len) {
            *slot = byte;
            self.len += 1;
        }
    }

    /// `value` in decimal, zero-padded to at least `width` digits.
    fn digits(&mut self, mut value: u64, width: usize) {
        let mut reversed = [0u8; 20];
        let mut n = 0;
        while n < reversed.len() && (n < width || value > 0) {
            reversed[n] = b'0' + (value % 10) as u8;
            value /= 10;
            n += 1;
        }
        for &digit in reversed[..n].iter().rev() {
            self.push(digit);
        }
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A `time.Duration` in nanoseconds as Go's `Duration.String` writes it (`1h0m0s`, `1.5s`,
/// `300ms`), which is how `metav1.Duration` appears in JSON.
pub(crate) fn go_duration(nanos: i64) -> String {
    if nanos == 0 {
        return "0s".to_owned();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let mut u = nanos.unsigned_abs();
    if u < 1_000_000_000 {
        let (unit, digits) = match u {
            0..1_000 => return format!("{sign}{u}ns"),
            1_000..1_000_000 => ("µs", 3),
            _ => ("ms", 6),
        };
        return format!("{sign}{}{unit}", fraction(u, digits));
    }
    let seconds = fraction(u, 9);
    u /= 1_000_000_000;
    let mut out = String::new();
    let hours = u / 3600;
    let minutes = u / 60 % 60;
    out.push_str(sign);
    if hours > 0 {
        let _ = write!(out, "{hours}h{minutes}m");
    } else if minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{}s", seconds_of_minute(&seconds, u % 60));
    out
}

/// `value / 10^digits` with its fraction, trailing zeros trimmed (`1500, 3` is `1.5`).
fn fraction(value: u64, digits: u32) -> String {
    let scale = 10u64.pow(digits);
    let (whole, frac) = (value / scale, value % scale);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:0width$}", width = digits as usize);
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// The seconds part of a duration of a minute or more: the whole seconds of the minute with
/// the fraction `fraction` computed.
fn seconds_of_minute(fraction: &str, whole: u64) -> String {
    match fraction.split_once('.') {
        Some((_, frac)) => format!("{whole}.{frac}"),
        None => whole.to_string(),
    }
}

/// Bytes as JSON carries them: standard base64 with padding.
pub(crate) fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_as_go_writes_them() {
        let time = |seconds, nanos, digits| rfc3339(seconds, nanos, digits).as_str().to_owned();
        assert_eq!(time(0, 0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(time(1_780_000_000, 0, 0), "2026-05-28T20:26:40Z");
        assert_eq!(time(951_782_400, 0, 0), "2000-02-29T00:00:00Z");
        assert_eq!(time(-1, 0, 0), "1969-12-31T23:59:59Z");
        assert_eq!(time(253_402_300_799, 0, 0), "9999-12-31T23:59:59Z");
        assert_eq!(time(-62_167_219_200, 0, 0), "0000-01-01T00:00:00Z");
        assert_eq!(time(-62_198_755_200, 0, 0), "-0001-01-01T00:00:00Z");
        assert_eq!(time(253_402_300_800, 0, 0), "10000-01-01T00:00:00Z");
        assert_eq!(
            time(1_780_000_000, 123_456_789, 6),
            "2026-05-28T20:26:40.123456Z"
        );
        assert_eq!(time(1_780_000_000, 0, 6), "2026-05-28T20:26:40.000000Z");
        assert_eq!(time(1_780_000_000, 5, 9), "2026-05-28T20:26:40.000000005Z");
        // Any i64 of seconds fits, and still ends as a time does.
        assert!(time(i64::MAX, 999_999_999, 9).ends_with(":07.999999999Z"));
        assert!(time(i64::MIN, 0, 0).starts_with('-'));
    }

    #[test]
    fn durations_as_go_writes_them() {
        let s = 1_000_000_000;
        assert_eq!(go_duration(0), "0s");
        assert_eq!(go_duration(1), "1ns");
        assert_eq!(go_duration(1_500), "1.5µs");
        assert_eq!(go_duration(300_000_000), "300ms");
        assert_eq!(go_duration(s + s / 2), "1.5s");
        assert_eq!(go_duration(90 * s), "1m30s");
        assert_eq!(go_duration(3600 * s), "1h0m0s");
        assert_eq!(go_duration(3600 * s + 61 * s + s / 4), "1h1m1.25s");
        assert_eq!(go_duration(-90 * s), "-1m30s");
    }

    #[test]
    fn bytes_in_base64() {
        assert_eq!(base64(b"hello"), "aGVsbG8=");
        assert_eq!(base64(b""), "");
    }
}
