#!/bin/sh
# The measurement behind the default order of the same-host transports: the
# same two processes and the same buffers (every transport enabled), each
# request naming its transport (ferry_bench --via), for memory from
# ferry_alloc (UCX's own mapping when ucx is built) and for registered heap
# memory.  Writes, one thread; medians of $RUNS runs.
#
# Usage: contrib/bench-same-host-order.sh [BUILD_DIR]
# Environment: RUNS (3), SECONDS_PER_RUN (2), SIZES ("64k 1m 4m"),
#              VIA ("ucx shm tcp")
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-2}
sizes=${SIZES:-"64k 1m 4m"}
via_list=${VIA:-"ucx shm tcp"}
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$build/modules/.libs}
unset FERRY_TRANSPORTS FERRY_CXL_PATH
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for i in $(seq "$runs"); do
    for memory in ferry heap; do
        for via in $via_list; do
            for size in $sizes; do
                "$bench" --spawn --memory="$memory" --via="$via" --block-size="$size" \
                    --batch-size="$(batch_for "$size")" --duration="$seconds" 2>/dev/null |
                    sed -n 's/^RESULT .* gbps=\([0-9.]*\).*/\1/p' >> "$tmp/$memory-$via-$size"
            done
            "$bench" --spawn --memory="$memory" --via="$via" --latency --block-size=8 \
                --duration="$seconds" 2>/dev/null |
                sed -n 's/^LATENCY .* median_us=\([0-9.]*\).*/\1/p' >> "$tmp/$memory-$via-lat"
        done
    done
    echo "run $i done" >&2
done
echo "medians of $runs runs; writes in GB/s (10^9 bytes/s), 8 B write latency in us:"
printf '%-7s %-5s' memory via
for size in $sizes; do printf ' %9s' "$size"; done
printf ' %9s\n' "8 B us"
for memory in ferry heap; do
    for via in $via_list; do
        printf '%-7s %-5s' "$memory" "$via"
        for size in $sizes; do
            printf ' %9s' "$(median < "$tmp/$memory-$via-$size" 2>/dev/null || echo -)"
        done
        printf ' %9s\n' "$(median < "$tmp/$memory-$via-lat" 2>/dev/null || echo -)"
    done
done
