#!/bin/sh
# The README's main job: install, build, and run the transfer benchmark
# between two processes on this host (p2p metadata, no server).
set -e
cd "$(dirname "$0")/.."
contrib/install-deps.sh build
[ -x configure ] || ./autogen.sh
[ -f Makefile ] || ./configure --quiet
make -j"$(nproc)" --quiet
export FERRY_RPC_ADDRESS=${FERRY_RPC_ADDRESS:-127.0.0.1}
# Not installed yet: take the plugins built here (UCX when it was found).
export FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$PWD/modules/.libs}
for op in write read; do
    ./ferry_bench --spawn --operation=$op --block-size=4m --batch-size=16 --duration=3 "$@"
    ./ferry_bench --spawn --operation=$op --block-size=64k --batch-size=128 --duration=3 "$@"
done
