//! Small facts about this host, time and text that many test files need: the effective uid,
//! the boot id, the contract's time format, the first JSON object in some output.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::{describe_output, proc_stat, run_with_timeout, TestRoot};

/// The effective uid of the test process.
pub fn geteuid() -> u32 {
    crate::sys::geteuid()
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    geteuid() == 0
}

/// Panics unless the tests run as root: the tests that call it start sshd, log in as root or
/// make network namespaces, and a skipped test would pass without proving anything.
pub fn require_root() {
    assert!(
        is_root(),
        "these tests start sshd, log in as root or make network namespaces: run them as root \
         (bash .ci/test)"
    );
}

/// The session id of the test process.
pub fn my_sid() -> i32 {
    proc_stat(std::process::id() as i32)
        .expect("/proc/self/stat")
        .3
}

/// This boot's id (/proc/sys/kernel/random/boot_id), as records carry it.
pub fn boot_id() -> String {
    let id = fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("the boot id");
    id.trim().to_string()
}

/// Seconds since the epoch, now.
pub fn epoch_now() -> f64 {
    let now = SystemTime::now().duration_since(UNIX_EPOCH);
    now.expect("the clock is after 1970").as_secs_f64()
}

/// An RFC 3339 UTC time with milliseconds, `secs` seconds after the epoch.
pub fn rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.000Z")
}

/// Seconds since the epoch of a contract time (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
pub fn epoch_of(ts: &str) -> Option<f64> {
    if ts.len() != 24 || !ts.ends_with('Z') {
        return None;
    }
    let num = |a: usize, b: usize| -> Option<i64> { ts.get(a..b)?.parse().ok() };
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hh, mm, ss, ms) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 23)?);
    // Howard Hinnant's days_from_civil.
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) as f64 + ms as f64 / 1000.0)
}

/// Whether `s` has the contract's time format: `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn is_rfc3339_ms(s: &str) -> bool {
    const SHAPE: &[u8; 24] = b"dddd-dd-ddTdd:dd:dd.dddZ";
    s.len() == 24
        && s.bytes().zip(SHAPE).all(|(c, &want)| match want {
            b'd' => c.is_ascii_digit(),
            _ => c == want,
        })
}

/// The first JSON object in some text (a relaunch prints the record among other lines).
pub fn first_json_object(text: &str) -> Option<Value> {
    let start = text.find('{')?;
    let mut docs = serde_json::Deserializer::from_str(&text[start..]).into_iter::<Value>();
    docs.next()?.ok()
}

/// `cleanup.signals` of a record: the signal names in the order first sent.
pub fn cleanup_signals(st: &Value) -> Vec<String> {
    let names = strs(&st["cleanup"]["signals"]).unwrap_or_default();
    names.into_iter().map(String::from).collect()
}

/// The fields of a final record that say how the run ended: `{"state": …, "reason": …}`.
pub fn ended(state: &str, reason: &str) -> Value {
    serde_json::json!({"state": state, "reason": reason})
}

/// The strings of a JSON array, None when `v` is not an array.
pub fn strs(v: &Value) -> Option<Vec<&str>> {
    Some(v.as_array()?.iter().filter_map(Value::as_str).collect())
}

/// Bytes as text, invalid UTF-8 replaced.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A test path as `&str` (the tests make only UTF-8 paths).
pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("test paths are UTF-8")
}

/// How many lines a file has (0 when it cannot be read).
pub fn count_lines(path: &Path) -> usize {
    fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Creates the directory `path` with mode 0700 (its parent must exist); panics otherwise.
pub fn private_dir(path: &Path) {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
}

/// Creates the directory `path` and gives it `mode` (umask aside); panics otherwise.
pub fn dir_with_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    fs::create_dir(path).unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("cannot chmod {}: {e}", path.display()));
}

/// A named pipe in the test's temporary dir: a workload blocked on `read line < FIFO` goes on
/// when the test releases it ([`crate::ctx::Ctx::release`]), so no test waits on a clock.
pub fn make_fifo(root: &TestRoot, name: &str) -> PathBuf {
    let path = root.dir.path().join(name);
    let out = run_with_timeout(
        Command::new("mkfifo").arg("-m600").arg(&path),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{}", describe_output("mkfifo", &out));
    path
}

// ---------------------------------------------------------------------------------------------
// CPU sharing within one test binary

static CPU: RwLock<()> = RwLock::new(());

/// Held by a test that may run beside the others of its file (the test binary's own lock: each
/// test file is a binary of its own).
pub fn shared_cpu() -> RwLockReadGuard<'static, ()> {
    CPU.read().unwrap_or_else(PoisonError::into_inner)
}

/// Held by a test that measures lateness or loads the machine: it runs alone in its file.
pub fn exclusive_cpu() -> RwLockWriteGuard<'static, ()> {
    CPU.write().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_and_epoch_of_agree_on_a_table_of_times() {
        // (seconds since the epoch, the contract's text)
        let table: [(i64, &str); 5] = [
            (0, "1970-01-01T00:00:00.000Z"),
            (951_782_400, "2000-02-29T00:00:00.000Z"),
            (1_709_164_799, "2024-02-28T23:59:59.000Z"),
            (4_102_444_800, "2100-01-01T00:00:00.000Z"),
            (-86_400, "1969-12-31T00:00:00.000Z"),
        ];
        for (secs, text) in table {
            assert_eq!(rfc3339(secs), text, "rfc3339({secs})");
            assert!(is_rfc3339_ms(text), "{text} has the contract's shape");
            assert_eq!(epoch_of(text), Some(secs as f64), "epoch_of({text})");
        }
        for bad in [
            "",
            "2024-02-28T23:59:59Z",
            "2024-02-28 23:59:59.000Z",
            "x".repeat(24).as_str(),
        ] {
            assert!(!is_rfc3339_ms(bad), "{bad:?} is not a contract time");
        }
        assert_eq!(epoch_of("1970-01-01T00:00:01.250Z"), Some(1.25));
    }

    #[test]
    fn first_json_object_skips_leading_text_and_stops_at_the_object() {
        let table = [
            ("{\"a\":1}", Some(serde_json::json!({"a": 1}))),
            (
                "note: relaunch\n{\"a\":1}\ntrailing",
                Some(serde_json::json!({"a": 1})),
            ),
            ("no object here", None),
            ("{broken", None),
        ];
        for (input, want) in table {
            assert_eq!(first_json_object(input), want, "{input:?}");
        }
    }
}
