//! [systemd]: the watchdog's units and agent-run under a real systemd (Debian 12's 252), booted
//! by `agent_run_tests::systemd` as PID 1 of its own namespaces with the package of the binaries
//! under test installed. Each test boots its own (about a second).
//!
//! The three units, each started as docs/operations.md says: the user unit for a lingering
//! user (bob), the system template for a user (alice, who does not linger), and for root with
//! the documented drop-in. For each: it starts and says READY (Type=notify), pings its systemd
//! watchdog (a short `WatchdogSec=` drop-in: same MainPID across several pings) and is restarted
//! when SIGSTOPped; and under its own sandboxing it stops an orphaned run of its user held in a
//! cgroup (wrapper SIGKILLed, lease expired) and a stuck one (wrapper SIGSTOPped), KILL through
//! `cgroup.kill`, the run's cgroup removed, no error in the run's journal or the unit's. The
//! exposure `systemd-analyze security` gives each is the one the doc gives.
//!
//! Then agent-run under logind and user managers: a lingering user's run gets a delegated scope
//! of its own with no setup, and `cancel` leaves nothing; `KillUserProcesses=yes` and a login
//! session that ends; and a user who does not linger, whose run must outlive the session.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::Duration;

use agent_run_tests::cases;
use agent_run_tests::facts::strs;
use agent_run_tests::systemd::{Boot, Systemd};
use agent_run_tests::{poll_until, proc_stat, wait_until_dbg, Pinned, FINAL_STATES};
use serde_json::Value;

/// The doc every command below comes from, and is checked against.
const OPERATIONS: &str = "docs/operations.md";

/// The drop-in docs/operations.md gives for root's instance, as `systemctl edit` writes it.
const ROOT_DROP_IN: &str = "[Unit]
RequiresMountsFor=/root/.agent-runs

[Service]
Environment=AGENT_RUN_ROOT=/root/.agent-runs
ReadWritePaths=
ReadWritePaths=-/root/.agent-runs
CapabilityBoundingSet=CAP_SYS_PTRACE
";

/// A short systemd watchdog for the ping tests (and a quick restart after its timeout).
const SHORT_WATCHDOG: &str = "[Service]\nWatchdogSec=4s\nRestartSec=500ms\n";

/// `text` must be in docs/operations.md, word for word: the tests run the doc's commands.
fn documented(text: &str) {
    documented_in(OPERATIONS, text);
}

/// `text` must be in `doc` (a path from the workspace), word for word.
fn documented_in(doc: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(doc);
    let body = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(
        body.contains(text),
        "{doc} does not say, word for word:\n{text}"
    );
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    /// `agent-run-watchdog.service` under bob's user manager (bob lingers).
    User,
    /// `agent-run-watchdog@alice.service`, a system instance for alice (who does not linger).
    Template,
    /// `agent-run-watchdog@root.service` with the documented drop-in.
    Root,
}

impl Unit {
    fn user(self) -> &'static str {
        match self {
            Unit::User => "bob",
            Unit::Template => "alice",
            Unit::Root => "root",
        }
    }

    fn name(self) -> String {
        match self {
            Unit::User => "agent-run-watchdog.service".into(),
            _ => format!("agent-run-watchdog@{}.service", self.user()),
        }
    }

    /// The run root it watches (a path inside).
    fn runs(self) -> String {
        match self {
            Unit::Root => "/root/.agent-runs".into(),
            _ => format!("/home/{}/.agent-runs", self.user()),
        }
    }

    /// Enable and start it with the doc's commands, as the doc says to run them.
    fn start(self, sd: &Systemd) {
        match self {
            Unit::User => {
                // As bob, who asked root for lingering once: his manager runs from then on.
                let linger = r#"loginctl enable-linger "$USER""#;
                documented(&format!("sudo {linger}"));
                sd.ok(sd.root("env").args(["USER=bob", "sh", "-c", linger]));
                wait_active(sd, &format!("user@{}.service", sd.uid("bob")));
                // In a login session, as over SSH.
                let enable = "systemctl --user enable --now agent-run-watchdog.service";
                documented(enable);
                documented_in("README.md", &format!("`sudo {linger}`, then `{enable}`"));
                sd.ok(&mut sd.login("bob", enable));
            }
            Unit::Template => {
                let enable = "systemctl enable --now agent-run-watchdog@alice.service";
                documented(&format!("sudo {enable}"));
                documented_in("README.md", &format!("`sudo {enable}`"));
                sd.sh(enable);
            }
            Unit::Root => {
                documented(ROOT_DROP_IN);
                let edit = "systemctl edit agent-run-watchdog@root.service";
                documented(&format!("sudo {edit}"));
                fs::write(sd.path("/tmp/drop-in.conf"), ROOT_DROP_IN).expect("drop-in");
                // `systemctl edit` wants a terminal (script(1) gives it one) and runs the
                // editor on a temporary file: the editor here replaces that file with the
                // drop-in, as a person would type it.
                sd.sh(&format!(
                    "script -qec \"SYSTEMD_EDITOR='cp /tmp/drop-in.conf' {edit}\" /dev/null"
                ));
                let enable = "systemctl enable --now agent-run-watchdog@root.service";
                documented(&format!("sudo {enable}"));
                documented_in("README.md", &format!("`sudo {edit}`"));
                documented_in("README.md", &format!("`sudo {enable}`"));
                sd.sh(enable);
            }
        }
    }

    fn show(self, sd: &Systemd, props: &[&str]) -> BTreeMap<String, String> {
        match self {
            Unit::User => sd.show_user("bob", &self.name(), props),
            _ => sd.show(&self.name(), props),
        }
    }

    fn journal(self, sd: &Systemd) -> String {
        match self {
            // Its own lines, and its manager's about it.
            Unit::User => sd.journal(&[
                &format!("_SYSTEMD_USER_UNIT={}", self.name()),
                "+",
                &format!("USER_UNIT={}", self.name()),
            ]),
            _ => sd.journal(&["-u", &self.name()]),
        }
    }

    /// A drop-in of the tests' own (not a documented command), then a restart.
    fn drop_in_and_restart(self, sd: &Systemd, text: &str) {
        let dir = match self {
            Unit::User => "/home/bob/.config/systemd/user/agent-run-watchdog.service.d".into(),
            _ => format!("/etc/systemd/system/{}.d", self.name()),
        };
        let script = format!(
            "mkdir -p {dir} && printf '%s' '{text}' > {dir}/test.conf && systemctl {scope} daemon-reload && systemctl {scope} restart {unit}",
            scope = if self == Unit::User { "--user" } else { "" },
            unit = self.name()
        );
        match self {
            Unit::User => sd.sh_as("bob", &script),
            _ => sd.sh(&script),
        };
    }

    /// The host's pid of its main process, checked: the watchdog's binary, as its user.
    fn main_pid(self, sd: &Systemd) -> (i32, i32) {
        let main: i32 = self.show(sd, &["MainPID"])["MainPID"].parse().unwrap_or(0);
        assert!(
            main > 0,
            "{} has no main process\n{}",
            self.name(),
            sd.diagnostics()
        );
        let exe = sd.sh(&format!("readlink /proc/{main}/exe"));
        assert_eq!(exe.trim(), "/usr/bin/agent-run-watchdog", "{}", self.name());
        let host = sd.host_pid(main).expect("the main process on the host");
        let status = fs::read_to_string(format!("/proc/{host}/status")).unwrap_or_default();
        let uid = sd.uid(self.user()).to_string();
        assert!(
            status
                .lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid)),
            "{} runs as another user:\n{status}",
            self.name()
        );
        (main, host)
    }
}

/// Waits for a system unit to be active.
fn wait_active(sd: &Systemd, unit: &str) {
    wait_until_dbg(&format!("{unit} active"), Duration::from_secs(60), || {
        let s = sd.show(unit, &["ActiveState"]);
        (s["ActiveState"] == "active").then_some(()).ok_or(s)
    });
}

/// No refusal in `text` (a journal): what must never show in a unit's journal or a run's is
/// the sandbox refusing the watchdog.
fn no_refusal(what: &str, text: &str, sd: &Systemd) {
    for r in [
        "Read-only file system",
        "Operation not permitted",
        "Permission denied",
        "EROFS",
        "EPERM",
        "skipped",
    ] {
        assert!(
            !text.contains(r),
            "{what} says {r:?}:\n{text}\n{}",
            sd.diagnostics()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The harness itself

#[test]
fn a_boot_is_systemd_as_pid_1_of_its_own_namespaces_and_its_drop_leaves_nothing() {
    let sd = Systemd::boot();
    eprintln!("systemd-figure: boot to running in {:?}", sd.booted_in);
    let pid1 = sd.pid1();
    let comm = fs::read_to_string(format!("/proc/{pid1}/comm")).unwrap_or_default();
    assert_eq!(comm.trim(), "systemd", "PID 1 of the boot");
    for ns in ["pid", "mnt", "cgroup", "uts"] {
        let ours = fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        let its = fs::read_link(format!("/proc/{pid1}/ns/{ns}")).unwrap();
        assert_ne!(ours, its, "the boot shares our {ns} namespace");
    }
    assert_eq!(
        sd.sh("systemctl --version | head -1")
            .split_whitespace()
            .nth(1),
        Some("252")
    );
    assert!(sd
        .sh("dpkg-query -W -f='${Status}' agent-run")
        .contains("install ok installed"));
    // Commands run in the harness's cgroup of the boot, as the boot's kernel view says.
    assert_eq!(
        sd.sh("cat /proc/self/cgroup | grep ^0::").trim(),
        "0::/agent-run-harness"
    );
    let (cgroup, dir, pidfd) = (
        sd.cgroup().to_path_buf(),
        sd.dir().to_path_buf(),
        Pinned::new(&[pid1]),
    );
    assert!(dir.join("upper").is_dir(), "{}", dir.display());
    drop(sd);
    assert!(!dir.exists(), "{} outlived the drop", dir.display());
    assert!(
        pidfd.wait_all_gone(Duration::from_secs(10)).is_ok(),
        "PID 1 outlived the drop"
    );
    assert!(!cgroup.exists(), "{} outlived the drop", cgroup.display());
}

// ---------------------------------------------------------------------------------------------
// Each unit starts as the doc says, and says READY

fn starts_and_says_ready(unit: Unit) {
    let sd = Systemd::boot();
    unit.start(&sd);
    let props = ["Type", "ActiveState", "SubState", "NRestarts"];
    let s = unit.show(&sd, &props);
    let want = [
        ("Type", "notify"),
        ("ActiveState", "active"),
        ("SubState", "running"),
        ("NRestarts", "0"),
    ];
    for (k, v) in want {
        assert_eq!(
            s[k],
            v,
            "{k} of {}: {s:?}\n{}",
            unit.name(),
            sd.diagnostics()
        );
    }
    let (main, _) = unit.main_pid(&sd);
    // The run root: made by the unit, the user's, private.
    let meta = fs::metadata(sd.path(&unit.runs())).expect("the run root");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid()),
        (0o700, sd.uid(unit.user()))
    );
    let journal = unit.journal(&sd);
    assert!(
        journal.contains(&format!("watching {}", unit.runs())),
        "{journal}"
    );
    // Under journald the journal stamps each line: the watchdog adds no time of its own.
    assert!(
        journal.contains("]: agent-run-watchdog: watching"),
        "the watchdog stamps its own lines under journald:\n{journal}"
    );
    for bad in ["Unknown key", "ignoring", "Failed", "status="] {
        assert!(
            !journal.contains(bad),
            "{} journal says {bad:?}:\n{journal}",
            unit.name()
        );
    }
    // The doc's checks.
    let status = match unit {
        Unit::User => {
            let status = "systemctl --user status agent-run-watchdog.service";
            documented(status);
            sd.sh_as(unit.user(), status)
        }
        _ => {
            let status = format!("systemctl status {}", unit.name());
            let journal = format!("journalctl -u {}", unit.name());
            if unit == Unit::Template {
                documented(&status);
                documented(&journal);
            }
            let lines = sd.sh(&format!("{journal} --no-pager"));
            assert!(lines.contains("Started "), "{lines}");
            sd.sh(&status)
        }
    };
    assert!(status.contains("active (running)"), "{status}");
    if unit == Unit::User {
        // The login session that started it is over: bob lingers, his manager runs on.
        assert_eq!(unit.main_pid(&sd).0, main, "the watchdog was restarted");
        // One watchdog per root: a second one for bob's refuses, the first runs on.
        let second = "agent-run-watchdog@bob.service";
        let out = sd.run(sd.root("systemctl").args(["start", second]));
        assert!(!out.status.success(), "a second watchdog started");
        let s = sd.show(second, &["ExecMainStatus"]);
        assert_eq!(s["ExecMainStatus"], "75", "{s:?}");
        let said = sd.journal(&["-u", second]);
        assert!(
            said.contains("already watches /home/bob/.agent-runs"),
            "{said}"
        );
        assert_eq!(
            unit.main_pid(&sd).0,
            main,
            "the first watchdog was disturbed"
        );
    }
}

cases!(starts_and_says_ready;
    the_user_unit_starts_for_a_lingering_user_as_the_doc_says_and_says_ready => Unit::User,
    the_system_template_starts_for_a_user_as_the_doc_says_and_says_ready => Unit::Template,
    the_system_template_starts_for_root_with_the_doc_drop_in_and_says_ready => Unit::Root,
);

// ---------------------------------------------------------------------------------------------
// The systemd watchdog: pings keep the same daemon; a stopped one is restarted

fn pings_and_a_stopped_daemon_is_restarted(unit: Unit) {
    let sd = Systemd::boot();
    unit.start(&sd);
    unit.drop_in_and_restart(&sd, SHORT_WATCHDOG);
    let (main, host) = unit.main_pid(&sd);
    assert_eq!(unit.show(&sd, &["WatchdogUSec"])["WatchdogUSec"], "4s");
    // Pings (every 2 s) over two WatchdogSec, all from the same process: systemd stamps
    // each one (WatchdogTimestamp).
    let mut pings = BTreeSet::new();
    wait_until_dbg(
        "pings of the same daemon over two WatchdogSec",
        Duration::from_secs(60),
        || {
            let s = unit.show(&sd, &["MainPID", "NRestarts", "WatchdogTimestampMonotonic"]);
            assert_eq!(
                (s["MainPID"].as_str(), s["NRestarts"].as_str()),
                (main.to_string().as_str(), "0"),
                "{s:?}\n{}",
                sd.diagnostics()
            );
            let stamp = s["WatchdogTimestampMonotonic"].parse::<u64>().unwrap_or(0);
            if stamp > 0 {
                pings.insert(stamp);
            }
            let span = pings.iter().next_back().unwrap_or(&0) - pings.iter().next().unwrap_or(&0);
            (pings.len() >= 5 && span > 8_000_000)
                .then_some(())
                .ok_or(pings.clone())
        },
    );
    let status = unit.show(&sd, &["StatusText"]);
    assert!(
        status["StatusText"].starts_with("watching "),
        "no STATUS=: {status:?}"
    );
    let pinned = Pinned::new(&[host]);
    pinned.signal(host, libc::SIGSTOP).expect("SIGSTOP");
    let s = wait_until_dbg(
        "a new daemon after the stopped one",
        Duration::from_secs(60),
        || {
            let s = unit.show(&sd, &["MainPID", "NRestarts", "ActiveState", "SubState"]);
            let new = s["MainPID"] != main.to_string() && s["MainPID"] != "0";
            let up = s["ActiveState"] == "active" && s["SubState"] == "running";
            (new && up && s["NRestarts"] != "0")
                .then(|| s.clone())
                .ok_or(s)
        },
    );
    assert!(
        pinned.wait_all_gone(Duration::from_secs(30)).is_ok(),
        "the stopped daemon {host} lives on"
    );
    unit.main_pid(&sd);
    let journal = unit.journal(&sd);
    assert!(journal.contains("Watchdog timeout"), "{s:?}\n{journal}");
}

cases!(pings_and_a_stopped_daemon_is_restarted;
    the_user_unit_pings_its_watchdog_and_a_stopped_daemon_is_restarted => Unit::User,
    the_system_template_pings_its_watchdog_and_a_stopped_daemon_is_restarted => Unit::Template,
    the_root_instance_pings_its_watchdog_and_a_stopped_daemon_is_restarted => Unit::Root,
);

// ---------------------------------------------------------------------------------------------
// Under each unit's sandbox: an orphaned run and a stuck one of its user, held in cgroups

/// A run of the unit's user, started by a service of that user that runs `agent-run -d ID`
/// (lease 2 s, a workload that ignores TERM and HUP) and then stays: the run's cgroup is made
/// in the service's delegated cgroup, which stays populated after the run, so only the
/// watchdog removes it.
struct HeldRun {
    dir: String,
    /// Its cgroup, as the record names it (inside), and on the host.
    cgroup: String,
    host_cgroup: std::path::PathBuf,
    workload: Pinned,
    /// The wrapper's pid inside, and pinned on the host.
    wrapper: (i32, Pinned),
}

impl HeldRun {
    /// Start runs `ids`, one after the other, from one service of the unit's user. One
    /// service for all: no process of the user starts after the first run but the runs' own
    /// (one that did could be a run's escapee, and the run would be `unknown`, `escaped`).
    fn start_all(sd: &Systemd, unit: Unit, ids: &[&str]) -> Vec<HeldRun> {
        let runs: Vec<String> = ids
            .iter()
            .map(|id| format!("agent-run -d {id} --lease 2s --grace 1s --hup-after 200ms -- sh -c 'trap \"\" TERM HUP; exec sleep infinity' >/dev/null"))
            .collect();
        let script = format!("{} && exec sleep infinity", runs.join(" && "));
        let holder = [
            "--unit=holder",
            "-p",
            "Delegate=yes",
            "--",
            "sh",
            "-c",
            &script,
        ];
        match unit {
            Unit::User => sd.ok(sd.user("bob", "systemd-run").arg("--user").args(holder)),
            Unit::Template => sd.ok(sd.root("systemd-run").arg("--uid=alice").args(holder)),
            Unit::Root => sd.ok(sd.root("systemd-run").arg("--uid=root").args(holder)),
        };
        ids.iter().map(|id| HeldRun::found(sd, unit, id)).collect()
    }

    /// The run `id` of the unit's user, once it runs.
    fn found(sd: &Systemd, unit: Unit, id: &str) -> HeldRun {
        let dir = format!("{}/{id}", unit.runs());
        let st = sd.wait_state(&dir, Duration::from_secs(60), |s| s == "running");
        assert_eq!(
            st["containment"]["mode"],
            "cgroup",
            "{}",
            sd.run_diagnostics(&dir)
        );
        let cgroup = st["containment"]["cgroup"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let host_cgroup = sd.host_cgroup(&cgroup);
        let members: Vec<i32> = fs::read_to_string(host_cgroup.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.parse().ok())
            .collect();
        assert!(!members.is_empty(), "nothing in {}", host_cgroup.display());
        // The wrapper, pinned once it is the process the record names.
        let wrapper = st["wrapper_pid"].as_i64().unwrap_or(0) as i32;
        let host = sd.host_pid(wrapper).expect("the wrapper on the host");
        let pinned = Pinned::new(&[host]);
        let ticks = st["wrapper_start_ticks"].as_u64();
        assert_eq!(
            proc_stat(host).map(|s| s.4),
            ticks,
            "{host} is not the wrapper"
        );
        HeldRun {
            dir,
            cgroup,
            host_cgroup,
            workload: Pinned::new(&members),
            wrapper: (wrapper, pinned),
        }
    }

    fn signal_wrapper(&self, sig: i32) {
        let host = self.wrapper.1.pids()[0];
        self.wrapper
            .1
            .signal(host, sig)
            .expect("signal the wrapper");
    }

    /// The watchdog stopped it, `cancelled`/`lease_expired`: it took over an orphan, or
    /// KILLed a stuck wrapper; the workload is gone, KILL went through its cgroup, nothing the
    /// watchdog did was refused, its cgroup is removed.
    fn check_stopped(&self, sd: &Systemd, stuck: bool) {
        let dir = &self.dir;
        let st = sd.wait_state(dir, Duration::from_secs(60), |s| FINAL_STATES.contains(&s));
        let why = || format!("{}\n{}", sd.run_diagnostics(dir), sd.diagnostics());
        let (state, reason) = (st["state"].as_str(), st["reason"].as_str());
        assert_eq!(
            (state, reason),
            (Some("cancelled"), Some("lease_expired")),
            "{}",
            why()
        );
        let gone = self.workload.wait_all_gone(Duration::from_secs(10));
        assert!(gone.is_ok(), "the workload lives on\n{}", why());
        // The watchdog removes the run's cgroup right after the final record.
        let removed = poll_until(Duration::from_secs(20), || {
            match self.host_cgroup.exists() {
                true => Err(()),
                false => Ok(()),
            }
        });
        assert!(removed.is_ok(), "{} is still there\n{}", self.cgroup, why());
        let events = sd.events(dir);
        let by_watchdog = |e: &&Value| e["by"] == "watchdog";
        let wrapper = format!("pid:{}", self.wrapper.0);
        // A stuck wrapper is asked (CONT with the TERM: a stopped one then finishes its own
        // stop), and killed if it still does not finish.
        let took = |e: &&Value| match stuck {
            false => e["event"] == "takeover",
            true => {
                (e["signal"] == "KILL" || e["signal"] == "TERM") && e["target"] == wrapper.as_str()
            }
        };
        assert!(
            events.iter().filter(by_watchdog).any(|e| took(&e)),
            "{}",
            why()
        );
        let target = format!("cgroup:{}", self.cgroup);
        let killed = |e: &Value| e["signal"] == "KILL" && e["target"] == target.as_str();
        assert!(
            events.iter().any(|e| killed(e) && e["error"].is_null()),
            "no cgroup.kill\n{}",
            why()
        );
        for e in events.iter().filter(by_watchdog) {
            // A KILL by pidfd to a process cgroup.kill took first says "No such process": gone.
            no_refusal("the run's journal", &e.to_string(), sd);
            assert_ne!(e["event"], "cgroup_left", "{}", why());
        }
    }
}

fn stops_orphaned_and_stuck_cgroup_runs_under_its_sandbox(unit: Unit) {
    let sd = Systemd::boot();
    unit.start(&sd);
    let (main, _) = unit.main_pid(&sd);
    let mut runs = HeldRun::start_all(&sd, unit, &["orphan", "stuck"]).into_iter();
    let (orphan, stuck) = (runs.next().expect("orphan"), runs.next().expect("stuck"));
    orphan.signal_wrapper(libc::SIGKILL);
    // Stopped, the wrapper is alive but does nothing: the watchdog takes the run over once
    // the lease is past its grace and slack, which needs the wrapper identified by /proc.
    stuck.signal_wrapper(libc::SIGSTOP);
    orphan.check_stopped(&sd, false);
    stuck.check_stopped(&sd, true);
    let gone = stuck.wrapper.1.wait_all_gone(Duration::from_secs(30));
    assert!(
        gone.is_ok(),
        "the stuck wrapper lives on\n{}",
        sd.run_diagnostics(&stuck.dir)
    );
    let journal = unit.journal(&sd);
    for line in [
        "run orphan: wrapper gone, lease expired: cancelled (lease_expired)",
        "run stuck: wrapper stuck past its lease: cancelled (lease_expired)",
    ] {
        assert!(journal.contains(line), "no {line:?} in\n{journal}");
    }
    no_refusal(&unit.name(), &journal, &sd);
    assert_eq!(unit.main_pid(&sd).0, main, "the watchdog was restarted");
}

cases!(stops_orphaned_and_stuck_cgroup_runs_under_its_sandbox;
    the_user_unit_stops_an_orphaned_and_a_stuck_cgroup_run_of_its_user_under_its_sandbox => Unit::User,
    the_system_template_stops_an_orphaned_and_a_stuck_cgroup_run_of_its_user_under_its_sandbox => Unit::Template,
    the_root_instance_stops_an_orphaned_and_a_stuck_cgroup_run_of_root_under_its_sandbox => Unit::Root,
);

// ---------------------------------------------------------------------------------------------
// agent-run under logind and user managers

/// The login sessions logind knows of (`loginctl list-sessions`), one line each.
fn sessions(sd: &Systemd) -> String {
    sd.sh("loginctl list-sessions --no-legend")
}

/// Waits until no login session is left, its scope stopped with everything in it.
fn wait_sessions_gone(sd: &Systemd) {
    wait_until_dbg("no login session", Duration::from_secs(60), || {
        let (list, scopes) = (
            sessions(sd),
            sd.sh("systemctl list-units --no-legend --plain 'session-*.scope'"),
        );
        (list.trim().is_empty() && scopes.trim().is_empty())
            .then_some(())
            .ok_or((list, scopes))
    });
}

/// Waits until every login session has ended: gone, or `closing` (logind let its scope go on
/// with what is left in it, `abandoned`).
fn wait_sessions_ended(sd: &Systemd) {
    wait_until_dbg("every login session ended", Duration::from_secs(60), || {
        let states = sd.sh(
            "for s in $(loginctl list-sessions --no-legend | awk '{print $1}'); do loginctl show-session $s -p State --value; done",
        );
        states
            .lines()
            .all(|l| l.trim() == "closing")
            .then_some(())
            .ok_or(states)
    });
}

/// The record's leader and wrapper, as (pid inside, start ticks).
fn parties(st: &Value) -> [(i64, u64); 2] {
    let get = |k: &str| st[k].as_i64().unwrap_or(0);
    let ticks = |k: &str| st[k].as_u64().unwrap_or(0);
    [
        (get("pid"), ticks("start_ticks")),
        (get("wrapper_pid"), ticks("wrapper_start_ticks")),
    ]
}

/// Every party of the record `st` (its leader and wrapper) is alive, or gone: `alive` says
/// which, `what` what it must have survived or not. Gone: the leader at once, since the record
/// is final; the wrapper writes that record a moment before it exits, so it gets 30 s.
fn check_parties(sd: &Systemd, st: &Value, alive: bool, what: &str, why: &dyn Fn() -> String) {
    let verdict = if alive { "died with" } else { "outlived" };
    let [leader, wrapper] = parties(st);
    let exit_time = Duration::from_secs(if alive { 0 } else { 30 });
    for ((pid, ticks), patience) in [(leader, Duration::ZERO), (wrapper, exit_time)] {
        let settled = poll_until(patience, || {
            (sd.alive(pid, ticks) == alive).then_some(()).ok_or(())
        });
        assert!(settled.is_ok(), "{pid} {verdict} {what}\n{}", why());
    }
}

#[test]
fn a_lingering_users_run_gets_a_delegated_scope_with_no_setup_and_cancel_leaves_nothing() {
    let sd = Systemd::boot();
    sd.sh("loginctl enable-linger alice");
    wait_active(&sd, "user@1000.service");
    // Over "SSH": a login session; the run's tree has a setsid escapee.
    let tree = "sh -c 'sleep infinity & setsid sleep infinity & exec sleep infinity'";
    sd.ok(&mut sd.login("alice", &format!("agent-run -d tree -- {tree}")));
    let dir = "/home/alice/.agent-runs/tree";
    let st = sd.wait_state(dir, Duration::from_secs(60), |s| s == "running");
    let why = || format!("{}\n{}", sd.run_diagnostics(dir), sd.diagnostics());
    assert_eq!(st["containment"]["mode"], "cgroup", "{}", why());
    let cgroup = st["containment"]["cgroup"].as_str().unwrap_or_default();
    let scope_dir = Path::new(cgroup)
        .parent()
        .expect("the run's cgroup has a parent");
    let scope = scope_dir
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let app = "/sys/fs/cgroup/user.slice/user-1000.slice/user@1000.service/app.slice";
    assert!(
        scope_dir.parent() == Some(Path::new(app))
            && scope.starts_with("agent-run-tree-")
            && scope.ends_with(".scope"),
        "not a scope of alice's manager: {cgroup}\n{}",
        why()
    );
    let s = sd.show_user("alice", &scope, &["Delegate", "ActiveState"]);
    assert_eq!(
        (s["Delegate"].as_str(), s["ActiveState"].as_str()),
        ("yes", "active"),
        "{s:?}"
    );
    assert_eq!(st["warnings"], serde_json::json!([]), "{}", why());
    let host_cg = sd.host_cgroup(cgroup);
    let members: Vec<i32> = fs::read_to_string(host_cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect();
    assert_eq!(
        members.len(),
        3,
        "the tree's three processes: {members:?}\n{}",
        why()
    );
    let wrapper = sd
        .host_pid(st["wrapper_pid"].as_i64().unwrap_or(0) as i32)
        .expect("wrapper");
    let pinned = Pinned::new(&[members.as_slice(), &[wrapper]].concat());
    // Cancelled from another connection.
    sd.run(&mut sd.login("alice", "agent-run cancel tree"));
    let st = sd.wait_state(dir, Duration::from_secs(60), |s| FINAL_STATES.contains(&s));
    assert_eq!(
        (st["state"].as_str(), st["reason"].as_str()),
        (Some("cancelled"), Some("cancel_request")),
        "{}",
        why()
    );
    assert!(
        pinned.wait_all_gone(Duration::from_secs(10)).is_ok(),
        "left: {:?}\n{}",
        pinned.alive(),
        why()
    );
    // Nothing left: the run's cgroup, the scope (collected), any other scope of a run.
    wait_until_dbg("the scope collected", Duration::from_secs(30), || {
        let s = sd.show_user("alice", &scope, &["LoadState", "ActiveState"]);
        let gone = s["ActiveState"] == "inactive"
            && !sd.host_cgroup(&scope_dir.to_string_lossy()).exists();
        gone.then_some(()).ok_or(s)
    });
    let left = fs::read_dir(sd.host_cgroup(app)).unwrap().flatten();
    let runs: Vec<_> = left
        .filter(|e| e.file_name().to_string_lossy().starts_with("agent-run"))
        .collect();
    assert!(runs.is_empty(), "left in app.slice: {runs:?}");
}

/// A boot whose logind has `lines` in a drop-in ([Login] section).
fn boot_with_logind(lines: &str) -> Systemd {
    Boot::new()
        .file(
            "/etc/systemd/logind.conf.d/agent-run-test.conf",
            &format!("[Login]\n{lines}\n"),
        )
        .start()
}

#[test]
fn with_kill_user_processes_a_run_from_a_login_session_is_warned_of_and_cancelled_at_logout() {
    let sd = boot_with_logind("KillUserProcesses=yes");
    let busctl = "busctl get-property org.freedesktop.login1 /org/freedesktop/login1 org.freedesktop.login1.Manager KillUserProcesses";
    documented(busctl);
    assert_eq!(sd.sh(busctl).trim(), "b true");
    // bob does not linger: his run stays in his session's scope, and goes with it.
    sd.ok(&mut sd.login("bob", "agent-run -d k1 -- sleep infinity"));
    let dir = "/home/bob/.agent-runs/k1";
    let st = sd.wait_state(dir, Duration::from_secs(60), |s| FINAL_STATES.contains(&s));
    let why = || format!("{}\n{}", sd.run_diagnostics(dir), sd.diagnostics());
    // Said in the record (below) and in the run's journal.
    let said = sd.events(dir).iter().any(|e| {
        e["event"] == "warning"
            && e["warning"]
                .as_str()
                .is_some_and(|w| w.contains("KillUserProcesses"))
    });
    assert!(said, "no warning in the run's journal\n{}", why());
    let warnings = strs(&st["warnings"]).unwrap_or_default();
    assert!(
        warnings.len() == 1
            && warnings[0].contains("KillUserProcesses=yes")
            && warnings[0].contains("session-"),
        "{warnings:?}\n{}",
        why()
    );
    assert_eq!(
        (st["state"].as_str(), st["reason"].as_str()),
        (Some("cancelled"), Some("signal:TERM")),
        "{}",
        why()
    );
    wait_sessions_gone(&sd);
    check_parties(&sd, &st, false, "the session", &why);
}

#[test]
fn with_kill_user_processes_a_lingering_users_runs_leave_the_session_and_outlive_it() {
    let sd = boot_with_logind("KillUserProcesses=yes");
    sd.sh("loginctl enable-linger alice");
    wait_active(&sd, "user@1000.service");
    // By itself (a scope of alice's manager), and as the doc's systemd-run line asks.
    let explicit = "systemd-run --user --scope --quiet agent-run -d build-7 --";
    documented(explicit);
    let script = format!("agent-run -d k2 -- sleep infinity && {explicit} sleep infinity");
    sd.ok(&mut sd.login("alice", &script));
    let dirs = [
        "/home/alice/.agent-runs/k2",
        "/home/alice/.agent-runs/build-7",
    ];
    let running: Vec<Value> = dirs
        .iter()
        .map(|d| sd.wait_state(d, Duration::from_secs(60), |s| s == "running"))
        .collect();
    wait_sessions_gone(&sd);
    for (dir, st) in dirs.iter().zip(&running) {
        let why = || format!("{}\n{}", sd.run_diagnostics(dir), sd.diagnostics());
        let cgroup = st["containment"]["cgroup"].as_str().unwrap_or_default();
        assert!(
            cgroup.contains("/user@1000.service/app.slice/"),
            "{cgroup}\n{}",
            why()
        );
        assert_eq!(st["warnings"], serde_json::json!([]), "{}", why());
        assert_eq!(sd.status(dir)["state"], "running", "{}", why());
        check_parties(&sd, st, true, "the session", &why);
    }
}

#[test]
fn a_detached_run_of_a_user_who_does_not_linger_outlives_the_login_session_it_started_in() {
    // Debian's logind (KillUserProcesses=no), with a user's manager stopped as soon as the
    // user has no session left instead of 10 s later.
    let sd = boot_with_logind("UserStopDelaySec=0");
    // bob does not linger. His login starts his manager; the session ends at once.
    sd.ok(&mut sd.login("bob", "agent-run -d n1 -- sleep infinity"));
    let dir = "/home/bob/.agent-runs/n1";
    let st = sd.wait_state(dir, Duration::from_secs(60), |s| s != "starting");
    let why = || format!("{}\n{}", sd.run_diagnostics(dir), sd.diagnostics());
    // The run stays in the session's scope, held by /proc scans: a scope of bob's manager
    // would go with the manager, which logind stops once bob's sessions are all gone.
    assert_eq!(st["containment"]["mode"], "procfs", "{}", why());
    wait_sessions_ended(&sd);
    assert_eq!(sd.status(dir)["state"], "running", "{}", why());
    check_parties(&sd, &st, true, "the session", &why);
    for (pid, _) in parties(&st) {
        let host = sd.host_pid(pid as i32).expect("on the host");
        let cgroup = fs::read_to_string(format!("/proc/{host}/cgroup")).unwrap_or_default();
        assert!(
            cgroup.contains("/session-"),
            "{pid} left the session: {cgroup}"
        );
    }
    assert_eq!(st["warnings"], serde_json::json!([]), "{}", why());
    // Cancelled from a later connection: nothing of it is left.
    sd.run(sd.user("bob", "agent-run").args(["cancel", "n1"]));
    let st = sd.wait_state(dir, Duration::from_secs(60), |s| FINAL_STATES.contains(&s));
    assert_eq!(st["state"], "cancelled", "{}", why());
    check_parties(&sd, &st, false, "the cancel", &why);
}

#[test]
fn with_kill_user_processes_a_user_in_kill_exclude_users_is_not_warned_and_the_run_outlives_the_session(
) {
    let setting = "KillExcludeUsers=root bob";
    documented("KillExcludeUsers=");
    let sd = boot_with_logind(&format!("KillUserProcesses=yes\n{setting}"));
    sd.ok(&mut sd.login("bob", "agent-run -d k4 -- sleep infinity"));
    let dir = "/home/bob/.agent-runs/k4";
    let st = sd.wait_state(dir, Duration::from_secs(60), |s| s == "running");
    wait_sessions_ended(&sd);
    let why = || format!("{}\n{}", sd.run_diagnostics(dir), sd.diagnostics());
    assert_eq!(st["warnings"], serde_json::json!([]), "{}", why());
    assert_eq!(sd.status(dir)["state"], "running", "{}", why());
    check_parties(&sd, &st, true, "the session", &why);
}

// ---------------------------------------------------------------------------------------------
// What the doc says of each unit's sandbox

#[test]
fn each_units_systemd_analyze_security_exposure_is_the_one_the_doc_gives() {
    let sd = Systemd::boot();
    let mut figures = Vec::new();
    for unit in [Unit::User, Unit::Template, Unit::Root] {
        unit.start(&sd);
        let name = unit.name();
        let out = match unit {
            Unit::User => sd.ok(sd
                .user("bob", "systemd-analyze")
                .args(["--user", "security", &name])),
            _ => sd.ok(sd.root("systemd-analyze").args(["security", &name])),
        };
        let figure = out
            .lines()
            .find_map(|l| l.split_once(&format!("Overall exposure level for {name}: ")))
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no exposure figure for {name}:\n{out}"))
            .to_string();
        eprintln!("systemd-figure: {name} exposure {figure}");
        figures.push((name, figure));
    }
    for (name, figure) in figures {
        documented(&format!("| `{name}` | {figure} |"));
    }
}
