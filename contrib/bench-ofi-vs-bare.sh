#!/bin/sh
# The ofi transport against a bare libfabric RMA loop (contrib/bench-ofi-rma.c,
# built as BUILD_DIR/bench-ofi-rma when configure finds libfabric), with the
# same provider, completion level (delivery-complete writes), window and
# batches, in one run; and against Ferry's own transport for the same path
# (tcp for tcp;ofi_rxm, shm for shm): issue 20's "where ofi stands".
#
# Per provider and run: for each size, write then read, the three programs
# back to back (their order turns round every run, so a machine that drifts
# does not always favour the same one); then the 8 B latency of each (one
# write at a time, post or submit to completion, median of 32-write means:
# ferry_bench --latency and bench-ofi-rma --latency measure the same thing).
# Prints each run, then medians of RUNS runs, the ratio of the medians and
# the median of each run's own ratio, against issue 20's targets (>= 0.9x
# the bare bandwidth, <= 1.2x its latency).
#
# Usage: contrib/bench-ofi-vs-bare.sh BUILD_DIR [RUNS]     (RUNS: 5)
# Environment: SECONDS_PER_RUN (3), PROVIDERS ("tcp;ofi_rxm shm"),
#   SIZES ("64k 1m 4m"), WINDOW (the ofi transport's default window, read
#   from ferry_info -c; else 64), BARE_OPTIONS (more bench-ofi-rma options,
#   e.g. "--threading=safe" or "--slice-size=1m", to see what one change
#   costs the bare loop).  Batches per size: bench-lib.sh's batch_for.
set -eu
. "$(dirname "$0")/bench-lib.sh"
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR [RUNS]" >&2; exit 2; }
build=$(cd "$1" && pwd)
runs=${2:-5}
seconds=${SECONDS_PER_RUN:-3}
providers=${PROVIDERS:-"tcp;ofi_rxm shm"}
sizes=${SIZES:-"64k 1m 4m"}
bare_options=${BARE_OPTIONS:-}
bench=$build/ferry_bench
bare=$build/bench-ofi-rma
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$build/modules/.libs}
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }
[ -x "$bare" ] || { echo "no bench-ofi-rma in $build (built when configure finds libfabric)" >&2; exit 1; }
if [ ! -e "$FERRY_MODULE_DIR/ferry_ofi.so" ]; then
    echo "note: no ferry_ofi module in $FERRY_MODULE_DIR: the ofi column stays empty" >&2
fi

# A default from ferry_info -c ("FERRY_OFI_WINDOW=64   # ..." or "...=64").
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

# Each prints one number, or NA when the program failed or printed none.
number_or_na() { read -r v || true; case ${v:-} in [0-9]*) echo "$v" ;; *) echo NA ;; esac; }

ferry_gbps() { # transport provider op size batch
    FERRY_OFI_PROVIDER=$2 "$bench" --spawn --transport="$1" --operation="$3" --block-size="$4" \
        --batch-size="$5" --duration="$seconds" 2>>"$tmp/stderr" |
        sed -n 's/^RESULT.* gbps=\([0-9.]*\).*/\1/p' | number_or_na
}

bare_gbps() { # provider op size batch
    # shellcheck disable=SC2086 # BARE_OPTIONS is a list of options
    "$bare" --provider="$1" --operation="$2" --block-size="$3" --batch-size="$4" \
        --window="$window" --duration="$seconds" $bare_options 2>>"$tmp/stderr" |
        sed -n 's/^RESULT.* gbps=\([0-9.]*\).*/\1/p' | number_or_na
}

ferry_latency() { # transport provider
    FERRY_OFI_PROVIDER=$2 "$bench" --spawn --transport="$1" --latency --block-size=8 \
        --duration="$seconds" 2>>"$tmp/stderr" |
        sed -n 's/^LATENCY.* median_us=\([0-9.]*\).*/\1/p' | number_or_na
}

bare_latency() { # provider
    # shellcheck disable=SC2086
    "$bare" --provider="$1" --latency --block-size=8 --duration="$seconds" $bare_options \
        2>>"$tmp/stderr" | sed -n 's/^LATENCY.* median_us=\([0-9.]*\).*/\1/p' | number_or_na
}

# The median of a file's numbers (NA left out), or "-".
med() {
    if grep -qE '^[0-9.]+$' "$1"; then grep -E '^[0-9.]+$' "$1" | median; else echo -; fi
}

# a/b, or "-" when either is missing.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (a + 0 > 0 && b + 0 > 0) printf "%.2f\n", a / b; else print "-"}'; }

# The median of each run's own ratio a/b (the two ran back to back).
ratio_by_run() { # file_a file_b
    paste "$1" "$2" | while read -r a b; do ratio "$a" "$b"; done | grep -v '^-$' > "$tmp/ratios" ||
        true
    if [ -s "$tmp/ratios" ]; then printf '%.2f\n' "$(median < "$tmp/ratios")"; else echo -; fi
}

# "ok" / "MISS" against a target, or "-".
verdict() { # value target higher_is_better
    awk -v v="$1" -v t="$2" -v h="$3" \
        'BEGIN {if (v == "-") print "-"; else if (h ? v + 0 >= t : v + 0 <= t) print "ok"; else print "MISS"}'
}

# The three programs of one measurement, in an order that turns round with
# the run: name files, command per name given as functions run_ofi/run_bare/
# run_native set by the caller.
three() { # run key
    if [ $(($1 % 2)) -eq 1 ]; then order="ofi bare native"; else order="native bare ofi"; fi
    for who in $order; do
        "run_$who" >> "$tmp/$2-$who"
    done
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
: > "$tmp/stderr"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); window $window; $seconds s per" \
    "measurement; $runs runs"
for provider in $providers; do
    p=$(echo "$provider" | tr -c 'a-z0-9\n' '_')
    native=$(native_for "$provider")
    for i in $(seq "$runs"); do
        line="$provider run $i:"
        for size in $sizes; do
            batch=$(batch_for "$size")
            for op in write read; do
                run_ofi() { ferry_gbps ofi "$provider" "$op" "$size" "$batch"; }
                run_bare() { bare_gbps "$provider" "$op" "$size" "$batch"; }
                run_native() {
                    if [ "$native" = none ]; then echo NA; else
                        ferry_gbps "$native" "$provider" "$op" "$size" "$batch"; fi
                }
                three "$i" "$p-$op-$size"
                line="$line $op $size $(tail -1 "$tmp/$p-$op-$size-ofi")/$(tail -1 \
                    "$tmp/$p-$op-$size-bare")/$(tail -1 "$tmp/$p-$op-$size-native")"
            done
        done
        run_ofi() { ferry_latency ofi "$provider"; }
        run_bare() { bare_latency "$provider"; }
        run_native() { if [ "$native" = none ]; then echo NA; else ferry_latency "$native" "$provider"; fi; }
        three "$i" "$p-lat"
        echo "$line; 8 B $(tail -1 "$tmp/$p-lat-ofi")/$(tail -1 "$tmp/$p-lat-bare")/$(tail -1 \
            "$tmp/$p-lat-native") us (ofi/bare/$native, GB/s and us)"
    done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "medians of $runs runs (GB/s = 10^9 B/s; latency in us); ofi/bare: ratio of the medians"
echo "(run by run: median of each run's ratio); targets: bandwidth >= 0.9x, latency <= 1.2x"
printf '%-26s %8s %8s %8s  %-18s %-6s %-18s\n' "" ofi bare native "ofi/bare (by run)" target \
    "ofi/native (by run)"
for provider in $providers; do
    p=$(echo "$provider" | tr -c 'a-z0-9\n' '_')
    native=$(native_for "$provider")
    for size in $sizes; do
        for op in write read; do
            k=$tmp/$p-$op-$size
            o=$(med "$k-ofi"); b=$(med "$k-bare"); n=$(med "$k-native")
            r=$(ratio "$o" "$b")
            printf '%-26s %8s %8s %8s  %-18s %-6s %-18s\n' "$provider $op $size" "$o" "$b" "$n" \
                "$r ($(ratio_by_run "$k-ofi" "$k-bare"))" "$(verdict "$r" 0.9 1)" \
                "$(ratio "$o" "$n") ($(ratio_by_run "$k-ofi" "$k-native"))"
        done
    done
    k=$tmp/$p-lat
    o=$(med "$k-ofi"); b=$(med "$k-bare"); n=$(med "$k-native")
    r=$(ratio "$o" "$b")
    printf '%-26s %8s %8s %8s  %-18s %-6s %-18s\n' "$provider 8 B latency" "$o" "$b" "$n" \
        "$r ($(ratio_by_run "$k-ofi" "$k-bare"))" "$(verdict "$r" 1.2 0)" \
        "$(ratio "$o" "$n") ($(ratio_by_run "$k-ofi" "$k-native"))"
done
echo "(native: Ferry's own $(for p in $providers; do printf '%s ' "$(native_for "$p")"; done)transport" \
    "for the same path, same ferry_bench options)"
if [ -s "$tmp/stderr" ]; then
    echo
    echo "stderr of the runs (first 20 distinct lines):"
    # without the log's timestamps and process ids, so that repeats count
    sed -E 's/^\[[0-9.]+\] //; s/\[[0-9]+\]//' "$tmp/stderr" | sort | uniq -c | sort -rn |
        head -20
fi
