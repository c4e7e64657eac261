#!/bin/sh
# The test suite's LOG_COMPILER: runs one test program and, once, runs it
# again when its only failure was LeakSanitizer's own tracer crashing at
# exit ("Tracer caught signal 11 ... LeakSanitizer has encountered a fatal
# error", an intermittent sanitizer fault: google/sanitizers#1353) while
# every test passed and no leak was reported.  Anything else, a real leak
# report included, stands as it is.
out=$(mktemp "${TMPDIR:-/tmp}/ferry-test-XXXXXX") || exit 99
"$@" >"$out" 2>&1
rc=$?
if [ "$rc" -ne 0 ] &&
   grep -q "LeakSanitizer has encountered a fatal error" "$out" &&
   ! grep -q "detected memory leaks" "$out" &&
   grep -q "Failing: 0 | Crashing: 0" "$out"; then
    grep -v "Synthesis:" "$out"  # the run that counts is the next one
    echo "sanitizer-retry: LeakSanitizer's tracer failed, no leak reported: running $1 again"
    rm -f "$out"
    exec "$@"
fi
cat "$out"
rm -f "$out"
exit "$rc"
