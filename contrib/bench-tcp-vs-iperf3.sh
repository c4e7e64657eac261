#!/bin/sh
# Compare ferry_bench over the native TCP transport with iperf3 over loopback,
# in one run on this host.  Prints each run and the medians of $RUNS runs.
# Usage: contrib/bench-tcp-vs-iperf3.sh [BUILD_DIR [BASELINE_BENCH]]
#   BUILD_DIR: default the source tree.  BASELINE_BENCH: another ferry_bench
#   (an older build) measured interleaved with this one, run for run.
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
baseline=${2:-}
runs=${RUNS:-5}
seconds=${SECONDS_PER_RUN:-5}
export FERRY_RPC_ADDRESS=127.0.0.1
command -v iperf3 >/dev/null || { echo "iperf3 is not installed" >&2; exit 1; }
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }

# iperf3 -P N: GB/s (10^9 bytes) received
iperf_run() {
    port=$(free_port)
    iperf3 -s -1 -B 127.0.0.1 -p "$port" >/dev/null 2>&1 &
    server=$!
    sleep 0.3
    iperf3 -c 127.0.0.1 -p "$port" -P "$1" -t "$seconds" -J 2>/dev/null |
        python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.4f" % (d["end"]["sum_received"]["bits_per_second"]/8e9))'
    wait "$server" 2>/dev/null || true
}

ferry_run() { # op block batch threads [bench]
    "${5:-$bench}" --spawn --transport=tcp --operation="$1" --block-size="$2" --batch-size="$3" \
        --threads="$4" --duration="$seconds" | sed -n 's/.* gbps=\([0-9.]*\).*/\1/p'
}

report() { # label baseline_file result_file
    b=$(median < "$2"); r=$(median < "$3")
    ratio=$(awk -v r="$r" -v b="$b" 'BEGIN {printf "%.2f", r/b}')
    printf '%-44s ferry %7.3f GB/s   iperf3 %7.3f GB/s   ratio %s\n' "$1" "$r" "$b" "$ratio"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for i in $(seq "$runs"); do
    iperf_run 1 >> "$tmp/iperf1"
    iperf_run 2 >> "$tmp/iperf2"
    for op in write read; do
        for case in "4m 16 1" "64k 128 1" "4m 16 2" "64k 128 2"; do
            set -- $case
            ferry_run $op $1 $2 $3 >> "$tmp/$op-$1-$3"
            [ -z "$baseline" ] || ferry_run $op $1 $2 $3 "$baseline" >> "$tmp/base-$op-$1-$3"
        done
    done
    echo "run $i: iperf3 -P1 $(tail -1 "$tmp/iperf1") -P2 $(tail -1 "$tmp/iperf2");" \
         "write 4m $(tail -1 "$tmp/write-4m-1") 64k $(tail -1 "$tmp/write-64k-1");" \
         "read 4m $(tail -1 "$tmp/read-4m-1") 64k $(tail -1 "$tmp/read-64k-1");" \
         "2 threads: write 4m $(tail -1 "$tmp/write-4m-2") read 4m $(tail -1 "$tmp/read-4m-2")"
done
echo "medians of $runs runs of ${seconds}s:"
for op in write read; do
    report "$op 4 MiB, batch 16, 1 thread (vs -P 1)" "$tmp/iperf1" "$tmp/$op-4m-1"
    report "$op 64 KiB, batch 128, 1 thread (vs -P 1)" "$tmp/iperf1" "$tmp/$op-64k-1"
    report "$op 4 MiB, batch 16, 2 threads (vs -P 2)" "$tmp/iperf2" "$tmp/$op-4m-2"
    report "$op 64 KiB, batch 128, 2 threads (vs -P 2)" "$tmp/iperf2" "$tmp/$op-64k-2"
done
[ -z "$baseline" ] && exit 0
echo "baseline $baseline, same runs:"
for op in write read; do
    report "baseline $op 4 MiB, batch 16, 1 thread" "$tmp/iperf1" "$tmp/base-$op-4m-1"
    report "baseline $op 64 KiB, batch 128, 1 thread" "$tmp/iperf1" "$tmp/base-$op-64k-1"
    report "baseline $op 4 MiB, batch 16, 2 threads" "$tmp/iperf2" "$tmp/base-$op-4m-2"
    report "baseline $op 64 KiB, batch 128, 2 threads" "$tmp/iperf2" "$tmp/base-$op-64k-2"
done
