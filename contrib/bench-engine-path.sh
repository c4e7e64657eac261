#!/bin/sh
# The engine's per-request path, before and after: the 8 B write latency
# (ferry_bench --spawn --latency: one request per batch, submit then wait)
# of two builds of Ferry, measured alternately, per transport, and the
# medians (doc/performance.md, "The engine's per-request path").  The
# engine is libferry: the base build's contender runs this build's
# ferry_bench with the base's libferry preloaded and its modules, so only
# the library and its modules differ.
#
# Usage: contrib/bench-engine-path.sh BUILD_DIR BASE_BUILD_DIR [ROUNDS]   (ROUNDS: 7)
# Environment: SECONDS_PER_RUN (1), TRANSPORTS ("ofi shm": ofi runs over
#   FERRY_OFI_PROVIDER, default shm; shm is Ferry's own), EXTRA_ENV (a third
#   contender: this build with these NAME=VALUE words set, e.g.
#   "FERRY_STATS=no"; empty: none).
# Prints each round (us), then per transport the medians (of all runs, and of
# the runs outside the occasional slow mode) and their ratios.
set -eu
. "$(dirname "$0")/bench-lib.sh"
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR BASE_BUILD_DIR [ROUNDS]" >&2; exit 2; }
build=$(cd "$1" && pwd)
base=$(cd "$2" && pwd)
rounds=${3:-7}
seconds=${SECONDS_PER_RUN:-1}
transports=${TRANSPORTS:-"ofi shm"}
extra_env=${EXTRA_ENV:-}
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_OFI_PROVIDER="${FERRY_OFI_PROVIDER:-shm}"
base_lib=$(ls "$base"/.libs/libferry.so.0 2>/dev/null || true)
[ -x "$build/ferry_bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }
[ -n "$base_lib" ] || { echo "no .libs/libferry.so.0 in $base" >&2; exit 1; }
contenders="new base"
[ -n "$extra_env" ] && contenders="$contenders extra"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

latency() { # who transport -> median us of one run, or NA
    case $1 in
    new) envs="FERRY_MODULE_DIR=$build/modules/.libs" ;;
    base) envs="LD_PRELOAD=$base_lib FERRY_MODULE_DIR=$base/modules/.libs" ;;
    extra) envs="FERRY_MODULE_DIR=$build/modules/.libs $extra_env" ;;
    esac
    # shellcheck disable=SC2086 # envs: NAME=VALUE words (paths without spaces)
    v=$(env $envs "$build/ferry_bench" --spawn --transport="$2" --latency --block-size=8 \
        --duration="$seconds" 2>>"$tmp/stderr" |
        sed -n 's/^LATENCY.* median_us=\([0-9.]*\).*/\1/p')
    case ${v:-} in [0-9]*) echo "$v" ;; *) echo NA ;; esac
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); $seconds s per run; $rounds rounds;" \
    "base: $base; extra: ${extra_env:-none}"
for transport in $transports; do
    for i in $(seq "$rounds"); do
        line="$transport round $i:"
        # Alternate the order each round, so a drifting machine favours no one.
        order=$contenders
        [ $((i % 2)) -eq 0 ] && order=$(echo "$contenders" | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
        for who in $order; do
            v=$(latency "$who" "$transport")
            echo "$v" >> "$tmp/$transport-$who"
            line="$line $who $v"
        done
        echo "$line"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
# A run lands now and then in a slow mode (~2 us on shm, any contender, the
# bare libfabric loop too: where the threads of the two processes fall on
# the cores), so besides the median of all runs: the median of each
# contender's fast runs (within 1.5x of its fastest) and how many there were.
summary() { # file -> "median fast-median k/n"
    grep -v NA "$1" | sort -g | awk '{v[NR] = $1}
        function med(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        END { if (NR == 0) { print "- - 0/0"; exit }
              k = 0; for (i = 1; i <= NR; i++) if (v[i] <= 1.5 * v[1]) f[++k] = v[i]
              printf "%s %s %d/%d\n", med(v, NR), med(f, k), k, NR }'
}
printf "%-10s %-26s %-26s %-26s %s\n" "8 B (us)" "new: all, fast (k/n)" "base" "extra" \
    "new/base: all, fast"
for transport in $transports; do
    # shellcheck disable=SC2046 # six words
    set -- $(summary "$tmp/$transport-new") $(summary "$tmp/$transport-base")
    n=$1 nf=$2 nk=$3 b=$4 bf=$5 bk=$6
    e="-"
    if [ -e "$tmp/$transport-extra" ]; then
        # shellcheck disable=SC2046 # three words
        set -- $(summary "$tmp/$transport-extra")
        e="$1, $2 ($3)"
    fi
    printf "%-10s %-26s %-26s %-26s %s\n" "$transport" "$n, $nf ($nk)" "$b, $bf ($bk)" "$e" \
        "$(awk -v n="$n" -v b="$b" -v nf="$nf" -v bf="$bf" \
            'BEGIN { if (b > 0 && bf > 0) printf "%.3f, %.3f", n / b, nf / bf; else print "-" }')"
done
if [ -s "$tmp/stderr" ]; then
    echo
    echo "stderr of the runs (the 10 most frequent lines):"
    sort "$tmp/stderr" | uniq -c | sort -rn | head -10
fi
