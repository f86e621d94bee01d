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
    build_static() {
        "${build[@]}" --target "$target"
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

build_static

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

say "built with $flavour"
for b in "${bins[@]}"; do
    bytes=$(stat -c %s "$out/$b")
    printf '%-32s %9d bytes  %6d KiB  static, stripped\n' "$out/$b" "$bytes" $(((bytes + 1023) / 1024))
done
