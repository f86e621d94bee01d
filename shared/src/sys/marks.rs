//! What this process shows of itself to others: the marks in its signal mask (stopping, final, party), its comm and whether it is dumpable.

use super::*;

/// The signal whose block in a wrapper's main thread says, as a kernel fact, that the wrapper is
/// stopping its run: /proc/PID/status shows the main thread's mask (`SigBlk`), and no other
/// process can change it (ptrace aside). `cancel` reads it instead of the record's `cancelling`,
/// which the run can write. URG: ignored by default, never used by agent-run, so a URG sent
/// meanwhile to another of the wrapper's threads does nothing.
pub const STOPPING_MARK: Sig = Sig::Other(libc::SIGURG);

/// Say, in this thread's signal mask, that this wrapper is stopping its run (the main thread,
/// at the stop's start; never undone: a stop is the run's end). See [`STOPPING_MARK`].
pub fn mark_stopping() {
    mask_signal(STOPPING_MARK.number(), true);
}

/// The signal whose block in a wrapper's main thread says that the wrapper wrote its run's
/// final record itself: a final record is believed while its wrapper still lives (its last
/// moments, the keeper's exit) only with this mark, so a record the workload forged while the
/// wrapper runs is not. VTALRM: never used by agent-run.
pub const FINAL_MARK: Sig = Sig::Other(libc::SIGVTALRM);

/// Say, in this thread's signal mask, that this wrapper wrote its final record (the main
/// thread, just before the write; never undone). See [`FINAL_MARK`].
pub fn mark_final() {
    mask_signal(FINAL_MARK.number(), true);
}

/// The signal whose block in a process's main thread says it is an agent-run party (`cancel`,
/// `status`, the watchdog: anything but a wrapper): whoever finds it holding a run's lock (a
/// takeover, or a look that holds the lock for a moment) never takes it for the run's wrapper.
/// PWR: never used by agent-run.
pub const PARTY_MARK: Sig = Sig::Other(libc::SIGPWR);

/// Say, in this thread's signal mask (the main thread, at the start), that this process is an
/// agent-run party, not a wrapper. See [`PARTY_MARK`].
pub fn mark_party() {
    mask_signal(PARTY_MARK.number(), true);
}

/// Take both marks out of this thread's mask at launch: a mask is inherited across exec, so a
/// caller that blocked URG or VTALRM must not make a new wrapper look as if it were stopping
/// or done.
pub fn clear_marks() {
    mask_signal(STOPPING_MARK.number(), false);
    mask_signal(FINAL_MARK.number(), false);
    mask_signal(PARTY_MARK.number(), false);
}

/// Name this thread (the main thread: the process) `name`, as /proc/PID/comm shows it: the
/// wrapper names itself `agent-run` whatever its executable is called, since that name is one
/// of the facts that tell it from the workload ([`crate::wrapper::verify_wrapper`]).
pub fn set_comm(name: &std::ffi::CStr) -> io::Result<()> {
    rustix::thread::set_name(name).map_err(Into::into)
}

/// Make this process non-dumpable (prctl(2) `PR_SET_DUMPABLE` 0): its memory, environment and
/// descriptors (/proc/PID/mem, environ, fd) are then closed to processes of its own user, and
/// none of them can ptrace it. The wrapper holds its run's lease token in memory.
pub fn set_non_dumpable() -> io::Result<()> {
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(Into::into)
}
