#!/bin/bash
# The GPU machine check (issue 18): in one run, the GPU tests, the raw CUDA
# baseline (contrib/gpu_baseline.cu) and the same cases through ferry_bench,
# then every number and its ratio to the issue's targets, in one file.
#
# On the GPU machine (no network, no libtoolize, no jansson/Criterion
# headers: ../shared/gpu/pack.sh prepares .device/ here, on-device.sh builds
# the `make dist` tarball there and runs this in its build directory):
#
#     ../shared/gpu/pack.sh                                     # here
#     bash .device/on-device.sh 'bash contrib/gpu-check.sh'     # there, from the root
#
# Results: $OUT/gpu-check.txt (or --output=FILE), logs in $OUT/gpu-check/.
# Without a GPU: --dry-run runs every part that can run here, against the
# test vendor (FERRY_TEST_GPU_KIND=testgpu, FERRY_TESTGPU_DEVICES=2), with
# small sizes and short runs; the CUDA baseline is compiled when nvcc is
# there and reported skipped with the reason.
#
# Usage: contrib/gpu-check.sh [--dry-run] [--kind=cuda|hip|testgpu] [--output=FILE]
#                             [--build-dir=DIR] [--budget=SECONDS]
# Environment: GPU_CHECK_TESTS (the tests to run; default: every test in
#   the build whose name has gpu, accel or cuda in it), GPU_CHECK_SECONDS
#   (per ferry_bench run), NVCC, GPU_CHECK_BIG (the large size, 1g),
#   GPU_CHECK_JOBS (make's jobs for the tests, default nproc),
#   GPU_CHECK_STORAGE_FILE, _SIZE, _BLOCK (the GPU-and-storage cases: the file,
#   default gpu-check/storage.bin beside the results, 1g round, 64m blocks).
set -u
start=$SECONDS
here=$(cd "$(dirname "$0")" && pwd)
srcdir=$(cd "$here/.." && pwd)
kind=cuda dry=0 output='' build='' budget=420
for arg in "$@"; do
    case $arg in
    --dry-run) dry=1 kind=testgpu ;;
    --kind=*) kind=${arg#--kind=} ;;
    --output=*) output=${arg#--output=} ;;
    --build-dir=*) build=${arg#--build-dir=} ;;
    --budget=*) budget=${arg#--budget=} ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
done

# The build: the current directory when it is one (on-device.sh runs us in
# its build), else build/ of the source tree.
if [ -z "$build" ]; then
    for d in . "$srcdir" "$srcdir/build"; do
        if [ -x "$d/ferry_bench" ] && [ -f "$d/Makefile" ]; then build=$d; break; fi
    done
fi
if [ -z "$build" ] || [ ! -x "$build/ferry_bench" ]; then
    echo "gpu-check: no built ferry_bench: run from a build directory or pass --build-dir" >&2
    exit 2
fi
build=$(cd "$build" && pwd)
outdir=${OUT:-$build}
[ -n "$output" ] || output=$outdir/gpu-check.txt
logs=$(dirname "$output")/gpu-check
mkdir -p "$logs" || exit 2
: > "$output" || exit 2

export FERRY_MODULE_DIR=${FERRY_MODULE_DIR:-$build/modules/.libs}
export FERRY_RPC_ADDRESS=${FERRY_RPC_ADDRESS:-127.0.0.1}
export FERRY_TEST_GPU_KIND=$kind
if [ "$kind" = testgpu ]; then
    export FERRY_TESTGPU_DEVICES=${FERRY_TESTGPU_DEVICES:-2}
fi
memory=$kind:0
transport=${kind}_ipc
if [ "$dry" = 1 ]; then
    big=${GPU_CHECK_BIG:-64m} seconds=${GPU_CHECK_SECONDS:-0.3} baseline_seconds=0.1
else
    big=${GPU_CHECK_BIG:-1g} seconds=${GPU_CHECK_SECONDS:-2} baseline_seconds=0.5
fi

say() { echo "$*" | tee -a "$output"; }
elapsed() { echo $((SECONDS - start)); }
# Whether time is left for a step of about $1 seconds.
time_left() {
    if [ $((SECONDS - start + $1)) -gt "$budget" ]; then
        say "SKIPPED $2: the ${budget} s budget is spent ($(elapsed) s so far)"
        return 1
    fi
}

say "# ferry GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
say "# kind $kind, memory $memory, transport $transport, large size $big," \
    "$seconds s per ferry_bench run$([ "$dry" = 1 ] && echo ', DRY RUN (no GPU)')"
say "# build $build ($("$build/ferry_info" -v 2>/dev/null | head -1 | sed 's/^# //'))"
if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader \
        2>&1 | sed 's/^/# nvidia-smi: /' | tee -a "$output"
fi

# ---- 1. the GPU tests ----
say ""
say "## tests (FERRY_TEST_GPU_KIND=$kind)"
# shellcheck disable=SC2016 # $(TESTS) is make's
tests=${GPU_CHECK_TESTS:-$(printf 'print-tests:\n\t@echo $(TESTS)\n' |
    make -s -C "$build" -f Makefile -f - print-tests 2>/dev/null | tr ' ' '\n' |
    grep -E 'gpu|accel|cuda' | tr '\n' ' ')}
tests=$(echo "$tests" | xargs)
if [ -z "$tests" ]; then
    say "SKIPPED tests: this build has no GPU test (none named *gpu*, *accel*, *cuda*)"
elif time_left 150 "tests"; then
    say "tests: $tests"
    # Criterion at verbosity 1 logs each test's [PASS], [SKIP] (with why)
    # or [FAIL] line: a suite that skips everything still exits 0
    CRITERION_VERBOSITY_LEVEL=1 timeout 240 make -C "$build" -j"${GPU_CHECK_JOBS:-$(nproc)}" \
        check TESTS="$tests" > "$logs/tests.log" 2>&1
    rc=$?
    grep -E '^(PASS|FAIL|SKIP|XFAIL|XPASS|ERROR):' "$logs/tests.log" | tee -a "$output"
    for t in $tests; do
        log=$build/$t.log
        [ -f "$log" ] || continue
        cp "$log" "$logs/"
        say "  $t: $(grep -c '^\[PASS\]' "$log") passed, $(grep -c '^\[SKIP\]' "$log")" \
            "skipped, $(grep -cE '^\[(FAIL|CRASH)' "$log") failed"
        grep -m1 '^\[SKIP\]' "$log" | sed 's/^/    first skip: /' | tee -a "$output"
        grep -E '^\[(FAIL|CRASH)' "$log" | head -5 | sed 's/^/    /' | tee -a "$output"
    done
    [ "$rc" = 124 ] && say "tests: TIMED OUT after 240 s"
    say "tests: make check exited $rc (log: gpu-check/tests.log)"
fi

# what the engine sees (after the tests: make check builds the testgpu module)
say ""
"$build/ferry_info" -d > "$logs/ferry_info.txt" 2>&1
tee -a "$output" < "$logs/ferry_info.txt"

# ---- 2. the raw CUDA baseline ----
say ""
say "## raw baseline (contrib/gpu_baseline.cu, the CUDA runtime alone)"
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
baseline=$logs/baseline.txt
: > "$baseline"
if [ ! -x "$nvcc" ]; then
    say "SKIPPED baseline: no nvcc (looked for nvcc on PATH and /usr/local/cuda/bin/nvcc)"
elif ! "$nvcc" -O2 -o "$logs/gpu_baseline" "$srcdir/contrib/gpu_baseline.cu" \
        > "$logs/nvcc.log" 2>&1; then
    say "SKIPPED baseline: nvcc failed (gpu-check/nvcc.log): $(tail -1 "$logs/nvcc.log")"
elif [ "$kind" != cuda ]; then
    say "SKIPPED baseline: compiled, not run: kind $kind is not CUDA"
elif time_left 40 "baseline"; then
    GPU_BASELINE_SECONDS=$baseline_seconds timeout 120 "$logs/gpu_baseline" 0 \
        > "$baseline" 2> "$logs/baseline.err"
    rc=$?
    tee -a "$output" < "$baseline"
    # 3: no device, and the skip line above says why
    [ "$rc" = 0 ] || [ "$rc" = 3 ] || say "baseline: exited $rc: $(tail -1 "$logs/baseline.err")"
fi
# The value of baseline case $1, or nothing; shown: or "-".
base() { sed -n "s/^BASELINE name=$1 value=\([0-9.]*\) .*/\1/p" "$baseline" | head -1; }
shown() { local v; v=$("$@"); echo "${v:--}"; }

# ---- 3. the same cases through ferry ----
say ""
say "## ferry_bench"
# run NAME ARGS...: one ferry_bench --spawn run; its RESULT, LATENCY and
# FIRST lines are kept as "NAME: line".
results=$logs/bench.txt
: > "$results"
run() {
    local name=$1
    shift
    time_left 25 "$name" || return 0
    timeout 90 "$build/ferry_bench" --spawn --duration="$seconds" "$@" \
        > "$logs/$name.log" 2>&1
    local rc=$?
    if grep -qE '^(RESULT|LATENCY|FIRST) ' "$logs/$name.log"; then
        grep -E '^(RESULT|LATENCY|FIRST) ' "$logs/$name.log" | sed "s/^/$name: /" |
            tee -a "$results" >> "$output"
    fi
    if [ "$rc" != 0 ]; then
        # the first thing ferry_bench (either side) said is the cause
        say "$name: FAILED (exit $rc): $(grep -E '^ferry_bench: ' "$logs/$name.log" | head -1)"
        echo "$name: FAILED" >> "$results"
    else
        echo "$name: $(grep -E '^(throughput|latency|first request):' "$logs/$name.log" |
            tr '\n' ' ')"
    fi
}
# field NAME KIND FIELD: FIELD=value of NAME's first KIND line.
field() {
    sed -n "s/^$1: $2 .*[ ]$3=\([^ ]*\).*/\1/p" "$results" | head -1
}
ipc=(--memory="$memory" --via="$transport")
run ipc_write_big "${ipc[@]}" --operation=write -b "$big" -B 1
run ipc_read_big "${ipc[@]}" --operation=read -b "$big" -B 1
run ipc_write_4m_16 "${ipc[@]}" --operation=write -b 4m -B 1 --window=16
run ipc_read_4m_16 "${ipc[@]}" --operation=read -b 4m -B 1 --window=16
run ipc_write_64k_128 "${ipc[@]}" --operation=write -b 64k -B 128
run ipc_write_8b_latency "${ipc[@]}" --operation=write -b 8 --latency
# the first request of a fresh initiator whose own memory is host memory:
# its device context and the IPC open both fall in that request
run ipc_first_from_host --local-memory=cpu --remote-memory="$memory" --via="$transport" \
    -b 8 --latency
run host_into_peer_gpu --local-memory=cpu --remote-memory="$memory" --via="$transport" \
    -b 256m -B 1
run tcp_gpu --memory="$memory" --transport=tcp -b 4m -B 16
run tcp_host --memory=cpu --transport=tcp -b 4m -B 16
run shm_from_gpu --local-memory="$memory" --remote-memory=cpu --transport=shm -b 4m -B 16
run ipc_write_verified "${ipc[@]}" --operation=write -b 1m -B 4 --verify
run ipc_read_verified "${ipc[@]}" --operation=read -b 1m -B 4 --verify

# ---- 4. against the issue's targets ----
say ""
say "## targets (issue 18, Performance): measured, reference, ratio, target"
[ "$dry" = 1 ] && say "# dry run: testgpu copies are memcpy between memfd mappings; these" \
    "verdicts only show that the check works, not how fast a GPU is"
# target NAME MEASURED REFERENCE MIN_RATIO UNIT_NOTE: one verdict line; an
# absolute target gives REFERENCE 1.  MIN_RATIO negative: at most -MIN_RATIO.
target() {
    local name=$1 measured=$2 reference=$3 want=$4 note=$5 bound
    bound=$(awk -v w="$want" 'BEGIN {print (w >= 0 ? ">= " w : "<= " (-w))}')
    if [ -z "$measured" ] || [ -z "$reference" ]; then
        say "$(printf '%-34s %12s %12s %8s %9s  n/a (%s)' "$name" "${measured:--}" \
            "${reference:--}" - "$bound" "$note")"
        return
    fi
    awk -v n="$name" -v m="$measured" -v r="$reference" -v w="$want" -v note="$note" 'BEGIN {
        ratio = r > 0 ? m / r : 0
        ok = w >= 0 ? ratio >= w : ratio <= -w
        printf "%-34s %12.4g %12.4g %8.3f %9s  %s (%s)\n", n, m, r, ratio,
            (w >= 0 ? ">= " w : "<= " (-w)), ok ? "PASS" : "FAIL", note
    }' | tee -a "$output"
}
target "${transport} write ${big}" "$(field ipc_write_big RESULT gbps)" "$(base ipc_1g)" 0.95 \
    "GB/s vs raw IPC copy 1 GiB"
target "${transport} read ${big}" "$(field ipc_read_big RESULT gbps)" "$(base ipc_read_1g)" \
    0.95 "GB/s vs raw IPC copy out of the peer, 1 GiB"
target "${transport} write 4m x16 in flight" "$(field ipc_write_4m_16 RESULT gbps)" \
    "$(base ipc_4m)" 0.9 "GB/s vs raw IPC copy 4 MiB"
target "${transport} read 4m x16 in flight" "$(field ipc_read_4m_16 RESULT gbps)" \
    "$(base ipc_read_4m)" 0.9 "GB/s vs raw IPC copy out of the peer, 4 MiB"
target "${transport} write 64k batch 128" "$(field ipc_write_64k_128 RESULT gbps)" \
    "$(base d2d_64k)" 2 "GB/s vs one sync cudaMemcpy 64 KiB at a time"
target "${transport} write 8 B latency" "$(field ipc_write_8b_latency LATENCY median_us)" \
    "$(base sync_copy_8b)" -2 "us, submit to completion, vs sync 8 B copy"
first=$(field ipc_first_from_host FIRST first_us)
target "first request to a new peer" "${first:+$(awk -v u="$first" 'BEGIN{print u/1000}')}" \
    1 -200 "ms, absolute; raw first open: $(shown base ipc_open_first) ms"
note="GB/s absolute, registered host memory (page-locked by ${transport}'s PIN_HOST);"
note="$note raw pinned H2D $(shown base h2d_pinned), pageable $(shown base h2d_pageable)"
target "host memory into peer GPU" "$(field host_into_peer_gpu RESULT gbps)" 1 50 "$note"
target "GPU memory over tcp" "$(field tcp_gpu RESULT gbps)" "$(field tcp_host RESULT gbps)" 0.8 \
    "GB/s vs host memory over tcp"

# ---- 5. issue 19 on the 16-core machine: tcp threads to one peer, and
# threads with 500 peers (the GPU machine is the only one with 16 cores) ----
say ""
say "## tcp scaling (issue 19): 4 MiB writes, 1/2/4/8 threads, one peer, default settings"
if [ "$dry" = 1 ]; then
    say "# dry run: skipped (it needs 16 cores)"
elif time_left 90 "tcp scaling"; then
    here=$(cd "$(dirname "$0")" && pwd)
    if RUNS=1 SECONDS_PER_RUN=3 sh "$here/bench-tcp-threads.sh" "$build" \
        > "$logs/tcp-threads.log" 2>&1; then verdict=PASS; else verdict=FAIL; fi
    tee -a "$output" < "$logs/tcp-threads.log"
    say "$(printf '%-34s %12s %12s %8s %9s  %s (%s)' "tcp 8 threads to one peer" - - - \
        ">= 25" "$verdict" "GB/s absolute, bench-tcp-threads.sh")"
    if time_left 60 "tcp 500 peers" && make -C "$build" tcp_fanout > /dev/null 2>&1; then
        RUNS=1 sh "$here/bench-tcp-fanout.sh" "$build" 500 2>&1 | tee -a "$output"
    fi
fi
# ---- 6. GPU memory to and from storage (issue 21, item 5): the raw
# baseline (contrib/gpu_storage_baseline.cu: cuFile alone, and pread into
# pinned memory plus host-to-device copies) and ferry's file transport with
# each FERRY_STORAGE_GPU path, on the same file and sizes ----
say ""
say "## GPU memory and storage (issue 21): file transport vs cuFile alone and pread+pinned+copy"
sfile=${GPU_CHECK_STORAGE_FILE:-$logs/storage.bin}
if [ "$dry" = 1 ]; then
    ssize=${GPU_CHECK_STORAGE_SIZE:-16m} sblock=${GPU_CHECK_STORAGE_BLOCK:-1m}
else
    ssize=${GPU_CHECK_STORAGE_SIZE:-1g} sblock=${GPU_CHECK_STORAGE_BLOCK:-64m}
fi
say "# file $sfile ($(df -PT "$(dirname "$sfile")" 2>/dev/null | awk 'NR==2 {print $2}')" \
    "file system), $ssize round, blocks of $sblock; $("$build/ferry_info" 2>/dev/null |
    grep -m1 'GPU memory to and from' | sed 's/^ *//')"
sbaseline=$logs/storage-baseline.txt
: > "$sbaseline"
if [ ! -x "$nvcc" ]; then
    say "SKIPPED storage baseline: no nvcc"
elif ! "$nvcc" -O2 -I "$srcdir/src/core" -o "$logs/gpu_storage_baseline" \
        "$srcdir/contrib/gpu_storage_baseline.cu" -ldl > "$logs/nvcc-storage.log" 2>&1; then
    say "SKIPPED storage baseline: nvcc failed: $(tail -1 "$logs/nvcc-storage.log")"
elif [ "$kind" != cuda ]; then
    say "SKIPPED storage baseline: compiled, not run: kind $kind is not CUDA"
elif time_left 30 "storage baseline"; then
    GPU_BASELINE_SECONDS=$baseline_seconds timeout 120 "$logs/gpu_storage_baseline" \
        "$sfile" "$ssize" "$sblock" 0 > "$sbaseline" 2> "$logs/storage-baseline.err"
    rc=$?
    tee -a "$output" < "$sbaseline"
    [ "$rc" = 0 ] || [ "$rc" = 3 ] ||
        say "storage baseline: exited $rc: $(tail -1 "$logs/storage-baseline.err")"
fi
sbase() { sed -n "s/^BASELINE name=$1 value=\([0-9.]*\) .*/\1/p" "$sbaseline" | head -1; }
storage=(--local-memory="$memory" --remote-memory="file:$sfile" --buffer-size="$ssize"
    -b "$sblock" -B 1)
paths="staging auto"
[ "$kind" = cuda ] && paths="staging cufile auto"
for path in $paths; do
    for op in read write; do
        FERRY_STORAGE_GPU=$path run "storage_${path}_$op" "${storage[@]}" --operation="$op"
    done
done
for op in read write; do
    run "storage_verified_$op" --local-memory="$memory" --remote-memory="file:$sfile" \
        -b 1m -B 4 --operation="$op" --verify
done
best_raw() { # the larger of two baseline values (either may be missing)
    awk -v a="$(sbase "$1")" -v b="$(sbase "$2")" \
        'BEGIN { if (a == "" && b == "") exit; print (a + 0 > b + 0 ? a : b) }'
}
raw_read=$(best_raw storage_pinned_read storage_cufile_read)
raw_write=$(best_raw storage_pinned_write storage_cufile_write)
note="GB/s vs the best of cuFile alone ($(shown sbase storage_cufile_read)) and pinned"
note="$note pipeline ($(shown sbase storage_pinned_read))"
target "GPU memory from a file (auto)" "$(field storage_auto_read RESULT gbps)" "$raw_read" \
    0.9 "$note"
target "GPU memory from a file (staging)" "$(field storage_staging_read RESULT gbps)" \
    "$raw_read" 0.9 "$note; forced"
[ "$kind" = cuda ] && target "GPU memory from a file (cufile)" \
    "$(field storage_cufile_read RESULT gbps)" "$raw_read" 0.9 "$note; forced"
target "GPU memory into a file (auto)" "$(field storage_auto_write RESULT gbps)" "$raw_write" \
    0.9 "GB/s vs the best raw write (no target in the issue: shown for the record)"
say "# verified: read $(shown field storage_verified_read RESULT status)," \
    "write $(shown field storage_verified_write RESULT status)"
rm -f "$sfile"

say ""
say "# also: raw IPC 4 MiB with 16 in flight $(shown base ipc_4m_16_in_flight) GB/s," \
    "d2d 1 GiB $(shown base d2d_1g) GB/s, d2d 4 MiB $(shown base d2d_4m) GB/s," \
    "shm from GPU memory $(shown field shm_from_gpu RESULT gbps) GB/s," \
    "verified ${transport} write $(shown field ipc_write_verified RESULT status)," \
    "read $(shown field ipc_read_verified RESULT status)"
say "# verdicts: $(grep -c '  PASS (' "$output") pass, $(grep -c '  FAIL (' "$output") fail," \
    "$(grep -c '  n/a (' "$output") not measured"
say "# done in $(elapsed) s; logs in $logs"
