#!/bin/sh
# Compare the file transport (ferry_bench --remote-memory=file:PATH, a target
# process owning the file, this process doing the I/O) with fio on the same
# file, engine, block size, queue depth and direct flag, runs interleaved.
# Prints each run, then the medians of $RUNS runs and ferry / fio.  Then
# (TCP=1, the default) tcp serving a storage buffer (a page-cache file on
# /dev/shm, the target doing the I/O) against tcp serving memory, 1 MiB
# reads, interleaved the same way.
# Usage: contrib/bench-file-vs-fio.sh [BUILD_DIR]
#   FILE (default /tmp/ferry-bench-fio.dat), SIZE (default 256m: the file and
#   the range both use), RUNS (3), SECONDS_PER_RUN (5).  fio runs with
#   --direct=1: the file transport uses O_DIRECT for aligned I/O (all of it
#   here: 4 KiB blocks of page-aligned buffers).
#   CASES: a grep -E pattern of the case labels to run (default: all).
#   BASE: another build directory (main, say): its ferry_bench runs each
#   case too, interleaved, and the medians add base and ferry/base.
#   PRECONDITION (default 1): before each fio run, write the file again
#   and write it back (fdatasync, then drop its cached pages), as
#   ferry_bench's target does with its fill before every ferry run, so
#   that both start from the same disk state (a write-back of 256 MiB
#   just before a run slows a random-write run on this VM's disk).
#   Rounds alternate the order (even rounds run fio first); the medians
#   add the median of each round's ferry/fio ("pairs"), which drift
#   between rounds cancels out of.
#   LOCAL_BUFFER (default fio): the initiator's buffers; "fio": as large
#   as fio's, the requests in flight per caller x the block
#   (ferry_bench --local-buffer-size: a random 4 KiB read then lands in
#   one of 32 blocks, as fio's do, not anywhere in 256 MiB, whose cold
#   pages each O_DIRECT I/O pins: ~8% of the IOPS here); "full": the
#   whole --buffer-size, as before that option (and for a BASE build
#   without it, whatever this says: its header line says so).
#   COUNTS=1: each ferry, base and fio run of an iops case runs under
#   `perf stat` (system calls, io_uring_enter and futex calls, context
#   switches, wake-ups), and a line per run gives each count per I/O (of
#   the whole process: the target and setup of ferry_bench included).
set -eu
. "$(dirname "$0")/bench-lib.sh"
build=${1:-$(cd "$(dirname "$0")/.." && pwd)}
bench=$build/ferry_bench
file=${FILE:-/tmp/ferry-bench-fio.dat}
size=${SIZE:-256m}
runs=${RUNS:-3}
seconds=${SECONDS_PER_RUN:-5}
direct=1
base=${BASE:+$BASE/ferry_bench}
export FERRY_RPC_ADDRESS=127.0.0.1
command -v fio >/dev/null || { echo "fio is not installed (contrib/install-deps.sh)" >&2; exit 1; }
[ -x "$bench" ] || { echo "no ferry_bench in $build" >&2; exit 1; }
[ -z "$base" ] || [ -x "$base" ] || { echo "no ferry_bench in $BASE" >&2; exit 1; }

# COUNTS=1: the runs' counter, and each count per I/O of the run just made
count_events=raw_syscalls:sys_enter,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_futex
count_events=$count_events,context-switches,sched:sched_wakeup
counter() { # command...
    if [ "${COUNTS:-0}" = 1 ]; then perf stat -x, -e "$count_events" -o "$tmp/counts" "$@"
    else "$@"; fi
}
counts_per_io() { # who rate unit
    [ "${COUNTS:-0}" = 1 ] && [ "$3" = iops ] && [ -s "$tmp/counts" ] || return 0
    awk -F, -v who="$1" -v ios="$(awk -v r="$2" -v s="$seconds" 'BEGIN {print r * s}')" '
        /^[0-9]/ {n = $3; sub(/^.*:(sys_enter_)?/, "", n)
                  line = line sprintf(" %s %.3f", n, $1 / ios)}
        END {printf "  per I/O, %s:%s\n", who, line}' "$tmp/counts"
    rm -f "$tmp/counts"
}

# fio: one job; prints IOPS or GB/s (10^9 bytes) of the operation
fio_run() { # engine rw bs iodepth unit [numjobs]
    op=read
    case $2 in *write) op=write ;; esac
    counter fio --name=bench --filename="$file" --size="$size" --ioengine="$1" --rw="$2" --bs="$3" \
        --iodepth="$4" --numjobs="${6:-1}" --group_reporting --direct="$direct" --time_based \
        --runtime="$seconds" --norandommap --randrepeat=0 --output-format=json 2>/dev/null |
        python3 -c 'import json,sys
d=json.load(sys.stdin)["jobs"][0][sys.argv[1]]
print("%.0f" % d["iops"] if sys.argv[2] == "iops" else "%.4f" % (d["bw_bytes"] / 1e9))' "$op" "$5"
}

# ferry_bench: requests in flight = callers x window (one request per batch)
local_buffer=${LOCAL_BUFFER:-fio}
case $local_buffer in fio|full) ;; *) echo "LOCAL_BUFFER is fio or full" >&2; exit 1 ;; esac
# bytes of a size with fio's k/m suffixes
bytes_of() {
    case $1 in *k) echo $((${1%k} * 1024)) ;; *m) echo $((${1%m} * 1048576)) ;; *) echo "$1" ;; esac
}
# --local-buffer-size for that bench (nothing for "full" or a bench without it)
local_buffer_option() { # bench bs window
    [ "$local_buffer" = fio ] && "$1" --help 2>/dev/null | grep -q -- --local-buffer-size || return 0
    echo "--local-buffer-size=$(($(bytes_of "$2") * $3))"
}
ferry_run() { # bench engine op bs in_flight unit random callers
    counter env FERRY_FILE_ENGINE="$2" FERRY_FILE_THREADS="${THREADS:-4}" \
        FERRY_MODULE_DIR="$(dirname "$1")/modules/.libs" "$1" --spawn \
        --remote-memory=file:"$file" --buffer-size="$size" --operation="$3" --block-size="$4" \
        --batch-size=1 --threads="$8" --window=$(($5 / $8)) $7 \
        $(local_buffer_option "$1" "$4" $(($5 / $8))) --duration="$seconds" |
        if [ "$6" = iops ]; then sed -n 's/^RESULT.* requests_per_s=\([0-9.]*\).*/\1/p'
        else sed -n 's/^RESULT.* gbps=\([0-9.]*\).*/\1/p'; fi
}

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the file written (so that neither side measures its growth), written
# back and dropped from the page cache
layout() {
    fio --name=layout --filename="$file" --size="$size" --rw=write --bs=1m --ioengine=psync \
        --direct=0 --end_fsync=1 >/dev/null 2>&1
    python3 -c 'import os,sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$file"
}
layout

# label | ferry engine | fio engine | ferry op | fio rw | bs | depth | unit | random | fio jobs
#   | ferry callers
# depth is the I/O in flight on both sides: fio's jobs x iodepth, ferry's
# callers (ferry_bench --threads) x window.  The threads engine's rows:
# - threads4: one caller with 4 requests in flight, the pool's 4 threads do
#   the I/O, against fio psync with 4 jobs (4 processes, each its own
#   pread at a time: no hand-off between threads at all);
# - threads4-callers4: 4 callers with one request each, the structure of
#   fio's psync jobs (a waiting caller does its own queued I/O);
# - threads4-posixaio: one caller, 4 in flight, against fio's posixaio
#   engine at iodepth 4 (glibc's POSIX AIO: one submitter, helper threads
#   doing pread: fio's own thread-pool engine).
# The issue's "same engine" for the threads engine is two rows, one per
# way of using it: threads4-callers4 (synchronous callers, each with one
# request: the same pread per I/O on the same thread as psync x4) and
# threads4-posixaio (one asynchronous submitter, a pool of threads doing
# the preads: what posixaio is).  threads4 (one caller, 4 in flight,
# against 4 synchronous processes) compares two structures, not engines:
# one caller waits for its requests in order and can submit nothing while
# it does one of them itself; it is kept to show that cost.
all_cases='4k-randread-qd32|uring|io_uring|read|randread|4k|32|iops|--random|1|1
4k-randwrite-qd32|uring|io_uring|write|randwrite|4k|32|iops|--random|1|1
1m-read-qd16|uring|io_uring|read|read|1m|16|gbps||1|1
1m-write-qd16|uring|io_uring|write|write|1m|16|gbps||1|1
4k-randread-threads4|threads|psync|read|randread|4k|4|iops|--random|4|1
4k-randread-threads4-callers4|threads|psync|read|randread|4k|4|iops|--random|4|4
4k-randread-threads4-posixaio|threads|posixaio|read|randread|4k|4|iops|--random|1|1'
cases=$(echo "$all_cases" | grep -E "^(${CASES:-.*})\|" || true)
[ -n "$cases" ] || { echo "no case matches CASES=$CASES" >&2; exit 1; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); file $file ($size), direct=$direct"
for who in "$bench" ${base:+"$base"}; do
    if [ "$local_buffer" = fio ] && [ -z "$(local_buffer_option "$who" 4k 1)" ]; then
        echo "note: $who has no --local-buffer-size: its initiator buffers are the whole $size"
    fi
done
echo "initiator buffers: $local_buffer (LOCAL_BUFFER)"
for run in $(seq "$runs"); do
    echo "$cases" | while IFS='|' read -r label fe fioe op rw bs depth unit random jobs callers; do
        fio_case() {
            [ "${PRECONDITION:-1}" = 0 ] || layout
            g=$(fio_run "$fioe" "$rw" "$bs" $((depth / jobs)) "$unit" "$jobs")
        }
        [ $((run % 2)) = 1 ] || { fio_case; counts_per_io fio "$g" "$unit" >>"$tmp/lines"; }
        f=$(ferry_run "$bench" "$fe" "$op" "$bs" "$depth" "$unit" "$random" "$callers")
        counts_per_io ferry "$f" "$unit" >>"$tmp/lines"
        b=-
        [ -z "$base" ] || b=$(ferry_run "$base" "$fe" "$op" "$bs" "$depth" "$unit" "$random" \
                                        "$callers")
        [ -z "$base" ] || counts_per_io base "$b" "$unit" >>"$tmp/lines"
        [ $((run % 2)) = 0 ] || { fio_case; counts_per_io fio "$g" "$unit" >>"$tmp/lines"; }
        echo "$f" >>"$tmp/$label.ferry"
        echo "$b" >>"$tmp/$label.base"
        echo "$g" >>"$tmp/$label.fio"
        awk -v f="$f" -v g="$g" 'BEGIN {printf "%.3f\n", f / g}' >>"$tmp/$label.pairs"
        printf 'run %s %-30s ferry %10s   base %10s   fio %10s %s   load %s\n' "$run" "$label" \
            "$f" "$b" "$g" "$unit" "$(cut -d' ' -f1 /proc/loadavg)"
        [ ! -s "$tmp/lines" ] || { cat "$tmp/lines"; rm -f "$tmp/lines"; }
    done
done
echo "medians of $runs runs (load average after: $(cut -d' ' -f1-3 /proc/loadavg)):"
echo "$cases" | while IFS='|' read -r label fe fioe op rw bs depth unit random jobs callers; do
    f=$(median <"$tmp/$label.ferry")
    g=$(median <"$tmp/$label.fio")
    line=$(printf '%-30s ferry %10s   fio %10s %s   ferry/fio %s   pairs %s' "$label" "$f" \
        "$g" "$unit" "$(awk -v f="$f" -v g="$g" 'BEGIN {printf "%.2f", f / g}')" \
        "$(median <"$tmp/$label.pairs")")
    if [ -n "$base" ]; then
        b=$(median <"$tmp/$label.base")
        line="$line$(printf '   base %10s   ferry/base %s' "$b" \
            "$(awk -v f="$f" -v b="$b" 'BEGIN {printf "%.2f", f / b}')")"
    fi
    echo "$line"
done

[ "${TCP:-1}" = 1 ] || exit 0
shm_file=/dev/shm/ferry-bench-tcp-storage.dat
tcp_run() { # remote memory
    FERRY_TRANSPORTS=tcp FERRY_MODULE_DIR="$build/modules/.libs" "$bench" --spawn \
        --transport=tcp --remote-memory="$1" --buffer-size=64m --operation=read --block-size=1m \
        --batch-size=32 --duration="$seconds" | sed -n 's/^RESULT.* gbps=\([0-9.]*\).*/\1/p'
}
for run in $(seq "$runs"); do
    m=$(tcp_run ferry)
    s=$(tcp_run "file:$shm_file")
    echo "$m" >>"$tmp/tcp.memory"
    echo "$s" >>"$tmp/tcp.storage"
    printf 'run %s tcp 1m read: memory %s GB/s, storage %s GB/s   load %s\n' "$run" "$m" "$s" \
        "$(cut -d' ' -f1 /proc/loadavg)"
done
rm -f "$shm_file"
m=$(median <"$tmp/tcp.memory")
s=$(median <"$tmp/tcp.storage")
printf 'tcp 1m read (medians): memory %s GB/s, storage %s GB/s, storage/memory %s\n' "$m" "$s" \
    "$(awk -v s="$s" -v m="$m" 'BEGIN {printf "%.2f", s / m}')"
