#!/bin/sh
# Two builds of Ferry against MPI one-sided, alternately (before, after,
# before, ...), so that a busy machine weighs on both alike: each run is one
# two-rank job of ferry_osu_put_bw and one of ferry_osu_get_bw with
# --api=both (each size through Ferry, then MPI, in the same job).  Prints,
# per size, the median over the runs of each run's own Ferry/MPI ratio for
# both builds.
# Usage: contrib/bench-osu-before-after.sh BEFORE_BUILD AFTER_BUILD [RUNS] [MAX_SIZE]
# Environment: OSC (an Open MPI osc component for the MPI side, e.g. sm;
# default: what the installation picks), MIN_SIZE (default 1), OSU_ARGS
# (more options for both binaries, e.g. "-i 500" for longer timed loops),
# RUNS_SHOWN (1: each run's ratios too, not only the medians).
set -e
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
runs=${3:-5}
max_size=${4:-4194304}
min_size=${MIN_SIZE:-1}
out=$(mktemp -d /tmp/ferry-osu-ba-XXXXXX)
trap 'rm -rf "$out"' EXIT
export FERRY_RPC_ADDRESS=127.0.0.1
unset FERRY_METADATA FERRY_TRANSPORTS
root=""
[ "$(id -u)" -ne 0 ] || root=--allow-run-as-root
launch="mpirun $root --oversubscribe --bind-to none -np 2 ${OSC:+--mca osc $OSC}"

# $1 build label, $2 build dir, $3 test, $4 run: $out/<test>.<label>.<run> holds "size ratio"
one() {
    FERRY_MODULE_DIR="$2/modules/.libs" $launch "$2/ferry_osu_$3" -m "$min_size:$max_size" \
        --api=both $OSU_ARGS >"$out/raw" 2>"$out/err" || { cat "$out/err" >&2; exit 1; }
    awk '/^# OSU Ferry/ { t = "f" } /^# OSU MPI/ { t = "m" }
         /^[0-9]/ { if (t == "f") f[$1] = $2; else if ($2 > 0) print $1, f[$1] / $2 }' \
        "$out/raw" >"$out/$3.$1.$4"
}

median() { # $1 test, $2 label, $3 size
    cat "$out/$1.$2".[0-9]* | awk -v s="$3" '$1 == s { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2];
                                  else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for run in $(seq "$runs"); do
    for test in put_bw get_bw; do
        one before "$before" $test "$run"
        one after "$after" $test "$run"
    done
done
echo "Ferry/MPI, medians of $runs alternate runs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "${RUNS_SHOWN:-0}" = 1 ]; then
    for test in put_bw get_bw; do
        for label in before after; do
            echo "$test $label, run by run (size ratio ...):"
            for run in $(seq "$runs"); do
                awk '{ printf "%s %.2f  ", $1, $2 } END { print "" }' "$out/$test.$label.$run"
            done
        done
    done
fi
echo
echo "| size | put before | put after | get before | get after |"
echo "|---:|---:|---:|---:|---:|"
size=$min_size
while [ "$size" -le "$max_size" ]; do
    echo "$size $(median put_bw before $size) $(median put_bw after $size)" \
         "$(median get_bw before $size) $(median get_bw after $size)" |
        awk '{ printf "| %d | %.2fx | %.2fx | %.2fx | %.2fx |\n", $1, $2, $3, $4, $5 }'
    size=$((size * 2))
done
