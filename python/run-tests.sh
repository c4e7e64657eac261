#!/bin/sh
# make check's test of the Python package (installed as test_python in the
# build directory): build ferry._core against this build tree's library,
# without installing anything, and run its pytest suite.  Exit 77 (skip)
# with the reason when the interpreter, its headers, pytest or numpy are
# missing, and in sanitizer builds (see below).
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
# An instrumented libferry in an uninstrumented interpreter needs the
# sanitizer's runtime preloaded, and then reports the interpreter's own
# allocations at exit (ASan) or slows every test many times (TSan); the C
# suites cover the library there, this suite covers the binding in the
# plain build.
case "$FERRY_PY_LIB_CFLAGS" in
*-fsanitize=*) skip "sanitizer build (the plain build runs them)" ;;
esac
lib="$builddir/python/lib"
(cd "$srcdir/python" &&
    CFLAGS="-Werror" FERRY_BUILDDIR="$builddir" FERRY_SRCDIR="$srcdir" \
        "$python" setup.py --quiet build --build-base "$builddir/python/build" \
        --build-lib "$lib") || { echo "FAIL: the extension did not build"; exit 1; }
export PYTHONPATH="$lib${PYTHONPATH:+:$PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
exec timeout -k 10 600 "$python" -m pytest -q -p no:cacheprovider -rs "$srcdir/python/tests"
