#!/bin/sh
# make check's test of the Python package (installed as test_python in the
# build directory): build ferry._core against this build tree's library,
# without installing anything, and run its pytest suite.  Exit 77 (skip)
# with the reason when the interpreter, its headers, pytest or numpy are
# missing, and in the ThreadSanitizer build (see below).
python=${FERRY_PYTHON:-python3}
srcdir=${FERRY_SRCDIR:?FERRY_SRCDIR names the source tree}
builddir=${FERRY_BUILDDIR:?FERRY_BUILDDIR names the build tree}
skip() {
    echo "SKIP: python package tests: $*"
    exit 77
}
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null ||
    skip "no Python 3.9 or later at '$python' (FERRY_PYTHON)"
"$python" -c 'import os, sys, sysconfig
sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' ||
    skip "$python has no Python.h (python3-dev)"
for module in setuptools pytest numpy; do
    "$python" -c "import $module" 2>/dev/null || skip "$python cannot import $module"
done
# Sanitizer builds: an instrumented libferry inside an uninstrumented
# interpreter needs the sanitizer's runtime loaded first (LD_PRELOAD, which
# the peer processes and MPI ranks the tests start inherit); the extension
# is built with the same -fsanitize flags.  LeakSanitizer is off here: the
# interpreter, numpy and torch keep thousands of blocks at exit (the C suites
# check the library for leaks).  ThreadSanitizer: skipped (a preloaded TSan
# runtime under an uninstrumented interpreter's threads is not a setup its
# reports can be trusted in; the C suites cover the library there).
sanitize=""
preload=""
for flag in $FERRY_PY_LIB_CFLAGS; do
    case "$flag" in
    -fsanitize=thread) skip "ThreadSanitizer build (the plain and ASan builds run them)" ;;
    -fsanitize=* | -fno-sanitize-recover=* | -fno-omit-frame-pointer)
        sanitize="$sanitize $flag" ;;
    esac
done
case "$sanitize" in
*address*)
    for runtime in libasan.so libubsan.so; do
        case "$runtime:$sanitize" in
        libubsan.so:*undefined* | libasan.so:*)
            path=$(${FERRY_PY_CC:-cc} -print-file-name=$runtime)
            [ -f "$path" ] || skip "no $runtime for the sanitizer build"
            preload="$preload $path" ;;
        esac
    done
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS ;;
esac
lib="$builddir/python/lib"
# setup.py wants its egg base to exist (a build tree configured before the
# package came has no python/ folder yet).
mkdir -p "$builddir/python" || { echo "FAIL: cannot create $builddir/python"; exit 1; }
(cd "$srcdir/python" &&
    CFLAGS="-Werror$sanitize" LDFLAGS="$sanitize" FERRY_BUILDDIR="$builddir" FERRY_SRCDIR="$srcdir" \
        "$python" setup.py --quiet egg_info --egg-base "$builddir/python" \
        build --build-base "$builddir/python/build" \
        --build-lib "$lib") || { echo "FAIL: the extension did not build"; exit 1; }
export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
[ -z "$preload" ] || export LD_PRELOAD="${preload# }${LD_PRELOAD:+ $LD_PRELOAD}"
exec timeout -k 10 600 "$python" -m pytest -q -p no:cacheprovider -rs "$srcdir/python/tests"
