#!/bin/sh
# Install the Debian 12 packages Ferry needs to build, test and benchmark.
# Usage: contrib/install-deps.sh [build|test]   (run as root, or with sudo)
set -e
what=${1:-test}
packages="build-essential autoconf automake libtool pkg-config libjansson-dev"
# metadata stores: etcd/http modules (libcurl), redis module, ferry_metad
packages="$packages libcurl4-openssl-dev libhiredis-dev libmicrohttpd-dev"
# transports: the UCX module, the libfabric module
packages="$packages libucx-dev libfabric-dev"
# the file transport's io_uring engine (without it: pread/pwrite threads)
packages="$packages liburing-dev"
# MPI jobs: the pmix module, the ferry_osu_* benchmarks and MPI tests
packages="$packages libpmix-dev libopenmpi-dev openmpi-bin"
if [ "$what" = test ]; then
    packages="$packages libcriterion-dev iperf3"
    # contrib/plot-bench.sh draws its PNGs with gnuplot
    packages="$packages gnuplot-nox"
    # the sanitizer passes' runtimes (GCC 12's; build-essential brings them today)
    packages="$packages libasan8 libubsan1 libtsan2"
    # the fuzz smoke run (contrib/fuzz.sh): clang's libFuzzer and sanitizers
    packages="$packages clang libclang-rt-14-dev"
    # the hip_ipc module compiles (HIP 5.2 headers; with the runtime they
    # depend on about 80 MB installed); no AMD GPU is needed to build it
    packages="$packages libamdhip64-dev"
    # test_netns: two network namespaces joined by a veth (ip netns, ip link)
    packages="$packages iproute2"
    # test_storage attaches a loop device (losetup); bench-file-vs-fio.sh runs fio
    packages="$packages mount fio"
    # servers the metadata tests start themselves, on free loopback ports
    packages="$packages etcd-server etcd-client redis-server"
    # a single-node Slurm for the srun tests (contrib/slurm-single-node.sh)
    packages="$packages slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge"
    # the Python package's tests (python/tests): headers, pytest, numpy, torch
    # (CPU) and mpi4py for Debian's /usr/bin/python3
    packages="$packages python3-dev python3-setuptools python3-pytest python3-numpy"
    packages="$packages python3-torch python3-mpi4py"
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
    # etcd-server, redis-server, munge and slurm start their packaged daemons
    # on install; the tests run their own, and where there is no init system
    # starting them fails the install.  A policy-rc.d that says "no" (if none is
    # there already) keeps the packaged daemons down while we install.
    policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        policy=/usr/sbin/policy-rc.d
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee $policy >/dev/null
        $SUDO chmod 755 $policy
        trap '$SUDO rm -f $policy' EXIT
    fi
    $SUDO apt-get install -y -q --no-install-recommends $missing
    if [ -n "$policy" ]; then
        $SUDO rm -f $policy
        trap - EXIT
    fi
fi
