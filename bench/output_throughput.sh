#!/bin/sh
# Output throughput (issue 14): a 1 GiB writer through agent-run's pipes + keeper into
# stdout.log, against `cat` writing the same bytes into a file on the same disk.
#
#   bench/output_throughput.sh [BIN] [ROUNDS] [DIR]
#
# BIN defaults to target/release/agent-run (build it first: cargo build --release -p agent-run),
# ROUNDS to 5, DIR (the disk measured) to a fresh directory under $TMPDIR or /tmp. Every
# measurement starts after `sync`, the cases rotate each round, and the median is reported.
# Cases:
#   cat            head -c 1G /dev/zero | cat > DIR/cat.out
#   keeper         agent-run --quiet --max-output none   (no cap)
#   keeper+cap     agent-run --quiet (the default 1G cap: nothing dropped, every write checked)
#   keeper+stream  agent-run --max-output none, its stdout (the live stream) to /dev/null
#   pty            agent-run --quiet --max-output none --pty: the pty's master is the keeper's
#                  source (the kernel's pty line discipline bounds it; CASES=... to skip it)
# Launch cost: `agent-run ID -- true`, N times, against `true` itself.
set -eu
BIN=${1:-target/release/agent-run}
ROUNDS=${2:-5}
BASE=${3:-${TMPDIR:-/tmp}}
DIR=$(mktemp -d "$BASE/agent-run-output-bench.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
ROOT="$DIR/runs"
SIZE=1073741824
[ -x "$BIN" ] || { echo "no $BIN: cargo build --release -p agent-run" >&2; exit 2; }

now() { date +%s.%N; }

one() { # case round -> seconds
    sync
    t0=$(now)
    case $1 in
        cat) head -c $SIZE /dev/zero | cat > "$DIR/cat.out" ;;
        keeper) "$BIN" --root "$ROOT" --quiet --max-output none "k$2" -- head -c $SIZE /dev/zero </dev/null ;;
        keeper+cap) "$BIN" --root "$ROOT" --quiet "c$2" -- head -c $SIZE /dev/zero </dev/null ;;
        keeper+stream) "$BIN" --root "$ROOT" --max-output none "s$2" -- head -c $SIZE /dev/zero </dev/null >/dev/null ;;
        pty) "$BIN" --root "$ROOT" --quiet --max-output none --pty "p$2" -- head -c $SIZE /dev/zero </dev/null ;;
    esac
    t1=$(now)
    # Every byte once: the file holds exactly SIZE bytes.
    case $1 in
        cat) f="$DIR/cat.out" ;;
        keeper) f="$ROOT/k$2/stdout.log" ;;
        keeper+cap) f="$ROOT/c$2/stdout.log" ;;
        keeper+stream) f="$ROOT/s$2/stdout.log" ;;
        pty) f="$ROOT/p$2/stdout.log" ;;
    esac
    n=$(stat -c %s "$f")
    [ "$n" -eq $SIZE ] || { echo "$1: $f holds $n bytes, not $SIZE" >&2; exit 1; }
    rm -f "$f"
    echo "$t1 - $t0" | bc -l
}

CASES=${CASES:-cat keeper keeper+cap keeper+stream pty}
for r in $(seq 1 "$ROUNDS"); do
    # Rotate the order each round.
    set -- $CASES
    i=1
    while [ $i -lt "$r" ]; do c=$1; shift; set -- "$@" "$c"; i=$((i + 1)); done
    for c in "$@"; do
        echo "$c $(one "$c" "$r")" >> "$DIR/times"
    done
done

median() { grep "^$1 " "$DIR/times" | awk '{print $2}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
CAT=$(median cat)
printf '%-14s %8s %8s %7s\n' case "s" "GB/s" "of cat"
for c in $CASES; do
    m=$(median "$c")
    printf '%-14s %8.3f %8.2f %6.0f%%\n' "$c" "$m" "$(echo "$SIZE / $m / 1000000000" | bc -l)" "$(echo "$CAT / $m * 100" | bc -l)"
done

# Launch cost of the keeper: N short runs, median per run.
N=${LAUNCHES:-50}
t0=$(now)
i=0
while [ $i -lt "$N" ]; do "$BIN" --root "$ROOT" --quiet "l$i" -- true </dev/null; i=$((i + 1)); done
t1=$(now)
echo "launch: agent-run ID -- true: $(echo "($t1 - $t0) / $N * 1000" | bc -l | cut -c1-6) ms a run (mean of $N)"
