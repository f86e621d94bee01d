//! The static build's code layout (packaging/build-static.sh, packaging/layout/order.py).
//!
//! With `AGENT_RUN_LAYOUT_DIR` set, the `agent-run` binary is linked with a map of where each
//! symbol went (`agent-run.map`) and, when `agent-run.order` is there, with that file as lld's
//! symbol order: the functions a run executes first in `.text`, so the kernel maps a few hundred
//! KiB of the binary for a run instead of nearly all of it (it maps file pages 64 KiB around
//! each fault). The order file changes only where the linker puts functions, never what is
//! compiled: the second link of the build has the same symbols as the traced first one.
//! Unset (every other build), this does nothing.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=AGENT_RUN_LAYOUT_DIR");
    let Some(dir) = std::env::var_os("AGENT_RUN_LAYOUT_DIR") else {
        return;
    };
    let dir = Path::new(&dir);
    let order = dir.join("agent-run.order");
    println!("cargo:rerun-if-changed={}", order.display());
    let map = dir.join("agent-run.map");
    println!(
        "cargo:rustc-link-arg-bin=agent-run=-Wl,-Map={}",
        map.display()
    );
    if order.is_file() {
        println!(
            "cargo:rustc-link-arg-bin=agent-run=-Wl,--symbol-ordering-file={}",
            order.display()
        );
        // Symbols of the trace that this link does not have (none, for the same sources) are
        // no error: the order is a hint.
        println!("cargo:rustc-link-arg-bin=agent-run=-Wl,--no-warn-symbol-ordering");
    }
}
