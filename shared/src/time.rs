//! Wall-clock formatting (RFC 3339 UTC with milliseconds) and the duration syntax of the command
//! line (`90`, `90s`, `500ms`, `5m`, `2h`, `1.5s`). No calendar library: the civil-date conversion
//! is Howard Hinnant's `civil_from_days`, exact for the proleptic Gregorian calendar.

use crate::error::{Error, Result};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the epoch, as a float (for lease deadlines).
pub fn epoch_now() -> f64 {
    epoch_of(SystemTime::now())
}

/// Seconds since the epoch of a system time.
pub fn epoch_of(t: SystemTime) -> f64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// Now as RFC 3339 UTC with milliseconds: `2026-11-30T01:13:19.123Z`.
pub fn rfc3339_now() -> String {
    rfc3339(SystemTime::now())
}

/// A system time as RFC 3339 UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, sod) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60,
        d.subsec_millis()
    )
}

/// Parse an RFC 3339 UTC time written by [`rfc3339`] back to epoch seconds.
pub fn parse_rfc3339(s: &str) -> Option<f64> {
    let b = s.as_bytes();
    if b.len() < 20 || !s.ends_with('Z') || b[4] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi) = (num(11..13)?, num(14..16)?);
    let sec: f64 = s.get(17..s.len() - 1)?.parse().ok()?;
    let days = days_from_civil(y, mo, d);
    Some((days * 86_400 + h * 3600 + mi * 60) as f64 + sec)
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Parse a duration: a non-negative number with an optional unit `ms`, `s`, `m`, `h` or `d`
/// (no unit means seconds). `what` names the option in the error.
pub fn parse_duration(what: &'static str, s: &str) -> Result<Duration> {
    let bad = |why: &str| Error::Invalid {
        what,
        value: s.to_string(),
        why: why.to_string(),
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad(
            "expected a number with an optional unit: 500ms, 90, 90s, 5m, 2h",
        ));
    }
    let n: f64 = num
        .parse()
        .map_err(|_| bad("expected a number with an optional unit: 500ms, 90, 90s, 5m, 2h"))?;
    let scale = match unit {
        "" | "s" | "sec" => 1.0,
        "ms" => 0.001,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => return Err(bad("unknown unit (use ms, s, m, h or d)")),
    };
    let secs = n * scale;
    if !secs.is_finite() || secs > 10.0 * 365.0 * 86_400.0 {
        return Err(bad("too large"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// A duration as [`parse_duration`] reads it back: `90s` for whole seconds, else `1500ms`.
pub fn duration_arg(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_796_001_199_123);
        assert_eq!(rfc3339(t), "2026-11-30T01:13:19.123Z");
        assert_eq!(
            parse_rfc3339("2026-11-30T01:13:19.123Z"),
            Some(1_796_001_199.123)
        );
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(&rfc3339(leap)[..10], "2000-02-29");
    }

    #[test]
    fn parses_the_duration_syntax() {
        let d = |s| parse_duration("--grace", s).unwrap();
        assert_eq!(d("90"), Duration::from_secs(90));
        assert_eq!(d("90s"), Duration::from_secs(90));
        assert_eq!(d("500ms"), Duration::from_millis(500));
        assert_eq!(d("5m"), Duration::from_secs(300));
        assert_eq!(d("2h"), Duration::from_secs(7200));
        assert_eq!(d("1.5s"), Duration::from_millis(1500));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "s", "-1", "5x", "1e3", "nan", "1..2"] {
            assert!(parse_duration("--grace", bad).is_err(), "{bad}");
        }
    }
}
