#!/bin/sh
# Same-host paths against memcpy, in one run on this host: ferry_bench over
# cxl (a window file on /dev/shm), shm (cross-memory attach) and ucx (UCX
# shared memory), each with --memcpy-baseline: a single thread's memcpy of
# the same blocks between two buffers of the same --memory kind, measured
# by the same process just before.  Writes, one initiator thread; the
# medians of $RUNS runs and the ratios transport/memcpy.
#
# Usage: contrib/bench-same-host.sh [BUILD_DIR]   (default: the source tree)
# Environment: RUNS (5), SECONDS_PER_RUN (3), SIZES ("64k 1m 4m"),
#              CASES ("cxl:cxl shm:ferry shm:heap ucx:ferry": transport:memory)
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
runs=${RUNS:-5}
seconds=${SECONDS_PER_RUN:-3}
sizes=${SIZES:-"64k 1m 4m"}
cases=${CASES:-"cxl:cxl shm:ferry shm:heap ucx:ferry"}
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$build/modules/.libs}
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }

tmp=$(mktemp -d)
window=/dev/shm/ferry-bench-window-$$
trap 'rm -rf "$tmp" "$window"' EXIT
truncate -s 1G "$window"
export FERRY_CXL_PATH=$window

for i in $(seq "$runs"); do
    line="run $i:"
    for c in $cases; do
        transport=${c%%:*} memory=${c#*:}
        for size in $sizes; do
            out=$("$bench" --spawn --transport="$transport" --memory="$memory" \
                --block-size="$size" --batch-size="$(batch_for "$size")" \
                --duration="$seconds" --memcpy-baseline 2>/dev/null)
            echo "$out" | sed -n 's/^RESULT .*transport=\([a-z]*\) .* gbps=\([0-9.]*\).*/\1 \2/p' |
                while read -r served gbps; do
                    [ "$served" = "$transport" ] || { echo "$c $size served by $served" >&2; exit 1; }
                    echo "$gbps" >> "$tmp/$c-$size"
                done
            echo "$out" | sed -n 's/^BASELINE memcpy .* gbps=\([0-9.]*\).*/\1/p' >> "$tmp/$c-$size-memcpy"
            line="$line $c $size $(tail -1 "$tmp/$c-$size")/$(tail -1 "$tmp/$c-$size-memcpy")"
        done
    done
    echo "$line (transport/memcpy GB/s)"
done
echo "medians of $runs runs, writes, GB/s = 10^9 bytes/s; memcpy: one thread, same memory kind:"
printf '%-12s %-6s %9s %9s %7s\n' "transport" "size" "ferry" "memcpy" "ratio"
for c in $cases; do
    for size in $sizes; do
        f=$(median < "$tmp/$c-$size")
        m=$(median < "$tmp/$c-$size-memcpy")
        printf '%-12s %-6s %9s %9s %7s\n' "$c" "$size" "$f" "$m" \
            "$(awk -v f="$f" -v m="$m" 'BEGIN {printf "%.2f", f / m}')"
    done
done
