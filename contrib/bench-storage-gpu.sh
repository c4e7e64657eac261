#!/bin/sh
# Device memory to and from a same-host peer's storage buffer (the file
# transport, doc/storage.md), against host memory to and from the same
# file: ferry_bench --local-memory=KIND:0 (each FERRY_STORAGE_GPU path) and
# --local-memory=cpu, runs interleaved, medians of $RUNS, and device / host.
# Without a GPU the device is the test suite's stand-in (testgpu: memcpy
# between memfd mappings), which measures our staging's own cost, not a
# GPU's.  On the GPU machine: KIND=cuda (PATHS="staging cufile auto").
# Usage: contrib/bench-storage-gpu.sh [BUILD_DIR]
#   KIND (testgpu), PATHS (staging auto), FILE (/tmp/ferry-bench-storage-gpu.dat),
#   SIZE (256m: the file and the range), BLOCK (1m), BATCH (4), RUNS (3),
#   SECONDS_PER_RUN (3).
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
kind=${KIND:-testgpu}
paths=${PATHS:-staging auto}
file=${FILE:-/tmp/ferry-bench-storage-gpu.dat}
size=${SIZE:-256m}
block=${BLOCK:-1m}
batch=${BATCH:-4}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-3}
export FERRY_RPC_ADDRESS=127.0.0.1 FERRY_MODULE_DIR="${FERRY_MODULE_DIR:-$build/modules/.libs}"
[ "$kind" = testgpu ] && export FERRY_TESTGPU_DEVICES="${FERRY_TESTGPU_DEVICES:-2}"
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }
out=$(mktemp -d)
trap 'rm -rf "$out"; rm -f "$file"' EXIT

one() { # label local-memory storage-gpu-path op: prints GB/s
    FERRY_STORAGE_GPU=$3 "$bench" --spawn --local-memory="$2" --remote-memory="file:$file" \
        --buffer-size="$size" -b "$block" -B "$batch" --duration="$seconds" --operation="$4" \
        2>/dev/null | sed -n 's/^RESULT .* gbps=\([0-9.]*\).*/\1/p'
}

echo "# $(date -u '+%F %T UTC'), load average $(cut -d' ' -f1-3 /proc/loadavg)," \
    "$block blocks x $batch per batch over $size of $file"
for op in read write; do
    for r in $(seq "$runs"); do
        v=$(one host cpu auto "$op")
        echo "$op host run $r: $v GB/s"
        echo "$v" >> "$out/$op-host"
        for p in $paths; do
            v=$(one "$p" "$kind:0" "$p" "$op")
            echo "$op $kind:0 $p run $r: $v GB/s"
            echo "$v" >> "$out/$op-$p"
        done
    done
done
echo "# medians (GB/s) and device / host; load average now $(cut -d' ' -f1-3 /proc/loadavg)"
for op in read write; do
    host=$(median < "$out/$op-host")
    line="$op: host $host"
    for p in $paths; do
        m=$(median < "$out/$op-$p")
        line="$line, $kind:0 $p $m ($(awk -v a="$m" -v b="$host" 'BEGIN {printf "%.2fx", (b > 0 ? a / b : 0)}'))"
    done
    echo "$line"
done
