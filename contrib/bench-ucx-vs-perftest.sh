#!/bin/sh
# Compare ferry_bench over the ucx transport with ucx_perftest (package
# ucx-utils) in one run on this host: same UCX_TLS, peer error handling on
# both sides, one initiator thread, one buffer of the message size on each
# side.  Prints each run, the medians of $RUNS runs, and the median of the
# runs' own ratios (each run's ferry and perftest ran back to back).
#
# Usage: contrib/bench-ucx-vs-perftest.sh [BUILD_DIR]   (default: the source tree)
# Environment: RUNS (5), SECONDS_PER_RUN (3), TLS_LIST ("sm,self tcp"),
#              SIZES ("64k 1m 4m"), MEMORY (ferry_bench --memory, "ferry")
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
runs=${RUNS:-5}
seconds=${SECONDS_PER_RUN:-3}
tls_list=${TLS_LIST:-"sm,self tcp"}
sizes=${SIZES:-"64k 1m 4m"}
memory=${MEMORY:-ferry}
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$build/modules/.libs}
# ucx_perftest needs this for shared memory under peer error handling; the
# plugin sets it by itself, so both sides run the same way.
export UCX_MM_ERROR_HANDLING=y
command -v ucx_perftest >/dev/null || { echo "ucx_perftest is not installed (ucx-utils)" >&2; exit 1; }
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }

bytes_of() { # 64k -> 65536
    case $1 in
    *k) echo $((${1%k} * 1024)) ;;
    *m) echo $((${1%m} * 1048576)) ;;
    *) echo "$1" ;;
    esac
}

# About SECONDS_PER_RUN of traffic: sm moves ~30 GB/s, tcp ~0.7 GB/s.
iterations() { # tls bytes
    case $1 in
    sm*) rate=30000000000 ;;
    *) rate=700000000 ;;
    esac
    n=$(awk -v r="$rate" -v s="$seconds" -v b="$2" 'BEGIN {printf "%d", r * s / b}')
    [ "$n" -lt 200 ] && n=200
    echo "$n"
}

# ucx_perftest: prints the "Final:" line's field N (1-based, after "Final:").
perftest_run() { # tls test size iterations field
    port=$(free_port)
    UCX_TLS=$1 ucx_perftest -p "$port" -e -t "$2" -s "$3" -n "$4" -w 1000 >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    UCX_TLS=$1 ucx_perftest -p "$port" -e -t "$2" -s "$3" -n "$4" -w 1000 127.0.0.1 2>/dev/null |
        awk -v f="$5" '/^Final:/ {print $(f + 1)}'
    wait "$server" 2>/dev/null || true
}

perftest_gbps() { # tls test size: overall bandwidth, MB/s (2^20) -> GB/s (10^9)
    b=$(bytes_of "$3")
    perftest_run "$1" "$2" "$b" "$(iterations "$1" "$b")" 6 |
        awk '{printf "%.4f\n", $1 * 1048576 / 1e9}'
}

ferry_gbps() { # tls op size batch
    UCX_TLS=$1 "$bench" --spawn --transport=ucx --memory="$memory" --operation="$2" \
        --block-size="$3" --buffer-size="$3" --batch-size="$4" --duration="$seconds" |
        sed -n 's/.* gbps=\([0-9.]*\).*/\1/p'
}

ferry_latency() { # tls
    UCX_TLS=$1 "$bench" --spawn --transport=ucx --memory="$memory" --latency --block-size=8 \
        --duration="$seconds" | sed -n 's/.* median_us=\([0-9.]*\).*/\1/p'
}

# Half a round trip of writes, each completed, as put_lat measures it.
ferry_pingpong() { # tls
    UCX_TLS=$1 "$bench" --spawn --transport=ucx --memory="$memory" --pingpong --block-size=8 \
        --duration="$seconds" | sed -n 's/^PINGPONG.* median_us=\([0-9.]*\).*/\1/p'
}

# ferry/perftest of one pair of numbers, > 1 where ferry is ahead.
ratio() { # ferry perftest higher_is_better
    awk -v f="$1" -v p="$2" -v h="$3" \
        'BEGIN {if (f > 0 && p > 0) printf "%.2f\n", h == 1 ? f / p : p / f}'
}

# The ratio of the medians, and the median of each run's ratio: the two
# programs of one run ran back to back, so a VM that changes speed for a
# while moves both, where the medians of each side can pair a fast run
# with a slow one.
report() { # label unit ferry_file perftest_file higher_is_better
    f=$(median < "$3"); p=$(median < "$4")
    by_run=$(paste "$3" "$4" | while read -r a b; do ratio "$a" "$b" "$5"; done | median)
    printf '%-34s ferry %9s %-5s perftest %9s %-5s ferry/perftest %s (run by run %s)\n' \
        "$1" "$f" "$2" "$p" "$2" "$(ratio "$f" "$p" "$5")" "$by_run"
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for tls in $tls_list; do
    t=$(echo "$tls" | tr ',' '_')
    for i in $(seq "$runs"); do
        line="UCX_TLS=$tls run $i:"
        for size in $sizes; do
            batch=$(batch_for "$size")
            ferry_gbps "$tls" write "$size" "$batch" >> "$tmp/$t-ferry-write-$size"
            perftest_gbps "$tls" ucp_put_bw "$size" >> "$tmp/$t-perftest-write-$size"
            ferry_gbps "$tls" read "$size" "$batch" >> "$tmp/$t-ferry-read-$size"
            perftest_gbps "$tls" ucp_get "$size" >> "$tmp/$t-perftest-read-$size"
            line="$line write $size $(tail -1 "$tmp/$t-ferry-write-$size")/$(tail -1 "$tmp/$t-perftest-write-$size")"
            line="$line read $size $(tail -1 "$tmp/$t-ferry-read-$size")/$(tail -1 "$tmp/$t-perftest-read-$size")"
        done
        ferry_latency "$tls" >> "$tmp/$t-ferry-lat"
        ferry_pingpong "$tls" >> "$tmp/$t-ferry-pingpong"
        perftest_run "$tls" ucp_put_lat 8 "$(iterations "$tls" 80000)" 2 >> "$tmp/$t-perftest-lat"
        echo "$line; 8 B write $(tail -1 "$tmp/$t-ferry-lat"), pingpong $(tail -1 "$tmp/$t-ferry-pingpong")/$(tail -1 "$tmp/$t-perftest-lat") us (ferry/perftest GB/s, us)"
    done
done
echo "medians of $runs runs (GB/s = 10^9 bytes/s; latency: ucx_perftest ucp_put_lat's typical"
echo "value (half a ping-pong of puts) against ferry_bench --pingpong (half a ping-pong of"
echo "completed writes) and against --latency (one write, submit to completion, which waits"
echo "for the target's acknowledgement: a full round trip); ratio > 1 is ferry ahead; run by"
echo "run: the median of each run's ratio):"
for tls in $tls_list; do
    t=$(echo "$tls" | tr ',' '_')
    for size in $sizes; do
        report "UCX_TLS=$tls write $size" GB/s "$tmp/$t-ferry-write-$size" \
            "$tmp/$t-perftest-write-$size" 1
        report "UCX_TLS=$tls read $size" GB/s "$tmp/$t-ferry-read-$size" \
            "$tmp/$t-perftest-read-$size" 1
    done
    report "UCX_TLS=$tls 8 B pingpong" us "$tmp/$t-ferry-pingpong" "$tmp/$t-perftest-lat" 0
    report "UCX_TLS=$tls 8 B write latency" us "$tmp/$t-ferry-lat" "$tmp/$t-perftest-lat" 0
done
