//! Scenario steps that several test files repeat.

use crate::modes::{for_each_mode, Mode};
use crate::TestRoot;

/// [`for_each_mode`], each mode with a fresh root and the run id `<name>-<mode tag>`.
pub fn for_each_mode_in_root(
    modes: &[Mode],
    name: &str,
    mut scenario: impl FnMut(Mode, &TestRoot, &str),
) {
    for_each_mode(modes, |mode| {
        let root = TestRoot::new();
        let id = format!("{name}-{}", mode.tag());
        scenario(mode, &root, &id);
    });
}
