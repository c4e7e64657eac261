#!/bin/sh
# Build the libFuzzer harnesses of test/fuzz/ with clang (ASan + UBSan) straight
# from the sources they exercise, and run each in turn for a time or a number
# of runs.  Fails on any crash, leak, timeout or sanitizer report; prints per
# harness the executions done.  doc/fuzzing.md explains the harnesses.
#
# Usage: contrib/fuzz.sh [--time=SECONDS | --runs=N] [HARNESS...]
#   HARNESS: descriptor changes rpc tcp etcd redis http (default: all)
#   --time=SECONDS  run each harness this long (default 60)
#   --runs=N        run each harness N inputs instead
# Environment: CLANG (default clang); FERRY_FUZZ_DIR, where binaries, the
# corpus each run grew and crash inputs go (default build-fuzz/); extra
# libFuzzer flags in FUZZ_FLAGS (e.g. FUZZ_FLAGS=-jobs=2).
set -e
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
all="descriptor changes rpc tcp etcd redis http"
limit="-max_total_time=60"
harnesses=""
for arg in "$@"; do
    case "$arg" in
    --time=*) limit="-max_total_time=${arg#--time=}" ;;
    --runs=*) limit="-runs=${arg#--runs=}" ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $arg" >&2; exit 2 ;;
    *) case " $all " in
       *" $arg "*) harnesses="$harnesses $arg" ;;
       *) echo "fuzz.sh: no harness \"$arg\" (have: $all)" >&2; exit 2 ;;
       esac ;;
    esac
done
[ -n "$harnesses" ] || harnesses=$all
clang=${CLANG:-clang}
if ! command -v "$clang" >/dev/null 2>&1; then
    echo "fuzz.sh: $clang not found (contrib/install-deps.sh test installs clang)" >&2
    exit 2
fi
out=${FERRY_FUZZ_DIR:-$top/build-fuzz}
mkdir -p "$out"

libs() {
    pkg-config --libs "$1" 2>/dev/null || echo "$2"
}

descriptor_sources="src/core/descriptor.c src/core/descriptor_compact.c src/core/descriptor_pool.c"
descriptor_sources="$descriptor_sources src/core/storage_key.c src/core/descriptor_blob.c"
# harness -> the sources it needs (besides test/fuzz/fuzz_NAME.c and
# fuzz_common.c) and the libraries to link
sources() {
    case "$1" in
    descriptor) echo "$descriptor_sources" ;;
    changes) echo "$descriptor_sources src/core/descriptor_changes.c" ;;
    rpc) echo "src/rpc/rpc_frame.c src/rpc/wire.c src/rpc/rpc_message.c" ;;
    tcp) echo "src/transport/tcp/tcp_wire.c" ;;
    etcd) echo "src/metadata/etcd/etcd_client.c src/metadata/md_curl.c src/metadata/keys.c" ;;
    redis) echo "src/metadata/redis/redis_reply.c" ;;
    http) echo "$descriptor_sources" ;;
    esac
}
link() {
    case "$1" in
    descriptor | changes) libs jansson -ljansson ;;
    etcd | http) echo "$(libs libcurl -lcurl) $(libs jansson -ljansson)" ;;
    redis) libs hiredis -lhiredis ;;
    esac
}

build() {
    name=$1
    # shellcheck disable=SC2046  # word splitting of the lists is wanted
    "$clang" -std=gnu11 -D_GNU_SOURCE -g -O2 -Wall -Wextra -Werror -pthread \
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
        -I"$top/include" -I"$top/src" \
        -o "$out/fuzz_$name" "test/fuzz/fuzz_$name.c" test/fuzz/fuzz_common.c \
        $(sources "$name") $(link "$name")
}

# One harness: its own corpus directory takes what the run finds; the seeds
# in test/fuzz/corpus/NAME are only read.
run() {
    name=$1
    work="$out/$name"
    mkdir -p "$work/corpus"
    dict=""
    [ -f "test/fuzz/$name.dict" ] && dict="-dict=test/fuzz/$name.dict"
    log="$work/run.log"
    start=$(date +%s)
    rc=0
    # shellcheck disable=SC2086
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
        "$out/fuzz_$name" $limit -timeout=30 -rss_limit_mb=2560 -print_final_stats=1 \
        -artifact_prefix="$work/" $dict ${FUZZ_FLAGS:-} \
        "$work/corpus" "test/fuzz/corpus/$name" >"$log" 2>&1 || rc=$?
    seconds=$(( $(date +%s) - start ))
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
    corpus=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' "$log" | tail -n 1)
    if [ $rc -ne 0 ] || grep -q -e 'ERROR: AddressSanitizer' -e 'ERROR: LeakSanitizer' \
        -e 'runtime error:' -e 'fuzz check failed' -e 'ERROR: libFuzzer' "$log"; then
        echo "fuzz $name: FAILED after ${runs:-?} runs, ${seconds} s (exit $rc); log: $log"
        grep -e '^==[0-9]*==ERROR' -e 'runtime error:' -e 'fuzz check failed' \
            -e '^    #[0-9]' -e 'Test unit written to' -e 'ERROR: libFuzzer' "$log" |
            head -n 30
        return 1
    fi
    echo "fuzz $name: ${runs:-?} runs, ${seconds} s, ${speed:-?} exec/s, corpus ${corpus:-?}: ok"
}

status=0
for name in $harnesses; do
    if ! build "$name"; then
        echo "fuzz $name: FAILED to build" >&2
        status=1
        continue
    fi
    run "$name" || status=1
done
exit $status
