#!/bin/bash
# Issue 20's comparison of the ofi transport with the bare libfabric loop
# (contrib/bench-ofi-vs-bare.sh) on the 16-core device machine.  On the
# 2-core VM the runs of one contender spread by 10-20%, wider than the
# distance of the 64 KiB and 8 B cells from their 0.9x and 1.2x lines
# (doc/performance.md, "ofi, eleventh round").  The device machine has
# libfabric 1.17's runtime but not its headers, so the Debian package of
# those travels in .device/debs beside what ../shared/gpu/pack.sh packs.
#
#   contrib/ofi-device-check.sh --pack          # here, from the project's root
#
# then, with .device/ carried, on the device machine from the root:
#
#   FERRY_CONFIGURE_FLAGS="LIBFABRIC_CFLAGS=-I/opt/ferry-deps/usr/include
#     LIBFABRIC_LIBS=-l:libfabric.so.1" bash .device/on-device.sh
#     'bash contrib/ofi-device-check.sh'        # (one line)
#
# on-device.sh unpacks the packages into /opt/ferry-deps and runs this in
# its build directory; -l:libfabric.so.1 links the machine's own library
# (the package's libfabric.so link points at a file only the runtime
# package has).  Results: $OUT/ofi-check.txt (else ./ofi-check.txt).
# Environment: OFI_CHECK_RUNS (3), SECONDS_PER_RUN (1), OFI_CHECK_BUDGET
# (seconds, 480), and bench-ofi-vs-bare.sh's own (PROVIDERS, SIZES, ...).
set -u
here=$(cd "$(dirname "$0")" && pwd)

if [ "${1:-}" = --pack ]; then
    root=$(cd "$here/.." && pwd)
    "$root/../shared/gpu/pack.sh" || exit 1
    (cd "$root/.device/debs" && apt-get download libfabric-dev >/dev/null 2>&1) ||
        { apt-get update -q >/dev/null && (cd "$root/.device/debs" && apt-get download libfabric-dev >/dev/null); } ||
        { echo "ofi-device-check: cannot download libfabric-dev" >&2; exit 1; }
    echo ".device/ has libfabric-dev too:" "$root"/.device/debs/libfabric-dev_*.deb
    exit 0
fi

build=$(pwd)
out=${OUT:-$build}/ofi-check.txt
if [ ! -e "$build/modules/.libs/ferry_ofi.so" ] || [ ! -x "$build/bench-ofi-rma" ]; then
    echo "ofi-device-check: no ferry_ofi module or bench-ofi-rma in $build: configure found" \
        "no libfabric (FERRY_CONFIGURE_FLAGS: see the head of $0)" | tee "$out" >&2
    exit 1
fi
{
    echo "host: $(nproc) CPUs, kernel $(uname -r), TCP congestion control" \
        "$(sysctl -n net.ipv4.tcp_congestion_control 2>/dev/null || echo unknown)"
    FERRY_MODULE_DIR=$build/modules/.libs "$build/ferry_info" 2>&1 | grep '^ofi:'
    OFI2_ENV=${OFI2_ENV-} SECONDS_PER_RUN=${SECONDS_PER_RUN:-1} \
        timeout "${OFI_CHECK_BUDGET:-480}" bash "$here/bench-ofi-vs-bare.sh" "$build" \
        "${OFI_CHECK_RUNS:-3}"
    echo "bench-ofi-vs-bare.sh: exit status $?"
} 2>&1 | tee "$out"
