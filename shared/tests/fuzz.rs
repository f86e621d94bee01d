//! Property tests ("fuzzing") of every parser of outside input: run ids, durations, status.json,
//! lease.json and cancel.json. Properties: no input panics; accepted values round-trip; refused
//! values come with an error that names the input. `PROPTEST_CASES=100000 cargo test -p
//! agent-run-shared --test fuzz` is the long run; CI runs the default 256 cases per property.

use agent_run_shared::id::RunId;
use agent_run_shared::lease::Lease;
use agent_run_shared::record::{parse_status, Status};
use agent_run_shared::run_dir::RunDir;
use agent_run_shared::time::parse_duration;
use proptest::prelude::*;
use std::os::unix::fs::PermissionsExt;

/// A fresh private dir, and the run dir held on it.
fn run_dir() -> (tempfile::TempDir, RunDir) {
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let rd = RunDir::open(d.path(), RunId::parse("fuzz-1").unwrap()).unwrap();
    (d, rd)
}

fn sample_status() -> Status {
    let mut st = Status::blank("fuzz-1");
    st.argv = vec!["sh".into(), "-c".into(), "true".into()];
    st
}

proptest! {
    #[test]
    fn run_id_parsing_never_panics_and_accepts_exactly_the_contract_alphabet(s in "\\PC{0,140}") {
        let ok = !s.is_empty()
            && s.len() <= 128
            && !s.starts_with('.')
            && !s.starts_with('-')
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        match RunId::parse(&s) {
            Ok(id) => { prop_assert!(ok); prop_assert_eq!(id.as_str(), s.as_str()); }
            Err(e) => { prop_assert!(!ok); prop_assert!(e.to_string().contains("invalid run id")); }
        }
    }

    #[test]
    fn run_ids_from_the_alphabet_are_accepted(s in "[A-Za-z0-9_][A-Za-z0-9._-]{0,127}") {
        prop_assert!(RunId::parse(&s).is_ok());
    }

    #[test]
    fn duration_parsing_never_panics(s in "\\PC{0,24}") {
        if let Err(e) = parse_duration("--grace", &s) {
            prop_assert!(e.to_string().contains("--grace"));
        }
    }

    #[test]
    fn durations_round_trip(ms in 0u64..80_000, unit in prop::sample::select(vec!["ms", "s", "m", "h"])) {
        let text = format!("{ms}{unit}");
        let scale = match unit { "ms" => 1, "s" => 1000, "m" => 60_000, _ => 3_600_000 };
        let d = parse_duration("--lease", &text).unwrap();
        prop_assert_eq!(d.as_millis() as u64, ms * scale);
    }

    #[test]
    fn status_parsing_never_panics_on_arbitrary_text(s in "\\PC{0,400}") {
        let _ = parse_status(&s);
    }

    #[test]
    fn status_parsing_never_panics_on_truncated_or_mutated_records(cut in 0usize..2000, flip in 0usize..2000, byte in any::<u8>()) {
        let text = sample_status().to_json();
        let mut b = text.into_bytes();
        let n = b.len();
        b[flip % n] = byte;
        b.truncate(cut % (n + 1));
        let s = String::from_utf8_lossy(&b);
        if let Ok(st) = parse_status(&s) {
            prop_assert_eq!(st.schema, 1);
        }
    }

    #[test]
    fn lease_files_never_panic_and_only_sane_leases_pass(s in "\\PC{0,120}") {
        let (d, rd) = run_dir();
        std::fs::write(d.path().join("lease.json"), &s).unwrap();
        if let Ok(Some(l)) = rd.read_lease() {
            prop_assert!(l.deadline_epoch.is_finite() && l.lease_s >= 0.0);
        }
    }

    #[test]
    fn leases_round_trip(secs in 0.0f64..1e7) {
        let (_d, rd) = run_dir();
        let l = Lease { deadline_epoch: 1.0e9 + secs, lease_s: secs, issued_ns: 1, auth: None };
        rd.write_lease(&l).unwrap();
        // serde_json's default float parser may be off by an ulp: a microsecond is plenty.
        let back = rd.read_lease().unwrap().unwrap();
        prop_assert!((back.deadline_epoch - l.deadline_epoch).abs() < 1e-6);
        prop_assert!((back.lease_s - l.lease_s).abs() < 1e-6);
    }

    #[test]
    fn cancel_files_never_panic(s in "\\PC{0,200}") {
        let (d, rd) = run_dir();
        std::fs::write(d.path().join("cancel.json"), &s).unwrap();
        let _ = rd.cancel_reason();
    }
}

#[test]
fn a_whole_record_round_trips() {
    let st = sample_status();
    assert_eq!(parse_status(&st.to_json()).unwrap(), st);
}
