#!/usr/bin/env bash
# Build agent-run and agent-run-watchdog as fully static release binaries in
# target/static/, so that one file can be copied to any Linux host of the same
# architecture (`scp target/static/agent-run host:.local/bin/`).
#
#   bash packaging/build-static.sh
#
# It builds against musl, fetching the target with rustup when it is missing
# (`rustup target add <arch>-unknown-linux-musl`; AGENT_RUN_MUSL=off skips both). Where the
# target cannot be had it links glibc statically
# (-C target-feature=+crt-static), with an explicit --target so that build
# scripts and proc-macros, which must be dynamic, are built for the host
# without that flag. Nothing in agent-run needs NSS (it reads /etc/passwd
# itself), so either build runs on any host with the same architecture.
#
# With valgrind and python3 there, agent-run is linked twice: the first link is
# traced through two real runs (callgrind, every executed instruction), and the
# second puts the functions those runs executed together at the start of .text
# (packaging/layout/order.py writes lld's symbol order; wrapper/build.rs passes
# it). A run then maps about 600 KiB of the wrapper's text instead of nearly
# all 1.8 MiB: the kernel maps file pages 64 KiB around each fault, and the
# launch path touched every window. AGENT_RUN_LAYOUT=off skips it, =on makes a
# failure of it fatal (default: auto, a warning and the compiler's order).
#
# Then it strips both binaries, checks that they are static, runs a real run
# with an empty environment, and prints their sizes.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

say() { printf 'agent-run: build-static: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

host=$(rustc -vV | sed -n 's/^host: //p')
[[ -n $host ]] || die "cannot tell the host target from rustc -vV"
arch=${host%%-*}
musl="$arch-unknown-linux-musl"
gnu="$arch-unknown-linux-gnu"

build=(cargo build --release --locked -p agent-run -p agent-run-watchdog)
# musl is worth a fetch: glibc's static start asks the CPU about 43 CPUID questions (its
# cache sizes and features), each a trap to the hypervisor in a VM: ~0.25 ms of every launch
# on the machines docs/benchmarks.md was measured on; musl's start asks none. Where the
# target cannot be had (no network to rustup's server), the glibc build below is the same
# program. AGENT_RUN_MUSL=off never fetches nor uses it.
musl_mode=${AGENT_RUN_MUSL:-auto}
case $musl_mode in auto | off) ;; *) die "AGENT_RUN_MUSL is '$musl_mode': auto or off" ;; esac
have_musl() { command -v rustup >/dev/null && rustup target list --installed 2>/dev/null | grep -qx "$musl"; }
if [[ $musl_mode == auto ]] && command -v rustup >/dev/null && ! have_musl; then
    say "fetching the $musl target (rustup target add, at most 120 s)"
    timeout 120 rustup target add "$musl" >&2 || say "could not fetch $musl: building with glibc"
fi
if [[ $musl_mode == auto ]] && have_musl; then
    target=$musl
    flavour="musl ($musl)"
    say "linking against musl: $musl"
    # Linked by the toolchain's own lld (rust-lld behind its gcc-ld shim), as the gnu target
    # is by default: the code layout below passes lld's --symbol-ordering-file, which the
    # system's GNU ld does not know.
    gcc_ld="$(rustc --print sysroot)/lib/rustlib/$host/bin/gcc-ld"
    musl_flags=()
    if [[ -x $gcc_ld/ld.lld ]]; then
        musl_flags=(-C link-arg=-fuse-ld=lld "-C" "link-arg=-B$gcc_ld")
    fi
    build_static() {
        RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }${musl_flags[*]}" "${build[@]}" --target "$target"
    }
else
    target=$gnu
    flavour="glibc, statically linked ($gnu, +crt-static)"
    say "no $musl target installed: linking glibc statically ($gnu, +crt-static)"
    build_static() {
        RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" \
            "${build[@]}" --target "$target"
    }
fi

# The code layout (see the top). The order file is emptied first: the first link keeps the
# compiler's order and is the one traced; the second link has the same symbols (the order
# changes where the linker puts functions, not what is compiled).
layout_mode=${AGENT_RUN_LAYOUT:-auto}
case $layout_mode in auto | on | off) ;; *) die "AGENT_RUN_LAYOUT is '$layout_mode': auto, on or off" ;; esac
layout=$PWD/target/static-layout
layout_note="compiler's order"
layout_fail() {
    [[ $layout_mode == on ]] && die "layout: $*"
    say "layout: $*; keeping the compiler's order (AGENT_RUN_LAYOUT=off skips this step)"
    : >"$layout/agent-run.order"
    build_static
}
if [[ $layout_mode != off ]] && command -v valgrind >/dev/null && command -v python3 >/dev/null; then
    mkdir -p "$layout"
    rm -f "$layout"/cg.*
    : >"$layout/agent-run.order"
    export AGENT_RUN_LAYOUT_DIR=$layout
    build_static
    traced="target/$target/release/agent-run"
    lroot=$(mktemp -d)
    vg=(valgrind -q --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no
        "--callgrind-out-file=$layout/cg.%p")
    # What a run does: a quiet one past two heartbeats, and one that streams both outputs.
    if "${vg[@]}" "$traced" --root "$lroot/runs" --quiet layout-quiet -- sleep 2.5 >/dev/null 2>"$lroot/vg.err" \
        && "${vg[@]}" "$traced" --root "$lroot/runs" layout-stream -- sh -c 'echo out; echo err >&2; sleep 1.5' \
            >/dev/null 2>>"$lroot/vg.err" \
        && python3 packaging/layout/order.py "$layout/agent-run.map" "$layout/agent-run.order.new" "$layout"/cg.* >&2; then
        mv "$layout/agent-run.order.new" "$layout/agent-run.order"
        build_static
        if python3 packaging/layout/order.py --check "$layout/agent-run.map" "$layout/agent-run.order" >&2; then
            layout_note="launch code first ($(wc -l <"$layout/agent-run.order") functions traced)"
        else
            layout_fail "the second link did not put the traced functions first"
        fi
    else
        tail -5 "$lroot/vg.err" >&2 || true
        layout_fail "tracing the first link failed"
    fi
    rm -rf "$lroot" "$layout"/cg.*
else
    [[ $layout_mode == on ]] && die "layout: AGENT_RUN_LAYOUT=on needs valgrind and python3"
    [[ $layout_mode == off ]] || say "layout: no valgrind (or python3): keeping the compiler's order"
    if [[ -n ${AGENT_RUN_LAYOUT_DIR:-} ]]; then unset AGENT_RUN_LAYOUT_DIR; fi
    build_static
fi

out=target/static
mkdir -p "$out"
bins=(agent-run agent-run-watchdog)
for b in "${bins[@]}"; do
    src="target/$target/release/$b"
    [[ -x $src ]] || die "missing $src after the build"
    install -m 0755 "$src" "$out/$b"
    strip --strip-all "$out/$b"
    # ldd says "not a dynamic executable" for static binaries and
    # "statically linked" for static-pie ones; anything else lists libraries.
    linkage=$(ldd "$out/$b" 2>&1 || true)
    case $linkage in
        *"not a dynamic executable"* | *"statically linked"*) ;;
        *) die "$out/$b is not static: $linkage" ;;
    esac
done

# A real run with an empty environment: no PATH, no HOME, so --root is given.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
got=$(env -i "$out/agent-run" --root "$tmp/runs" static-smoke -- sh -c 'echo static-ok') \
    || die "the static agent-run failed a run under env -i (exit $?)"
[[ $got == static-ok ]] || die "the static agent-run printed '$got', expected 'static-ok'"
grep -q '"state": *"finished"' "$tmp/runs/static-smoke/status.json" \
    || die "the static run's status.json is not finished: $(cat "$tmp/runs/static-smoke/status.json")"
env -i "$out/agent-run" --root "$tmp/runs" status static-smoke >/dev/null 2>&1 \
    || die "the static agent-run status failed under env -i"
# The watchdog, once, over that root: a final run needs nothing from it.
env -i timeout 60 "$out/agent-run-watchdog" --root "$tmp/runs" --once \
    || die "the static agent-run-watchdog --once failed under env -i (exit $?)"

say "built with $flavour; agent-run's text: $layout_note"
for b in "${bins[@]}"; do
    bytes=$(stat -c %s "$out/$b")
    printf '%-32s %9d bytes  %6d KiB  static, stripped\n' "$out/$b" "$bytes" $(((bytes + 1023) / 1024))
done
