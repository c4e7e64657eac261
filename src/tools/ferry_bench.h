/* ferry_bench's parts in other files. */
#ifndef FERRY_BENCH_H
#define FERRY_BENCH_H

#include <ferry/ferry.h>

#include <stdio.h>

/* The command line (ferry_bench_options.c parses it). */
typedef struct ferry_bench_options {
    const char *mode;
    const char *metadata;
    const char *segment;
    const char *transport;
    const char *via;    /* --via: every request names this transport */
    int write;
    size_t block_size;
    size_t batch_size;
    unsigned threads;
    double duration;
    size_t buffer_size;
    /* --local-buffer-size: the initiator's buffer per thread, at most
     * buffer_size (its default): a request at block k of the target's
     * buffer uses block k modulo its blocks here */
    size_t local_buffer_size;
    int verify;
    int spawn;
    int latency;
    int pingpong;       /* --pingpong: half round trips of writes, see ferry_bench_pingpong.c */
    int baseline;       /* --memcpy-baseline */
    unsigned window;    /* --window: batches kept in flight by each thread */
    int random;         /* --random: blocks at random offsets of the buffer */
    /* --memory (both), --local-memory (the initiator's buffers),
     * --remote-memory (the target's): ferry_bench_memory.c */
    const char *local_memory;
    const char *remote_memory;
    /* --sweep[=MIN:MAX]: block sizes sweep_min, twice that, ... up to
     * sweep_max (block_size is sweep_max then); --format=csv: its rows as
     * CSV.  ferry_bench_sweep.c */
    int sweep;
    size_t sweep_min, sweep_max;
    int csv;
    int stats;          /* --stats: the engine's statistics after the run */
} ferry_bench_options_t;

/* --random's generator (xorshift64*): cheap, and the same sequence each run. */
static inline uint64_t ferry_bench_random(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545f4914f6cdd1dull;
}

/* 0, or -1 after a message on stderr (--help prints usage and exits). */
int ferry_bench_parse_options(int argc, char **argv, ferry_bench_options_t *o);

/* ferry_bench_samples.c: the clock, and latency samples in microseconds. */
typedef struct ferry_bench_samples {
    double *values;
    size_t count, capacity;
} ferry_bench_samples_t;

double ferry_bench_now(void); /* seconds, monotonic */
void ferry_bench_samples_add(ferry_bench_samples_t *s, double value);
/* Move from's samples into into (from is emptied). */
void ferry_bench_samples_merge(ferry_bench_samples_t *into, ferry_bench_samples_t *from);
/* Sorts the samples; 0 and 0 when there are none. */
void ferry_bench_samples_summary(ferry_bench_samples_t *s, double *median_p, double *p99_p);
void ferry_bench_samples_free(ferry_bench_samples_t *s);

/* --pingpong: where the send block starts in a side's buffer, past the
 * receive block at 0 and in other cache lines (the peer writes the receive
 * block while this side writes its send block: sharing a line would make
 * every round trip pay for moving it back and forth); the buffer holds
 * ferry_bench_pingpong_size(block) bytes. */
size_t ferry_bench_pingpong_stride(size_t block);
size_t ferry_bench_pingpong_size(size_t block);
/* Initiator side: buffer (ferry_bench_pingpong_size(block), registered for
 * remote writes) exchanges writes with the target's buffer at remote for duration
 * seconds; prints the PINGPONG line.  0 on success. */
int ferry_bench_pingpong_initiator(ferry_engine_h engine, ferry_segment_h segment,
                                   uint64_t remote, unsigned char *buffer, size_t block,
                                   double duration);
/* Target side: answer the exchange a "PINGPONG ..." notify asks for, with
 * buffer (size bytes) as the receive and send blocks; 0 when the notify is
 * something else or the exchange ended well. */
int ferry_bench_pingpong_target(ferry_engine_h engine, const ferry_notify_t *hello,
                                unsigned char *buffer, size_t size);

/* ferry_bench_memory.c: buffers at a memory location (--memory and
 * --local-memory / --remote-memory), and bytes in and out of them.  A
 * memory is "heap" (posix_memalign + ferry_register), "ferry" (ferry_alloc
 * at "cpu") or a location for ferry_alloc ("cpu", "cxl", "cuda:0", ...). */
int ferry_bench_memory_valid(const char *memory);
/* The location ferry_alloc or ferry_register gets ("cpu" for heap and ferry). */
const char *ferry_bench_memory_location(const char *memory);
/* Whether it is device memory, which the CPU must never touch. */
int ferry_bench_memory_is_device(const char *memory);
/* Whether it is a storage buffer ("file:PATH"): a target's buffer only. */
int ferry_bench_memory_is_storage(const char *memory);
unsigned char *ferry_bench_buffer_acquire(ferry_engine_h engine, const char *memory, size_t size);
void ferry_bench_buffer_release(ferry_engine_h engine, const char *memory, unsigned char *buffer);

/* The engine's own segment and a batch for copies within it: how bytes
 * reach device memory without the CPU touching it (one per thread). */
typedef struct ferry_bench_self {
    ferry_engine_h engine;
    ferry_segment_h segment;
    ferry_batch_h batch;
} ferry_bench_self_t;
ferry_status_t ferry_bench_self_open(ferry_bench_self_t *self, ferry_engine_h engine);
void ferry_bench_self_close(ferry_bench_self_t *self);
/* length bytes from host memory src into dst, memory of kind `memory`
 * (memcpy for host memory, else a WRITE within the own segment); get is
 * the reverse, into host memory dst. */
ferry_status_t ferry_bench_put(ferry_bench_self_t *self, const char *memory, void *dst,
                               const void *src, size_t length);
ferry_status_t ferry_bench_get(ferry_bench_self_t *self, const char *memory, void *dst,
                               const void *src, size_t length);
/* buffer[i] = byte(i, arg) for i < length, through a host staging buffer
 * when it is device memory. */
ferry_status_t ferry_bench_fill(ferry_bench_self_t *self, const char *memory,
                                unsigned char *buffer, size_t length,
                                unsigned char (*byte)(size_t index, void *arg), void *arg);

/* The initiator's side of a run (ferry_bench.c): its engine, the target's
 * segment, and each thread's part (stride bytes) of the local buffer and
 * of the target's buffer at remote. */
typedef struct ferry_bench_peer {
    ferry_engine_h engine;
    ferry_segment_h segment;
    unsigned char *local;
    uint64_t remote;
    size_t stride;       /* the target's buffer per thread */
    size_t local_stride; /* the initiator's buffer per thread */
} ferry_bench_peer_t;

/* What one measurement moved, summed over its threads. */
typedef struct ferry_bench_result {
    uint64_t bytes, requests;
    double seconds;                /* the slowest thread's */
    int failed;
    char transport[32];            /* the first batch's, "?" when unknown */
    ferry_bench_samples_t samples; /* --latency: microseconds; the caller frees them */
} ferry_bench_result_t;

/* Run o's threads against peer for o->duration (each thread's blocks wrap
 * around o->buffer_size <= peer->stride bytes).  0, or -1 when a thread
 * failed (it said why on stderr). */
int ferry_bench_measure(const ferry_bench_options_t *o, const ferry_bench_peer_t *peer,
                        ferry_bench_result_t *result_p);
/* Single-thread memcpy of o's blocks between two buffers of o's local
 * memory kind: GB/s, negative when it cannot be measured (device memory). */
double ferry_bench_memcpy_gbps(const ferry_bench_options_t *o, ferry_engine_h engine,
                               const unsigned char *src);

/* ferry_bench_sweep.c: --sweep[=MIN:MAX] ("MIN:MAX", or NULL for the
 * default range) into o; 0, or -1 after a message on stderr. */
int ferry_bench_sweep_parse(const char *text, ferry_bench_options_t *o);
/* Every block size of o's sweep against peer, one row each on stdout;
 * 0, or -1 when a measurement failed. */
int ferry_bench_sweep(const ferry_bench_options_t *o, const ferry_bench_peer_t *peer);
/* ferry_bench_stats.c: --stats, the engine's statistics per transport and
 * per peer (ferry_stats_snapshot) as a short table, and STATS lines. */
void ferry_bench_stats_print(ferry_engine_h engine, FILE *out);

/* --metadata-ops: control-plane latency, in ferry_bench_metadata.c */
int ferry_bench_metadata_main(int argc, char **argv);

#endif
