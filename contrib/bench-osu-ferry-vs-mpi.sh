#!/bin/sh
# Ferry against MPI one-sided on this host: the ferry_osu_* benchmarks with
# --api=both (each size through Ferry, then MPI, back to back in the same
# two-rank job), RUNS times, medians per size, from MIN_SIZE (default 1 B)
# to 4 MiB.  Prints a Markdown table for doc/performance.md; the Ferry/MPI
# column is the median of each run's own ratio (both APIs in the same job
# see the same load), the MB/s columns medians of their own.
# Usage: contrib/bench-osu-ferry-vs-mpi.sh [BUILD_DIR] [RUNS] [TRANSPORT]
# (run contrib/quickstart-test.sh or build first; TRANSPORT: as
#  FERRY_TRANSPORTS, default every one, the best picked)
# Environment: PASSIVE_WAIT ("spin sleep"): one table per --passive-wait
# mode, how the rank that moves no data waits at the end of each size (spin
# inside MPI as OSU's MPI_Barrier does, ferry_osu's default, or sleep
# between polls and leave its core to the other rank; the same for both
# APIs).
set -e
build=$(cd "${1:-build}" && pwd)
runs=${2:-5}
transport=${3:-}
min_size=${MIN_SIZE:-1}
out=$(mktemp -d /tmp/ferry-osu-XXXXXX)
trap 'rm -rf "$out"' EXIT
export FERRY_MODULE_DIR="$build/modules/.libs" FERRY_RPC_ADDRESS=127.0.0.1
unset FERRY_METADATA FERRY_TRANSPORTS
root=""
[ "$(id -u)" -ne 0 ] || root=--allow-run-as-root
launch="mpirun $root --oversubscribe --bind-to none -np 2"

# $1 test, $2 osu options: $out/<test>.<api>.<run> hold "size value" lines
sweep() {
    for run in $(seq "$runs"); do
        $launch "$build/ferry_osu_$1" $2 ${transport:+-T $transport} --api=both \
            --passive-wait="$wait" \
            >"$out/raw" 2>"$out/err" || { cat "$out/err" >&2; exit 1; }
        # the first table is Ferry's, the second MPI's
        awk -v f="$out/$1.ferry.$run" -v m="$out/$1.mpi.$run" '
            /^# OSU Ferry/ { t = f } /^# OSU MPI/ { t = m }
            /^# Ferry .* transport/ { print $NF > (f ".transport") }
            /^[0-9]/ { print $1, $2 > t }' "$out/raw"
        # each size's Ferry/MPI ratio within this run
        awk 'NR == FNR { f[$1] = $2; next } ($1 in f) && $2 > 0 { print $1, f[$1] / $2 }' \
            "$out/$1.ferry.$run" "$out/$1.mpi.$run" >"$out/$1.ratio.$run"
    done
}

median() { # $1 test, $2 api, $3 size
    cat "$out/$1.$2".[0-9]* | awk -v s="$3" '$1 == s { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2];
                                  else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

for wait in ${PASSIVE_WAIT:-spin sleep}; do
rm -f "$out"/*
sweep put_bw "-m $min_size:4194304"
sweep get_bw "-m $min_size:4194304"
sweep put_latency "-m 8:8"
sweep get_latency "-m 8:8"

echo "--passive-wait=$wait; Ferry transport: $(cat "$out/put_bw.ferry.1.transport"); medians of $runs runs"
echo
echo "| size | put Ferry MB/s | put MPI MB/s | Ferry/MPI | get Ferry MB/s | get MPI MB/s | Ferry/MPI |"
echo "|---:|---:|---:|---:|---:|---:|---:|"
size=$min_size
while [ $size -le 4194304 ]; do
    pf=$(median put_bw ferry $size) pm=$(median put_bw mpi $size)
    gf=$(median get_bw ferry $size) gm=$(median get_bw mpi $size)
    pr=$(median put_bw ratio $size) gr=$(median get_bw ratio $size)
    echo "$size $pf $pm $pr $gf $gm $gr" |
        awk '{ printf "| %d | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx |\n",
               $1, $2, $3, $4, $5, $6, $7 }'
    size=$((size * 2))
done
echo
echo "| 8 B latency | Ferry us | MPI us |"
echo "|---|---:|---:|"
echo "| put | $(median put_latency ferry 8) | $(median put_latency mpi 8) |"
echo "| get | $(median get_latency ferry 8) | $(median get_latency mpi 8) |"
echo
done
