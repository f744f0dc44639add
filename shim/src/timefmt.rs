//! RFC 3339 timestamps with nanoseconds in UTC, without a date-time dependency.

use std::time::{SystemTime, UNIX_EPOCH};

/// Formats `t` as `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ` (always nine fraction digits).
pub fn rfc3339_nano(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// The current time, formatted by [`rfc3339_nano`].
pub fn now() -> String {
    rfc3339_nano(SystemTime::now())
}

/// Converts days since 1970-01-01 to a (year, month, day) civil date
/// (the proleptic Gregorian calendar, era-based arithmetic).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339_nano(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = UNIX_EPOCH + Duration::new(951_782_400, 1); // 2000-02-29
        assert_eq!(rfc3339_nano(t), "2000-02-29T00:00:00.000000001Z");
        let t = UNIX_EPOCH + Duration::new(1_795_954_800, 123_456_789);
        assert_eq!(rfc3339_nano(t), "2026-11-29T12:20:00.123456789Z");
        let t = UNIX_EPOCH + Duration::new(4_102_444_799, 999_999_999);
        assert_eq!(rfc3339_nano(t), "2099-12-31T23:59:59.999999999Z");
    }
}
