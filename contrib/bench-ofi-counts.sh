#!/bin/sh
# System calls, context switches and thread wakeups per operation of the ofi
# transport against the bare libfabric loop (contrib/bench-ofi-rma.c), both
# processes of each counted (perf stat follows the spawned target and the
# forked one).  These counts move far less with the machine's load than the
# speeds do (issue 20, doc/performance.md "ofi, fourth round"), so they tell
# whether a gap in contrib/bench-ofi-vs-bare.sh is the code's or the noise's.
#
# Usage: contrib/bench-ofi-counts.sh BUILD_DIR [RUNS]          (RUNS: 3)
# Environment: PROVIDER ("tcp;ofi_rxm"), OP (read), SIZE (64k), BATCH (from
#   bench-lib.sh's batch_for), SECONDS_PER_RUN (1), WINDOW (64),
#   OFI2_ENV (a second ofi contender, e.g. "FERRY_MODULE_DIR=<another
#   build's modules/.libs>"; empty: none), OFI3_ENV (a third, e.g. a
#   setting: "FERRY_WAIT_SPIN=0"), BARE_IDLE (spin), SETUP_SECONDS
#   (0.2, below).
# Prints per run and contender: GB/s, operations, and per operation the
# system calls, context switches and sched_wakeup events (perf stat's
# raw_syscalls:sys_enter, context-switches, sched:sched_wakeup), then the
# medians.  Setup is not counted: each contender also runs for
# SETUP_SECONDS (0.2; 0: count everything, as before session 17) and the
# per-operation figures are the differences of the two runs' counts over
# the difference of their operations.  ferry_bench's setup (two engines,
# their registrations, a spawned peer: ~1,900 context switches, mostly 1 ms
# sleeps of the two main threads) was 0.1 of the 0.15 context switches per
# 64 KiB read that session 16 counted over tcp;ofi_rxm.  Needs perf with access to those tracepoints (root, or
# kernel.perf_event_paranoid <= -1).
set -eu
. "$(dirname "$0")/bench-lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [RUNS]" >&2; exit 2; }
build=$(cd "$1" && pwd)
runs=${2:-3}
provider=${PROVIDER:-"tcp;ofi_rxm"}
op=${OP:-read}
size=${SIZE:-64k}
batch=${BATCH:-$(batch_for "$size")}
seconds=${SECONDS_PER_RUN:-1}
window=${WINDOW:-64}
ofi2_env=${OFI2_ENV:-}
ofi3_env=${OFI3_ENV:-}
bare_idle=${BARE_IDLE:-spin}
setup_seconds=${SETUP_SECONDS:-0.2}
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_MODULE_DIR="${FERRY_MODULE_DIR:-$build/modules/.libs}"
command -v perf > /dev/null || { echo "no perf" >&2; exit 1; }
contenders=ofi
[ -n "$ofi2_env" ] && contenders="$contenders ofi2"
[ -n "$ofi3_env" ] && contenders="$contenders ofi3"
contenders="$contenders bare"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One run of a contender under perf stat, for a duration: "gbps bytes
# syscalls switches wakeups".
count_run() { # who seconds
    duration=$2
    case $1 in
    bare)
        set -- "$build/bench-ofi-rma" --provider="$provider" --operation="$op" \
            --block-size="$size" --batch-size="$batch" --window="$window" \
            --duration="$duration" --idle="$bare_idle" ;;
    *)
        set -- "$build/ferry_bench" --spawn --transport=ofi --operation="$op" \
            --block-size="$size" --batch-size="$batch" --duration="$duration" ;;
    esac
    FERRY_OFI_PROVIDER=$provider perf stat -x, -o "$tmp/stat" \
        -e raw_syscalls:sys_enter,context-switches,sched:sched_wakeup "$@" \
        > "$tmp/out" 2>> "$tmp/stderr" || true
    awk -F, '
        BEGIN { gbps = "NA"; moved = 0 }
        FILENAME ~ /out$/ && /^RESULT/ {
            n = split($0, f, " ")
            for (i = 1; i <= n; i++) {
                split(f[i], kv, "=")
                if (kv[1] == "gbps") gbps = kv[2]
                if (kv[1] == "bytes") moved = kv[2]
            }
        }
        FILENAME ~ /stat$/ && $3 ~ /sys_enter/ { sc = $1 }
        FILENAME ~ /stat$/ && $3 ~ /context-switches/ { cs = $1 }
        FILENAME ~ /stat$/ && $3 ~ /sched_wakeup/ { wu = $1 }
        END { printf "%s %s %d %d %d\n", gbps, moved, sc, cs, wu }' "$tmp/out" "$tmp/stat"
}

# One contender: "gbps ops syscalls/op switches/op wakeups/op", setup left
# out (the short run's counts taken from the long one's).
count() { # who
    long=$(count_run "$1" "$seconds")
    short="NA 0 0 0 0"
    [ "$setup_seconds" != 0 ] && short=$(count_run "$1" "$setup_seconds")
    echo "$long $short" | awk -v size="$size" '
        function bytes(s) { m = 1; if (s ~ /k$/) m = 1024; if (s ~ /m$/) m = 1048576
                            return (s + 0) * m }
        {
            ops = ($2 - $7) / bytes(size)
            if ($1 == "NA" || $2 <= 0 || ops <= 0) { print "NA NA NA NA NA"; exit }
            printf "%s %d %.2f %.3f %.3f\n", $1, ops, ($3 - $8) / ops, ($4 - $9) / ops,
                ($5 - $10) / ops
        }'
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $provider $op $size," \
    "batch $batch, window $window, $seconds s a run less one of $setup_seconds s;" \
    "ofi2: ${ofi2_env:-none}; ofi3: ${ofi3_env:-none}"
printf "%-6s %-5s %8s %9s %10s %10s %10s\n" run who GB/s ops syscalls/op switches/op \
    wakeups/op
for i in $(seq "$runs"); do
    order=$contenders
    [ $((i % 2)) -eq 0 ] &&
        order=$(echo "$contenders" | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
    for who in $order; do
        case $who in
        ofi2) # shellcheck disable=SC2086,SC2163 # OFI2_ENV: NAME=VALUE words, exported
            line=$(export $ofi2_env; count ofi) ;;
        ofi3) # shellcheck disable=SC2086,SC2163 # OFI3_ENV: the same
            line=$(export $ofi3_env; count ofi) ;;
        *) line=$(count "$who") ;;
        esac
        echo "$line" >> "$tmp/$who"
        # shellcheck disable=SC2086 # the fields of line
        printf "%-6s %-5s %8s %9s %10s %10s %10s\n" "$i" "$who" $line
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "medians of $runs runs:"
for who in $contenders; do
    printf "%-12s" "$who"
    for column in 1 2 3 4 5; do
        v=$(awk -v c="$column" '$c ~ /^[0-9.]+$/ {print $c}' "$tmp/$who" | median)
        printf " %10s" "${v:--}"
    done
    echo
done
if [ -s "$tmp/stderr" ] && grep -qiv "bench-ofi-rma:" "$tmp/stderr"; then
    echo "stderr (first lines):"
    grep -iv "bench-ofi-rma:" "$tmp/stderr" | head -5
fi
