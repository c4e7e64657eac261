#!/bin/sh
# tcp bandwidth to one peer as initiator threads grow (issue 19): 4 MiB
# writes (batch 16) from 1, 2, 4 and 8 threads, default tcp settings, over
# loopback; medians of $RUNS runs.  Meant for a machine with 16 or more cores,
# where 8 threads should reach $TARGET_GBPS (default 25) GB/s; exits 1 when
# they do not.  Also prints the initiator's thread count during a run.
# Usage: contrib/bench-tcp-threads.sh [BUILD_DIR]   (default: the source tree)
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-5}
target=${TARGET_GBPS:-25}
export FERRY_RPC_ADDRESS=127.0.0.1
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }
echo "host: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"

run() { # threads -> GB/s
    "$bench" --spawn --transport=tcp --operation=write --block-size=4m --batch-size=16 \
        --threads="$1" --duration="$seconds" | sed -n 's/.* gbps=\([0-9.]*\).*/\1/p'
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
    for t in 1 2 4 8; do
        run "$t" >> "$tmp/$t"
    done
    echo "run $i: $(for t in 1 2 4 8; do printf '%s threads %s GB/s; ' "$t" "$(tail -1 "$tmp/$t")"; done)"
done
# Threads of the initiator process in the middle of an 8-thread run.
"$bench" --spawn --transport=tcp --operation=write --block-size=4m --batch-size=16 \
    --threads=8 --duration=3 >/dev/null &
pid=$!
sleep 1.5
echo "initiator threads during an 8-thread run: $(ls /proc/$pid/task | wc -l)" \
     "(8 benchmark threads, the tcp I/O threads, the engine's own)"
wait "$pid"
echo "medians of $runs runs of ${seconds}s:"
for t in 1 2 4 8; do
    printf '%s threads: %s GB/s\n' "$t" "$(median < "$tmp/$t")"
done
best=$(median < "$tmp/8")
awk -v b="$best" -v t="$target" 'BEGIN { exit !(b >= t) }' &&
    echo "8 threads: $best GB/s >= $target GB/s" ||
    { echo "8 threads: $best GB/s is below $target GB/s"; exit 1; }
