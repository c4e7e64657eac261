#!/bin/sh
# Many engines, all to all, through every metadata store (doc/scale.md):
# ferry_bench_scale at each engine count, each store's own request count
# read around the run.  Prints each run's summary and a markdown table.
#
# Usage: contrib/bench-scale.sh [BUILD_DIR]   (default: the source tree)
# Environment:
#   SIZES="64 256 512 1024"        engines in all
#   STORES="p2p redis etcd http pmix"
#   PROCESSES=16                   forked processes (engines per process: SIZE/PROCESSES)
#   PMIX_RANKS=32                  mpirun ranks for pmix (engines per rank: SIZE/PMIX_RANKS)
#   TRANSPORTS=                    FERRY_TRANSPORTS for every engine (e.g. tcp); empty: default
#   TIMEOUT=1800                   seconds one run may take before it is killed
# Servers (redis-server, etcd, ferry_metad) are started here on free
# loopback ports and stopped by PID; a store whose server or module is
# missing is skipped with a line saying so.
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench_scale
sizes=${SIZES:-64 256 512 1024}
stores=${STORES:-p2p redis etcd http pmix}
processes=${PROCESSES:-16}
pmix_ranks=${PMIX_RANKS:-32}
timeout_s=${TIMEOUT:-1800}
[ -x "$bench" ] || { echo "no ferry_bench_scale in $build" >&2; exit 1; }
export FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$build/modules/.libs}
export FERRY_RPC_ADDRESS=127.0.0.1
export FERRY_LOG_LEVEL=${FERRY_LOG_LEVEL:-error}
unset FERRY_METADATA FERRY_SEGMENT_NAME
transports=${TRANSPORTS:+-t $TRANSPORTS}

tmp=$(mktemp -d)
server=""
stop_server() {
    [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
    server=""
}
trap 'stop_server; rm -rf "$tmp"' EXIT INT TERM

wait_port() { # port: until something listens on it (10 s)
    for _ in $(seq 100); do
        python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" \
            2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

module_built() { [ -f "$FERRY_MODULE_DIR/ferry_$1.so" ]; }

# Start the store's server; sets uri.  1 when it cannot run here.
start_store() {
    port=$(free_port)
    case $1 in
    p2p) uri=p2p ;;
    redis)
        module_built redis && command -v redis-server >/dev/null && command -v redis-cli \
            >/dev/null || return 1
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$tmp" >"$tmp/redis.log" 2>&1 &
        server=$!
        uri=redis://127.0.0.1:$port ;;
    etcd)
        module_built etcd && command -v etcd >/dev/null && command -v curl >/dev/null ||
            return 1
        peer=$(free_port)
        rm -rf "$tmp/etcd"
        etcd --name=scale --data-dir="$tmp/etcd" --listen-client-urls="http://127.0.0.1:$port" \
            --advertise-client-urls="http://127.0.0.1:$port" \
            --listen-peer-urls="http://127.0.0.1:$peer" \
            --initial-advertise-peer-urls="http://127.0.0.1:$peer" \
            --initial-cluster="scale=http://127.0.0.1:$peer" --log-level=warn --logger=zap \
            >"$tmp/etcd.log" 2>&1 &
        server=$!
        uri=etcd://127.0.0.1:$port ;;
    http)
        module_built http && [ -x "$build/ferry_metad" ] && command -v curl >/dev/null ||
            return 1
        "$build/ferry_metad" --listen="127.0.0.1:$port" >"$tmp/metad.log" 2>&1 &
        server=$!
        uri=http://127.0.0.1:$port/metadata ;;
    pmix)
        module_built pmix && command -v mpirun >/dev/null || return 1
        uri=pmix ;;
    esac
    [ -z "$server" ] || wait_port "$port"
}

# The store server's own count of the requests it served so far.
store_requests() {
    case $1 in
    redis) redis-cli -p "$port" INFO commandstats |
           sed -n 's/^cmdstat_\([a-z]*\):calls=\([0-9]*\).*/\2/p' | awk '{s+=$1} END {print s+0}' ;;
    etcd) curl -s "http://127.0.0.1:$port/metrics" |
          awk '/^grpc_server_handled_total/ {s+=$NF} END {printf "%d\n", s}' ;;
    http) curl -s "http://127.0.0.1:$port/health" |
          python3 -c 'import json,sys; r=json.load(sys.stdin)["requests"]; print(sum(r.values()))' ;;
    *) echo - ;;
    esac
}

field() { sed -n "s/^RESULT.* $1=\([^ ]*\).*/\1/p" "$2"; }

echo "# contrib/bench-scale.sh: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg), transports ${TRANSPORTS:-default}"
table="| store | engines | processes x engines | full connectivity (s) | threads/process | descriptors/process | sockets/process | RSS/process (MiB, max) | store requests (server) | RPC served | PMIx get/put/commit |
|---|---|---|---|---|---|---|---|---|---|---|"
for store in $stores; do
    if ! start_store "$store"; then
        echo "# $store: skipped (its module, server or launcher is missing)"
        stop_server
        continue
    fi
    for size in $sizes; do
        out=$tmp/out
        before=$(store_requests "$store")
        if [ "$store" = pmix ]; then
            ranks=$pmix_ranks; [ "$size" -lt "$ranks" ] && ranks=$size
            per=$((size / ranks))
            timeout -k 5 "$timeout_s" mpirun --allow-run-as-root --oversubscribe --bind-to none \
                -np "$ranks" "$bench" -e "$per" $transports >"$out" 2>&1 || true
            shape="$ranks x $per"
        else
            procs=$processes; [ "$size" -lt "$procs" ] && procs=$size
            per=$((size / procs))
            timeout -k 5 "$timeout_s" "$bench" -p "$procs" -e "$per" -m "$uri" $transports \
                >"$out" 2>&1 || true
            shape="$procs x $per"
        fi
        after=$(store_requests "$store")
        echo "## $store, $size engines ($shape)"
        grep '^#' "$out"
        grep -v '^[#[]' "$out" | grep -v '^RESULT' | head -n 5
        if ! grep -q '^RESULT' "$out" || [ "$(field failures "$out")" != 0 ]; then
            echo "# $store $size: FAILED (engine log lines: $(grep -c '^\[' "$out") in the run)"
            grep '^\[' "$out" | sed 's/^\[[0-9.]*\] ferry\[[0-9]*\] //' | sort | uniq -c |
                sort -rn | head -n 5
            table="$table
| $store | $size | $shape | failed | | | | | | | |"
            continue
        fi
        served="-"
        [ "$before" != - ] && served=$((after - before))
        table="$table
| $store | $size | $shape | $(field connect_s "$out") | $(field threads "$out") | $(field fds "$out") | $(field sockets "$out") | $(field rss_mib "$out") | $served | $(field rpc_served "$out") | $(field pmix_get "$out")/$(field pmix_put "$out")/$(field pmix_commit "$out") |"
    done
    stop_server
done
echo
echo "$table"
