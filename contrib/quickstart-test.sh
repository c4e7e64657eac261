#!/bin/sh
# The README's test command: install, build with -Werror, run the suite, then
# run it again under AddressSanitizer + UndefinedBehaviorSanitizer, run
# every fuzz harness for a short while, and run the suite a third time
# under ThreadSanitizer.
set -e
cd "$(dirname "$0")/.."
contrib/install-deps.sh test
# The srun tests need a Slurm: start a single-node one (as root) unless one
# answers already, and stop it on the way out.  Without it they skip.
if [ "$(id -u)" -eq 0 ] && ! contrib/slurm-single-node.sh status; then
    if contrib/slurm-single-node.sh start; then
        trap 'contrib/slurm-single-node.sh stop' EXIT
    elif [ "${CI:-}" = true ]; then
        echo "quickstart-test: Slurm did not start; CI runs the srun tests" >&2
        exit 1
    else
        echo "quickstart-test: no Slurm; the srun tests will skip" >&2
    fi
fi
./autogen.sh
jobs=$(nproc)
summary=""
status=0
# A failed program's own words, gathered for the end of this output (CI
# shows only its end): Criterion's failure lines and any sanitizer or retry
# messages, without the engine's log lines (kept in the log), at most 80.
failures=$(mktemp)
report_failed() {
    echo "==> $1 (failed; engine log lines left out, see the file)"
    grep -v '^\[[0-9.]*\] ferry\[' "$1" | tail -n 80
} >>"$failures"
# ThreadSanitizer's reports in a log: each kind once, then the first in full.
report_races() {
    echo "==> $1 (ThreadSanitizer reports; engine log lines left out)"
    grep '^SUMMARY: ThreadSanitizer' "$1" | sort | uniq -c
    grep -v '^\[[0-9.]*\] ferry\[' "$1" | sed -n '/^WARNING: ThreadSanitizer/,/^SUMMARY/p' |
        head -n 60
} >>"$failures"
run_suite() {
    dir=$1; shift
    rm -rf "$dir" && mkdir -p "$dir"
    (cd "$dir" && ../configure --quiet --enable-werror "$@" && make -j"$jobs" --quiet) || return 1
    rc=0
    (cd "$dir" && make -j"$jobs" check) || rc=$?
    races=0
    for log in "$dir"/test_*.log; do
        [ -f "$log" ] || continue
        result=$(tail -n 1 "$log")
        case "$result" in
        PASS* | SKIP*)
            # A report from a process whose exit status no test looks at (a
            # peer, a server) fails the program all the same.
            if grep -q '^WARNING: ThreadSanitizer:' "$log"; then
                report_races "$log"
                races=$((races + 1))
            else
                echo "$result"
            fi
            ;;
        *) report_failed "$log" ;;
        esac
    done
    # Count Criterion's tests (its "Synthesis:" line), not test binaries.
    pass=$(cat "$dir"/test_*.log 2>/dev/null | sed -n 's/.*Passing: \([0-9]*\).*/\1/p' |
           awk '{s+=$1} END {print s+0}')
    fail=$(cat "$dir"/test_*.log 2>/dev/null |
           sed -n 's/.*Failing: \([0-9]*\).*Crashing: \([0-9]*\).*/\1 \2/p' |
           awk '{s+=$1+$2} END {print s+0}')
    [ $rc -eq 0 ] || [ "$fail" -gt 0 ] || fail=1
    summary="$summary$dir: $pass passed, $fail failed"
    if [ $races -gt 0 ]; then
        summary="$summary, ThreadSanitizer reports from $races program(s)"
        rc=1
    fi
    summary="$summary
"
    return $rc
}
run_suite build-check || status=1
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    run_suite build-sanitize --enable-sanitizers --enable-debug || status=1
# Each libFuzzer harness for a short while (doc/fuzzing.md): a crash, leak
# or sanitizer report fails the run.  The corpus grows in build-fuzz/.
fuzz_log=$(mktemp)
fuzz_seconds=15
if contrib/fuzz.sh --time=$fuzz_seconds >"$fuzz_log" 2>&1; then
    cat "$fuzz_log"
    summary="${summary}fuzz smoke: $(grep -c ': ok$' "$fuzz_log" || true) harnesses x $fuzz_seconds s, no crash
"
else
    status=1
    summary="${summary}fuzz smoke: FAILED (build-fuzz/*/run.log)
"
    { echo "==> fuzz smoke"; cat "$fuzz_log"; } >>"$failures"
fi
rm -f "$fuzz_log"
# Every test program, peers and servers included, under ThreadSanitizer:
# the first report ends its process (halt_on_error), and a report anywhere
# fails the pass (run_suite).  No suppressions: no report has come from
# the uninstrumented libraries' own threads (UCX, libcurl, MHD, Open MPI).
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4" \
    run_suite build-tsan --enable-sanitizers=thread --enable-debug || status=1
cat "$failures"; rm -f "$failures"
printf '%s' "$summary"
exit $status
