#!/bin/sh
# Descriptor costs (issue 19) through each metadata store, a build against
# a baseline in the same run: ferry_bench --metadata-ops of BUILD and
# BASE_BUILD, alternately, ROUNDS times, for p2p, redis, etcd and http
# (ferry_metad), with segments of 10 and N buffers.  Starts its own
# redis-server, etcd and ferry_metad on free loopback ports and stops them.
# Prints every RESULT line prefixed with the build's label, then per store,
# operation and build the median of the rounds' medians.
#
# Usage: contrib/bench-descriptors.sh BUILD [BASE_BUILD]
# Environment: N (default 100000), ROUNDS (3), ITERATIONS (20), STORES
# ("p2p redis etcd http"), FERRY_TRANSPORTS is set to tcp.
set -eu
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/contrib/bench-lib.sh"
new=$(cd "$1" && pwd)
base=${2:+$(cd "$2" && pwd)}
n=${N:-100000}
rounds=${ROUNDS:-3}
iterations=${ITERATIONS:-20}
stores=${STORES:-p2p redis etcd http}
export FERRY_TRANSPORTS=tcp
work=$(mktemp -d)
cleanup() {
    if [ -f "$work/pids" ]; then
        while read -r pid; do kill "$pid" 2>/dev/null || true; done <"$work/pids"
    fi
    sleep 1
    rm -rf "$work"
}
trap cleanup EXIT INT TERM

# Starts the store's server (its pid appended to $work/pids: this runs in a
# command substitution's subshell) and prints the URI.
uri_of() {
    case $1 in
    p2p) echo p2p ;;
    redis)
        port=$(free_port)
        redis-server --port "$port" --save '' --appendonly no >"$work/redis.log" 2>&1 &
        echo $! >>"$work/pids"
        sleep 1
        echo "redis://127.0.0.1:$port" ;;
    etcd)
        port=$(free_port)
        peer=$(free_port)
        # a 100,000-buffer descriptor is over etcd's default 1.5 MiB request bound
        etcd --data-dir "$work/etcd" --listen-client-urls "http://127.0.0.1:$port" \
            --advertise-client-urls "http://127.0.0.1:$port" \
            --listen-peer-urls "http://127.0.0.1:$peer" \
            --max-request-bytes 134217728 >"$work/etcd.log" 2>&1 &
        echo $! >>"$work/pids"
        sleep 2
        echo "etcd://127.0.0.1:$port" ;;
    http)
        port=$(free_port)
        "$new/ferry_metad" --listen="127.0.0.1:$port" >"$work/metad.log" 2>&1 &
        echo $! >>"$work/pids"
        sleep 1
        echo "http://127.0.0.1:$port/metadata" ;;
    esac
}

run_one() { # label build uri
    small=""
    "$2/ferry_bench" --metadata-ops --help | grep -q -- --small && small="--small=10"
    FERRY_MODULE_DIR="$2/modules/.libs" "$2/ferry_bench" --metadata-ops --metadata="$3" \
        --iterations="$iterations" --registrations="$n" $small 2>"$work/err" |
        sed -n "s/^RESULT /RESULT build=$1 /p" || { cat "$work/err" >&2; return 1; }
}

echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg), N=$n, rounds=$rounds"
for store in $stores; do
    uri=$(uri_of "$store")
    r=0
    while [ "$r" -lt "$rounds" ]; do
        run_one new "$new" "$uri" | tee -a "$work/results"
        [ -n "$base" ] && run_one base "$base" "$uri" | tee -a "$work/results"
        r=$((r + 1))
    done
done
echo "# load average: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# median over rounds of median_us: store op build"
awk '{for (i = 2; i <= NF; i++) {split($i, kv, "="); f[kv[1]] = kv[2]}
      v[f["store"] " " f["op"] " " f["build"]] = v[f["store"] " " f["op"] " " f["build"]] " " \
          f["median_us"]}
     END {for (k in v) print k, v[k]}' "$work/results" | sort |
    while read -r s o b rest; do
        m=$(echo "$rest" | tr ' ' '\n' | grep . | median)
        printf '%-6s %-16s %-5s %12s\n' "$s" "$o" "$b" "$m"
    done
