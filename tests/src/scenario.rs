//! Scenario steps that several test files repeat.

use crate::modes::{for_each_mode, Mode};
use crate::{ctx, Ctx, TestRoot};

/// [`for_each_mode`], each mode with a fresh root, the run id `<name>-<mode tag>` and the
/// run's checks.
pub fn for_each_mode_in_root(
    modes: &[Mode],
    name: &str,
    mut scenario: impl for<'r> FnMut(Mode, &'r TestRoot, &'r str, Ctx<'r>),
) {
    for_each_mode(modes, |mode| {
        let root = TestRoot::new();
        let id = format!("{name}-{}", mode.tag());
        scenario(mode, &root, &id, ctx(&root, &id));
    });
}
