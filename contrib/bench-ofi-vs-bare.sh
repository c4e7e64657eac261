#!/bin/sh
# The ofi transport against a bare libfabric RMA loop (contrib/bench-ofi-rma.c,
# built as BUILD_DIR/bench-ofi-rma when configure finds libfabric), with the
# same provider, completion level (delivery-complete writes), window and
# batches, in one run; and against Ferry's own transport for the same path
# (tcp for tcp;ofi_rxm, shm for shm): issue 20's "where ofi stands".
#
# Contenders, each measurement run back to back, their order turned round
# every run (so a machine that drifts does not favour one):
#   ofi     ferry_bench --transport=ofi with FERRY_OFI_PROVIDER, defaults
#   ofi2    the same with OFI2_ENV set (default FERRY_OFI_PROGRESS=poll: the
#           progress thread never sleeps); OFI2_ENV="" leaves it out
#   ofi3    the same with OFI3_ENV set (default: left out); e.g. OFI2_ENV=
#           "FERRY_MODULE_DIR=<another build's modules/.libs>" for the module
#           before a change, OFI3_ENV="FERRY_OFI_FD_SPIN=1000" for a setting
#   bare    bench-ofi-rma, the best of BARE_IDLE runs ("spin yield": both
#           sides poll their CQ, spinning or yielding the core when it is
#           empty; which wins depends on how busy the machine is)
#   native  ferry_bench --transport=tcp or shm
# Per provider and run: for each size, write then read (GB/s of --batch-size
# blocks, bench-lib.sh's batch_for, each batch waited for whole); then the
# 8 B write latency (one at a time, post or submit to completion, median of
# 32-write means: ferry_bench --latency and bench-ofi-rma --latency measure
# the same thing).  Prints each run, then the medians of RUNS runs, the
# ratio of the medians and the median of each run's own ratio, against
# issue 20's targets (>= 0.9x the bare bandwidth, <= 1.2x its latency).
#
# Usage: contrib/bench-ofi-vs-bare.sh BUILD_DIR [RUNS]     (RUNS: 5)
# Environment: SECONDS_PER_RUN (2), PROVIDERS ("tcp;ofi_rxm shm"),
#   SIZES ("64k 1m 4m"; "" for the latencies alone), WINDOW (the ofi transport's default window, read
#   from ferry_info -c; else 64), OFI2_ENV, OFI3_ENV, BARE_IDLE, BARE_OPTIONS (more
#   bench-ofi-rma options, e.g. "--threading=safe", to see what one change
#   costs the bare loop).
# The tcp cells depend on the host's TCP congestion control, which the
# header prints (net.ipv4.tcp_congestion_control; compare under the same).
set -eu
. "$(dirname "$0")/bench-lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [RUNS]" >&2; exit 2; }
build=$(cd "$1" && pwd)
runs=${2:-5}
seconds=${SECONDS_PER_RUN:-2}
providers=${PROVIDERS:-"tcp;ofi_rxm shm"}
sizes=${SIZES-"64k 1m 4m"} # SIZES="": the latencies only
ofi2_env=${OFI2_ENV-FERRY_OFI_PROGRESS=poll}
ofi3_env=${OFI3_ENV-}
bare_idle=${BARE_IDLE:-"spin yield"}
bare_options=${BARE_OPTIONS:-}
bench=$build/ferry_bench
bare=$build/bench-ofi-rma
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_MODULE_DIR="${FERRY_MODULE_DIR:-$build/modules/.libs}"
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }
if [ ! -x "$bare" ]; then
    echo "no bench-ofi-rma in $build (built when configure finds libfabric)" >&2
    exit 1
fi
if [ ! -e "$FERRY_MODULE_DIR/ferry_ofi.so" ]; then
    echo "note: no ferry_ofi module in $FERRY_MODULE_DIR: the ofi columns stay empty" >&2
fi
contenders=ofi
[ -n "$ofi2_env" ] && contenders="$contenders ofi2"
[ -n "$ofi3_env" ] && contenders="$contenders ofi3"
contenders="$contenders bare native"

# A default from ferry_info -c ("FERRY_OFI_WINDOW=64").
ofi_default() { # NAME
    "$build/ferry_info" -c 2>/dev/null | sed -n "s/^FERRY_OFI_$1=\([0-9a-z]*\).*/\1/p" | head -1
}
window=${WINDOW:-$(ofi_default WINDOW)}
if [ -z "$window" ]; then
    window=64
    echo "note: ferry_info -c lists no FERRY_OFI_WINDOW: the bare loop keeps 64 in flight" >&2
fi

native_for() { # provider -> Ferry's own transport on the same path
    case $1 in
    tcp*) echo tcp ;;
    shm) echo shm ;;
    *) echo none ;;
    esac
}

# The number on stdin, or NA when the program failed or printed none.
number_or_na() { read -r v || true; case ${v:-} in [0-9]*) echo "$v" ;; *) echo NA ;; esac; }

# ferry_bench, one measurement: GB/s of op (write, read) or the latency.
ferry_run() { # transport provider op size batch
    if [ "$3" = latency ]; then
        FERRY_OFI_PROVIDER=$2 "$bench" --spawn --transport="$1" --latency --block-size=8 \
            --duration="$seconds" 2>>"$tmp/stderr" |
            sed -n 's/^LATENCY.* median_us=\([0-9.]*\).*/\1/p' | number_or_na
    else
        FERRY_OFI_PROVIDER=$2 "$bench" --spawn --transport="$1" --operation="$3" \
            --block-size="$4" --batch-size="$5" --duration="$seconds" 2>>"$tmp/stderr" |
            sed -n 's/^RESULT.* gbps=\([0-9.]*\).*/\1/p' | number_or_na
    fi
}

# bench-ofi-rma, the best of its BARE_IDLE modes.
bare_run() { # provider op size batch
    best=NA
    for idle in $bare_idle; do
        if [ "$2" = latency ]; then
            # shellcheck disable=SC2086 # BARE_OPTIONS is a list of options
            v=$("$bare" --provider="$1" --latency --block-size=8 --duration="$seconds" \
                --idle="$idle" $bare_options 2>>"$tmp/stderr" |
                sed -n 's/^LATENCY.* median_us=\([0-9.]*\).*/\1/p' | number_or_na)
            better=0
        else
            # shellcheck disable=SC2086
            v=$("$bare" --provider="$1" --operation="$2" --block-size="$3" --batch-size="$4" \
                --window="$window" --duration="$seconds" --idle="$idle" $bare_options \
                2>>"$tmp/stderr" | sed -n 's/^RESULT.* gbps=\([0-9.]*\).*/\1/p' | number_or_na)
            better=1
        fi
        best=$(awk -v a="$best" -v b="$v" -v h="$better" 'BEGIN {
            if (a == "NA") print b; else if (b == "NA") print a;
            else if (h ? b + 0 > a + 0 : b + 0 < a + 0) print b; else print a }')
    done
    echo "$best"
}

# One contender's measurement.
measure() { # who provider op size batch
    case $1 in
    ofi) ferry_run ofi "$2" "$3" "$4" "$5" ;;
    ofi2) # shellcheck disable=SC2086,SC2163 # OFI2_ENV: NAME=VALUE words, exported
        (export $ofi2_env; ferry_run ofi "$2" "$3" "$4" "$5") ;;
    ofi3) # shellcheck disable=SC2086,SC2163 # OFI3_ENV: the same
        (export $ofi3_env; ferry_run ofi "$2" "$3" "$4" "$5") ;;
    bare) bare_run "$2" "$3" "$4" "$5" ;;
    native)
        native=$(native_for "$2")
        if [ "$native" = none ]; then echo NA; else ferry_run "$native" "$2" "$3" "$4" "$5"; fi ;;
    esac
}

# The contenders of one measurement, in an order that turns round with the run.
measure_all() { # run key provider op size batch
    order=$contenders
    [ $(($1 % 2)) -eq 0 ] &&
        order=$(echo "$contenders" | awk '{for (i = NF; i > 0; i--) printf "%s ", $i}')
    for who in $order; do
        measure "$who" "$3" "$4" "$5" "$6" >> "$tmp/$2-$who"
    done
}

# The median of a file's numbers (NA left out), or "-".
med() {
    if grep -qE '^[0-9.]+$' "$1"; then
        grep -E '^[0-9.]+$' "$1" | median | awk '{printf "%.3f\n", $1}'
    else
        echo -
    fi
}

# a/b, or "-" when either is missing.
ratio() {
    awk -v a="$1" -v b="$2" \
        'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f\n", a / b; else print "-"}'
}

# The median of each run's own ratio a/b (the two ran back to back).
ratio_by_run() { # file_a file_b
    paste "$1" "$2" | while read -r x y; do ratio "$x" "$y"; done | grep -v '^-$' > "$tmp/ratios" ||
        true
    if [ -s "$tmp/ratios" ]; then printf '%.2f\n' "$(median < "$tmp/ratios")"; else echo -; fi
}

# "ok" / "MISS" against a target, or "-".
verdict() { # value target higher_is_better
    awk -v v="$1" -v t="$2" -v h="$3" \
        'BEGIN {if (v == "-") print "-"
                else if (h ? v + 0 >= t : v + 0 <= t) print "ok"; else print "MISS"}'
}

# The last value of each contender of a key, "a/b/c".
last_values() { # key
    out=""
    for who in $contenders; do out="$out${out:+/}$(tail -1 "$tmp/$1-$who")"; done
    echo "$out"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/stderr"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); window $window; $seconds s per" \
    "measurement; $runs runs; ofi2: ${ofi2_env:-none}; ofi3: ${ofi3_env:-none};" \
    "bare: best of --idle=$bare_idle" \
    "${bare_options:+($bare_options)}"
# Loopback TCP under bbr is bound by its congestion window, not the CPU: the
# bare loop's 64 KiB write over tcp;ofi_rxm then lands at 1.4-5.5 GB/s run
# by run, all of them 5+ under cubic (doc/performance.md, "ofi, ninth round").
congestion=$(cat /proc/sys/net/ipv4/tcp_congestion_control 2>/dev/null || echo unknown)
case $providers in
*tcp*)
    echo "TCP congestion control: $congestion"
    if [ "$congestion" = bbr ]; then
        echo "note: bbr on loopback caps the tcp cells by its window, and the bare loop's" \
            "own numbers spread 3x run by run; cubic (Debian's default) does not"
    fi
    ;;
esac
for provider in $providers; do
    p=$(echo "$provider" | tr -c 'a-z0-9\n' '_')
    for i in $(seq "$runs"); do
        line="$provider run $i:"
        for size in $sizes; do
            batch=$(batch_for "$size")
            for op in write read; do
                measure_all "$i" "$p-$op-$size" "$provider" "$op" "$size" "$batch"
                line="$line $op $size $(last_values "$p-$op-$size")"
            done
        done
        measure_all "$i" "$p-lat" "$provider" latency 8 1
        echo "$line; 8 B $(last_values "$p-lat") us ($(echo "$contenders" | tr ' ' '/'))"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "medians of $runs runs (GB/s = 10^9 B/s; latency in us); x/bare: ratio of the medians"
echo "(by run: median of each run's ratio); targets: bandwidth >= 0.9x, latency <= 1.2x"
header="%-24s %7s %7s %7s %7s %7s  %-16s %-5s %-16s %-16s %-16s\n"
# shellcheck disable=SC2059 # the format is ours
printf "$header" "" ofi ofi2 ofi3 bare native "ofi/bare (run)" "" "ofi2/bare (run)" \
    "ofi3/bare (run)" "ofi/native (run)"
# The median of another contender and its ratios to bare, or "-".
other() { # key who -> sets ov, orat
    ov=-; orat="-"
    if [ -e "$1-$2" ]; then
        ov=$(med "$1-$2"); orat="$(ratio "$ov" "$b") ($(ratio_by_run "$1-$2" "$1-bare"))"
    fi
}
row() { # label key higher_is_better target
    k=$tmp/$2
    o=$(med "$k-ofi"); b=$(med "$k-bare"); n=$(med "$k-native")
    other "$k" ofi2; o2=$ov; r2=$orat
    other "$k" ofi3; o3=$ov; r3=$orat
    r=$(ratio "$o" "$b")
    # shellcheck disable=SC2059 # the format is ours
    printf "$header" "$1" "$o" "$o2" "$o3" "$b" "$n" "$r ($(ratio_by_run "$k-ofi" "$k-bare"))" \
        "$(verdict "$r" "$4" "$3")" "$r2" "$r3" \
        "$(ratio "$o" "$n") ($(ratio_by_run "$k-ofi" "$k-native"))"
}
for provider in $providers; do
    p=$(echo "$provider" | tr -c 'a-z0-9\n' '_')
    for size in $sizes; do
        for op in write read; do
            row "$provider $op $size" "$p-$op-$size" 1 0.9
        done
    done
    row "$provider 8 B lat (us)" "$p-lat" 0 1.2
done
echo "(native: Ferry's own transport on the same path:" \
    "$(for p in $providers; do printf '%s ' "$p -> $(native_for "$p")"; done))"
if [ -s "$tmp/stderr" ]; then
    echo
    echo "stderr of the runs (the 20 most frequent lines):"
    # without the log's timestamps and process ids, so that repeats count
    sed -E 's/^\[[0-9.]+\] //; s/\[[0-9]+\]//' "$tmp/stderr" | sort | uniq -c | sort -rn |
        head -20
fi
