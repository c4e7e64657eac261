#!/bin/sh
# Install the Debian 12 packages Ferry needs to build, test and benchmark.
# Usage: contrib/install-deps.sh [build|test]   (run as root, or with sudo)
set -e
what=${1:-test}
packages="build-essential autoconf automake libtool pkg-config libjansson-dev"
if [ "$what" = test ]; then
    packages="$packages libcriterion-dev iperf3 libucx-dev"
fi
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends $missing
fi
