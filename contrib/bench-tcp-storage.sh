#!/bin/bash
# tcp serving a storage buffer against tcp serving memory (issue 21): a
# ferry_bench target owns a page-cache file on /dev/shm as a storage buffer
# (or, for the baseline, plain memory), the initiator reads or writes it
# over tcp, 1 MiB requests, batches of 32.  Each storage case runs twice:
# the target sending from and receiving into its shared mapping of the
# file (the default), and the staged path of before
# (FERRY_TCP_STORAGE_STAGED=yes: one bounce buffer per request).  Runs are interleaved case by case;
# prints each run with the load average, then medians and storage/memory.
# Next to each throughput: the target process's CPU time (user + system)
# per GB moved, from the first request to the result (/proc/PID/stat),
# which a loaded machine disturbs less than the throughput.
# Usage: contrib/bench-tcp-storage.sh [BUILD_DIR]
#   RUNS (default 5), SECONDS_PER_RUN (3), FILE (/dev/shm/ferry-bench-tcp-storage.dat),
#   BLOCK (1m), BATCH (32), OPS ("read write").
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
file=${FILE:-/dev/shm/ferry-bench-tcp-storage.dat}
runs=${RUNS:-5}
seconds=${SECONDS_PER_RUN:-3}
block=${BLOCK:-1m}
batch=${BATCH:-32}
ops=${OPS:-read write}
export FERRY_RPC_ADDRESS=127.0.0.1 FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$build/modules/.libs}
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }

hz=$(getconf CLK_TCK)
target_cpu() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null; }
# The target's CPU time every 20 ms into $2 while it lives: a loaded
# machine may run us only after the target exited, the last sample stays.
sample_cpu() { # pid file
    local c
    while c=$(target_cpu "$1") && [ -n "$c" ]; do
        echo "$c" >"$2.new" && mv "$2.new" "$2"
        sleep 0.02
    done
}

# prints "GB/s target-CPU-ms-per-GB"
tcp_run() { # op remote-memory staged(yes/no)
    local line target=0 c0=0 c1= result=
    coproc BENCH { FERRY_TRANSPORTS=tcp FERRY_TCP_STORAGE_STAGED=$3 exec "$bench" --spawn \
        --transport=tcp --remote-memory="$2" --buffer-size=64m --operation="$1" \
        --block-size="$block" --batch-size="$batch" --duration="$seconds" 2>&1; }
    local pid=$BENCH_PID
    while read -r line <&"${BENCH[0]}"; do
        case $line in
        FIRST*)
            target=$(pgrep -P "$pid" | head -1)
            c0=$(target_cpu "$target")
            sample_cpu "$target" "$tmp/cpu" &
            ;;
        RESULT*) c1=$(target_cpu "$target"); result=$line ;;
        esac
    done
    wait "$pid" || true
    wait
    [ -n "$c1" ] || c1=$(cat "$tmp/cpu")
    echo "$result" | sed -n 's/.* bytes=\([0-9]*\) gbps=\([0-9.]*\).*/\1 \2/p' |
        awk -v c0="$c0" -v c1="$c1" -v hz="$hz" \
            '{printf "%s %.0f\n", $2, (c1 - c0) * 1000 / hz / ($1 / 1e9)}'
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; rm -f "$file"' EXIT
# label | remote memory | staged
cases="memory|ferry|no
storage|file:$file|no
staged|file:$file|yes"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $block requests, batch $batch," \
    "${seconds}s per run, file $file"
for run in $(seq "$runs"); do
    for op in $ops; do
        echo "$cases" | while IFS='|' read -r label memory staged; do
            read -r g c <<<"$(tcp_run "$op" "$memory" "$staged")"
            echo "$g" >>"$tmp/$op.$label"
            echo "$c" >>"$tmp/$op.$label.cpu"
            printf 'run %s %-5s %-8s %8s GB/s %6s target-CPU-ms/GB   load %s\n' "$run" "$op" \
                "$label" "$g" "$c" "$(cut -d' ' -f1 /proc/loadavg)"
        done
    done
done
echo "medians of $runs runs (load average after: $(cut -d' ' -f1-3 /proc/loadavg)):"
for op in $ops; do
    m=$(median <"$tmp/$op.memory")
    s=$(median <"$tmp/$op.storage")
    b=$(median <"$tmp/$op.staged")
    printf 'tcp %s %s: memory %s, storage %s (mapped), staged %s GB/s;' "$block" "$op" \
        "$m" "$s" "$b"
    awk -v s="$s" -v b="$b" -v m="$m" \
        'BEGIN {printf " storage/memory %.2f, staged/memory %.2f\n", s / m, b / m}'
    printf '    target CPU ms per GB: memory %s, storage %s, staged %s\n' \
        "$(median <"$tmp/$op.memory.cpu")" "$(median <"$tmp/$op.storage.cpu")" \
        "$(median <"$tmp/$op.staged.cpu")"
done
