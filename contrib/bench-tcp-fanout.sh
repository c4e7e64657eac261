#!/bin/sh
# Threads, descriptors and memory of one process whose one engine writes to
# PEERS peer engines over tcp (test/tcp_fanout.c; issue 19), for this build
# and, interleaved, an older libferry.
# Usage: contrib/bench-tcp-fanout.sh BUILD_DIR [PEERS [BASELINE_LIBDIR]]
#   BASELINE_LIBDIR: a directory holding an older libferry.so.0
set -eu
build=$1
peers=${2:-100}
baseline=${3:-}
runs=${RUNS:-3}
export FERRY_MODULE_DIR="$build/modules/.libs" FERRY_TRANSPORTS=tcp
ulimit -n "$((peers * 12 + 256))" 2>/dev/null || true
prog=$build/.libs/tcp_fanout
[ -x "$prog" ] || prog=$build/tcp_fanout
echo "host: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$runs"); do
    echo "this build: $(LD_LIBRARY_PATH="$build/.libs" "$prog" "$peers" | grep RESULT)"
    [ -z "$baseline" ] ||
        echo "baseline:   $(LD_LIBRARY_PATH="$baseline" "$prog" "$peers" | grep RESULT)"
done
