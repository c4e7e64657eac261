/*
 * ferry_bench: transfer throughput between two engines, in the manner of
 * Mooncake's transfer_engine_bench.  One process is the target (registers a
 * buffer and waits), the other the initiator (opens the target's segment and
 * moves blocks in batches for a duration).  --spawn runs both from one
 * command.  Blocks wrap around each thread's buffer, so a buffer smaller than
 * batch x block stays cache-resident like ucx_perftest's single buffer.
 */
#include <ferry/ferry.h>

#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferry_bench.h"

#define SEGMENT_LINE "FERRY_BENCH_SEGMENT "

typedef ferry_bench_options_t options_t;

typedef struct thread_ctx {
    const options_t *opts;
    ferry_engine_h engine;
    ferry_segment_h segment;
    unsigned char *local;   /* this thread's part of the local buffer */
    uint64_t remote;        /* this thread's part of the remote buffer */
    pthread_barrier_t *start;
    uint64_t bytes, requests, batches;
    double seconds;
    int failed;
    char transport[32];
    ferry_bench_samples_t samples; /* --latency: microseconds per request */
    ferry_bench_self_t self;       /* --verify of device memory: copies within our segment */
} thread_ctx_t;

/* One of a thread's --window batches. */
typedef struct slot {
    ferry_batch_h batch;
    ferry_request_t *reqs;
    size_t first;   /* the index of its first block (--verify) */
    unsigned round; /* the pattern round its writes carry (--verify) */
    int busy;       /* submitted, not yet waited for */
} slot_t;

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    stop_requested = 1;
}

#define LATENCY_GROUP 32

/* The byte a target holds at offset o of its buffer (read --verify). */
static unsigned char pattern(uint64_t offset, unsigned round)
{
    return (unsigned char)((offset * 131u + round * 17u + 7u) >> 3);
}

static int make_engine(const options_t *o, ferry_engine_h *engine_p)
{
    ferry_config_t config = {0};
    if (o->metadata) {
        config.field_mask |= FERRY_CONFIG_FIELD_METADATA;
        config.metadata = o->metadata;
    }
    if (o->transport) {
        config.field_mask |= FERRY_CONFIG_FIELD_TRANSPORTS;
        config.transports = o->transport;
    }
    ferry_status_t status = ferry_engine_create(&config, engine_p);
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: engine: %s\n", ferry_status_string(status));
        return -1;
    }
    return 0;
}

/* The byte a target holds at offset i of its buffer (pattern round 0). */
static unsigned char target_byte(size_t i, void *arg)
{
    const options_t *o = arg;
    return pattern(i % o->buffer_size, 0);
}

static int run_target(const options_t *o)
{
    ferry_engine_h engine;
    if (make_engine(o, &engine))
        return 1;
    size_t total = o->buffer_size * o->threads;
    unsigned char *buffer = ferry_bench_buffer_acquire(engine, o->remote_memory, total);
    if (buffer == NULL) {
        ferry_engine_destroy(engine);
        return 1;
    }
    ferry_bench_self_t self = {0};
    ferry_status_t status = FERRY_OK;
    if (ferry_bench_memory_is_device(o->remote_memory))
        status = ferry_bench_self_open(&self, engine);
    if (status == FERRY_OK)
        status = ferry_bench_fill(&self, o->remote_memory, buffer, total, target_byte,
                                  (void *)o);
    ferry_bench_self_close(&self);
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: target: cannot fill its buffer at %s: %s\n",
                ferry_bench_memory_location(o->remote_memory), ferry_status_string(status));
        ferry_bench_buffer_release(engine, o->remote_memory, buffer);
        ferry_engine_destroy(engine);
        return 1;
    }
    printf(SEGMENT_LINE "%s\n", ferry_engine_segment_name(engine));
    printf("FERRY_BENCH_BUFFER 0x%" PRIxPTR " %zu\n", (uintptr_t)buffer, total);
    fflush(stdout);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    /* Serve until SIGTERM/SIGINT; a spawned target also ends when its parent
     * closes our stdin (or dies). */
    int failed = 0;
    while (!stop_requested) {
        struct pollfd pfd = {.fd = o->spawn ? 0 : -1, .events = POLLIN};
        int rc = poll(&pfd, 1, 50);
        if (rc > 0) {
            char scratch[256];
            if (read(0, scratch, sizeof(scratch)) <= 0)
                break;
        }
        /* An initiator's --pingpong asks us to write back. */
        ferry_notify_t hello;
        size_t count = 0;
        if (ferry_notify_recv(engine, &hello, 1, &count) == FERRY_OK && count == 1 &&
            ferry_bench_pingpong_target(engine, &hello, buffer, total) != 0)
            failed = 1;
    }
    ferry_bench_buffer_release(engine, o->remote_memory, buffer);
    ferry_engine_destroy(engine);
    return failed;
}

/* Check the blocks of the batch just completed: a write's blocks are read
 * back from the target, a read's compared where they landed (through
 * scratch, host memory, when that is device memory). */
static int verify_blocks(thread_ctx_t *ctx, ferry_batch_h batch, size_t first, unsigned round,
                         unsigned char *scratch)
{
    const options_t *o = ctx->opts;
    size_t slots = o->buffer_size / o->block_size;
    for (size_t i = 0; i < o->batch_size; i++) {
        size_t offset = ((first + i) % slots) * o->block_size;
        unsigned char *got = ctx->local + offset;
        ferry_status_t status = FERRY_OK;
        if (o->write) {
            /* Read the block back and compare with what was written. */
            ferry_request_t req = {.opcode = FERRY_OP_READ, .local = scratch,
                                   .target = ctx->segment, .target_offset = ctx->remote + offset,
                                   .length = o->block_size};
            status = ferry_batch_submit(batch, &req, 1);
            if (status == FERRY_OK)
                status = ferry_batch_wait(batch, -1);
            got = scratch;
        } else if (ferry_bench_memory_is_device(o->local_memory)) {
            status = ferry_bench_get(&ctx->self, o->local_memory, scratch, got, o->block_size);
            got = scratch;
        }
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench: verify: cannot fetch block offset %zu: %s\n", offset,
                    ferry_status_string(status));
            return -1;
        }
        for (size_t b = 0; b < o->block_size; b++) {
            unsigned char want = pattern(offset + b, o->write ? round : 0);
            if (got[b] != want) {
                fprintf(stderr, "ferry_bench: verify failed at block offset %zu byte %zu: got "
                        "0x%02x, want 0x%02x\n", offset, b, got[b], want);
                return -1;
            }
        }
    }
    return 0;
}

/* --verify of a write: the pattern of this round into the local block
 * (through scratch when it is device memory). */
static int fill_block(thread_ctx_t *ctx, size_t offset, unsigned round, unsigned char *scratch)
{
    const options_t *o = ctx->opts;
    int device = ferry_bench_memory_is_device(o->local_memory);
    unsigned char *to = device ? scratch : ctx->local + offset;
    for (size_t b = 0; b < o->block_size; b++)
        to[b] = pattern(offset + b, round);
    if (!device)
        return 0;
    ferry_status_t status =
        ferry_bench_put(&ctx->self, o->local_memory, ctx->local + offset, scratch, o->block_size);
    if (status != FERRY_OK)
        fprintf(stderr, "ferry_bench: verify: cannot fill block offset %zu: %s\n", offset,
                ferry_status_string(status));
    return status == FERRY_OK ? 0 : -1;
}

/* Wait for a slot's batch and count what it moved. */
static int complete_slot(thread_ctx_t *ctx, slot_t *slot, unsigned char *scratch)
{
    const options_t *o = ctx->opts;
    ferry_status_t status = ferry_batch_wait(slot->batch, -1);
    slot->busy = 0;
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: batch failed: %s\n", ferry_status_string(status));
        return -1;
    }
    if (ctx->batches == 0) {
        ferry_xfer_status_t xs;
        if (ferry_batch_status(slot->batch, 0, &xs) == FERRY_OK)
            snprintf(ctx->transport, sizeof(ctx->transport), "%s", xs.transport);
    }
    ctx->batches++;
    ctx->requests += o->batch_size;
    ctx->bytes += (uint64_t)o->batch_size * o->block_size;
    if (o->verify && verify_blocks(ctx, slot->batch, slot->first, slot->round, scratch) != 0)
        return -1;
    return 0;
}

static void slots_free(slot_t *slots, unsigned count)
{
    for (unsigned i = 0; slots && i < count; i++) {
        if (slots[i].batch)
            ferry_batch_destroy(slots[i].batch);
        free(slots[i].reqs);
    }
    free(slots);
}

static slot_t *slots_create(thread_ctx_t *ctx)
{
    const options_t *o = ctx->opts;
    slot_t *slots = calloc(o->window, sizeof(*slots));
    for (unsigned i = 0; slots && i < o->window; i++) {
        slots[i].reqs = calloc(o->batch_size, sizeof(*slots[i].reqs));
        if (slots[i].reqs == NULL ||
            ferry_batch_create(ctx->engine, o->batch_size, &slots[i].batch) != FERRY_OK) {
            slots_free(slots, o->window);
            return NULL;
        }
    }
    return slots;
}

/*
 * Batches go out in turn from --window slots: a slot is waited for only
 * when its turn comes again, so up to window batches are in flight (with
 * one slot, each batch is waited for right after its submit).
 */
static void *initiator_thread(void *arg)
{
    thread_ctx_t *ctx = arg;
    const options_t *o = ctx->opts;
    slot_t *slots = slots_create(ctx);
    unsigned char *scratch = o->verify ? malloc(o->block_size) : NULL;
    size_t slots_in_buffer = o->buffer_size / o->block_size;
    size_t local_slots = o->local_buffer_size / o->block_size;
    int self_needed = o->verify && ferry_bench_memory_is_device(o->local_memory);
    ferry_status_t status = self_needed ? ferry_bench_self_open(&ctx->self, ctx->engine)
                                        : FERRY_OK;
    pthread_barrier_wait(ctx->start);
    if (status != FERRY_OK || slots == NULL || (o->verify && scratch == NULL)) {
        ctx->failed = 1;
        slots_free(slots, o->window);
        free(scratch);
        ferry_bench_self_close(&ctx->self);
        return NULL;
    }
    size_t next = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)ctx; /* --random */
    unsigned round = 0, turn = 0;
    double begin = ferry_bench_now(), end = begin + o->duration;
    /* Latency samples are the mean of LATENCY_GROUP consecutive requests
     * (each submitted and waited for alone): reading the clock around every
     * request would add its own cost, which on a VM is a good part of a
     * sub-microsecond request. */
    double group_start = begin;
    unsigned in_group = 0;
    do {
        slot_t *slot = &slots[turn];
        if (slot->busy && complete_slot(ctx, slot, scratch) != 0) {
            ctx->failed = 1;
            break;
        }
        slot->first = next;
        slot->round = round;
        for (size_t i = 0; i < o->batch_size; i++, next++) {
            size_t block = o->random ? (size_t)(ferry_bench_random(&rng) % slots_in_buffer)
                                     : next % slots_in_buffer;
            size_t offset = block * o->block_size;
            if (o->verify && o->write && fill_block(ctx, offset, round, scratch) != 0) {
                ctx->failed = 1;
                break;
            }
            slot->reqs[i] = (ferry_request_t){.opcode = o->write ? FERRY_OP_WRITE : FERRY_OP_READ,
                                              .local = ctx->local +
                                                       block % local_slots * o->block_size,
                                              .target = ctx->segment,
                                              .target_offset = ctx->remote + offset,
                                              .length = o->block_size, .transport = o->via};
        }
        if (ctx->failed)
            break;
        status = ferry_batch_submit(slot->batch, slot->reqs, o->batch_size);
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench: submit failed: %s\n", ferry_status_string(status));
            ctx->failed = 1;
            break;
        }
        slot->busy = 1;
        if (o->window == 1 && complete_slot(ctx, slot, scratch) != 0) {
            ctx->failed = 1;
            break;
        }
        if (o->latency && ++in_group == LATENCY_GROUP) {
            double group_end = ferry_bench_now();
            double us = (group_end - group_start) * 1e6 / LATENCY_GROUP;
            group_start = group_end;
            in_group = 0;
            ferry_bench_samples_add(&ctx->samples, us);
        }
        turn = (turn + 1) % o->window;
        round++;
    } while ((in_group != 0 || ferry_bench_now() < end) && !stop_requested);
    /* The batches still in flight count: the time runs until they end. */
    for (unsigned i = 0; i < o->window; i++)
        if (slots[i].busy && complete_slot(ctx, &slots[i], scratch) != 0)
            ctx->failed = 1;
    ctx->seconds = ferry_bench_now() - begin;
    slots_free(slots, o->window);
    free(scratch);
    ferry_bench_self_close(&ctx->self);
    return NULL;
}

/* What one thread's memcpy does with the same blocks, wrapping around a
 * buffer of the same size and kind (--memory) as the target's: the ceiling
 * of a same-host copy, so the ratio is what the transport costs.  GB/s, or
 * a negative number when it cannot be measured (device memory: the CPU
 * cannot copy it; the device's own copy rate is what
 * contrib/gpu_baseline.cu measures). */
double ferry_bench_memcpy_gbps(const options_t *o, ferry_engine_h engine, const unsigned char *src)
{
    if (ferry_bench_memory_is_device(o->local_memory))
        return -1;
    unsigned char *dst = ferry_bench_buffer_acquire(engine, o->local_memory, o->buffer_size);
    if (dst == NULL)
        return -1;
    memset(dst, 0, o->buffer_size);
    size_t slots = o->buffer_size / o->block_size, next = 0;
    double seconds = o->duration < 1.0 ? o->duration : 1.0;
    double begin = ferry_bench_now(), elapsed;
    uint64_t bytes = 0;
    do {
        for (int i = 0; i < 64; i++, next++) {
            size_t offset = (next % slots) * o->block_size;
            memcpy(dst + offset, src + offset, o->block_size);
            bytes += o->block_size;
        }
        elapsed = ferry_bench_now() - begin;
    } while (elapsed < seconds);
    ferry_bench_buffer_release(engine, o->local_memory, dst);
    return bytes / elapsed / 1e9;
}

static void memcpy_baseline(const options_t *o, ferry_engine_h engine, const unsigned char *src)
{
    if (ferry_bench_memory_is_device(o->local_memory)) {
        printf("memcpy baseline: skipped: %s is device memory\n", o->local_memory);
        return;
    }
    double gbps = ferry_bench_memcpy_gbps(o, engine, src);
    if (gbps < 0)
        return;
    printf("memcpy baseline: %.3f GB/s, block %zu B, buffer %zu B, single thread\n", gbps,
           o->block_size, o->buffer_size);
    printf("BASELINE memcpy block_size=%zu gbps=%.4f\n", o->block_size, gbps);
    fflush(stdout);
}

/* The first request to the target, submit to completion: what a new peer
 * costs (connection, descriptor confirmation, a GPU IPC open) on top of a
 * request.  A small one, so the time is not the copy's. */
static int first_request(const options_t *o, ferry_engine_h engine, ferry_segment_h segment,
                         unsigned char *buffer, uint64_t remote, double open_seconds, FILE *out)
{
    ferry_batch_h batch;
    ferry_status_t status = ferry_batch_create(engine, 1, &batch);
    if (status != FERRY_OK)
        return -1;
    size_t length = o->block_size < 64 ? o->block_size : 64;
    ferry_request_t req = {.opcode = o->write ? FERRY_OP_WRITE : FERRY_OP_READ, .local = buffer,
                           .target = segment, .target_offset = remote, .length = length,
                           .transport = o->via};
    double begin = ferry_bench_now();
    status = ferry_batch_submit(batch, &req, 1);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, -1);
    double us = (ferry_bench_now() - begin) * 1e6;
    ferry_xfer_status_t xs;
    const char *transport = "?";
    if (status == FERRY_OK && ferry_batch_status(batch, 0, &xs) == FERRY_OK && xs.transport)
        transport = xs.transport;
    if (status != FERRY_OK)
        fprintf(stderr, "ferry_bench: the first request failed: %s\n",
                ferry_status_string(status));
    fprintf(out, "first request: %.1f us (%s of %zu B over %s; segment open %.1f us before it)\n",
            us, o->write ? "write" : "read", length, transport, open_seconds * 1e6);
    fprintf(out, "FIRST operation=%s transport=%s length=%zu first_us=%.1f open_us=%.1f "
            "local_memory=%s remote_memory=%s status=%s\n", o->write ? "write" : "read",
            transport, length, us, open_seconds * 1e6, o->local_memory, o->remote_memory,
            status == FERRY_OK ? "ok" : "failed");
    fflush(out);
    ferry_batch_destroy(batch);
    return status == FERRY_OK ? 0 : -1;
}

int ferry_bench_measure(const options_t *o, const ferry_bench_peer_t *peer,
                        ferry_bench_result_t *result_p)
{
    *result_p = (ferry_bench_result_t){.failed = 1};
    snprintf(result_p->transport, sizeof(result_p->transport), "?");
    thread_ctx_t *ctxs = calloc(o->threads, sizeof(*ctxs));
    pthread_t *tids = calloc(o->threads, sizeof(*tids));
    pthread_barrier_t start;
    if (ctxs == NULL || tids == NULL || pthread_barrier_init(&start, NULL, o->threads + 1)) {
        fprintf(stderr, "ferry_bench: no memory for %u threads\n", o->threads);
        free(ctxs);
        free(tids);
        return -1;
    }
    for (unsigned t = 0; t < o->threads; t++) {
        ctxs[t] = (thread_ctx_t){.opts = o, .engine = peer->engine, .segment = peer->segment,
                                 .local = peer->local + (size_t)t * peer->local_stride,
                                 .remote = peer->remote + (uint64_t)t * peer->stride,
                                 .start = &start};
        pthread_create(&tids[t], NULL, initiator_thread, &ctxs[t]);
    }
    pthread_barrier_wait(&start);
    ferry_bench_result_t *r = result_p;
    r->failed = 0;
    for (unsigned t = 0; t < o->threads; t++) {
        pthread_join(tids[t], NULL);
        ferry_bench_samples_merge(&r->samples, &ctxs[t].samples);
        r->bytes += ctxs[t].bytes;
        r->requests += ctxs[t].requests;
        r->failed |= ctxs[t].failed;
        if (ctxs[t].seconds > r->seconds)
            r->seconds = ctxs[t].seconds;
    }
    if (r->seconds <= 0)
        r->seconds = 1e-9;
    if (ctxs[0].transport[0])
        snprintf(r->transport, sizeof(r->transport), "%s", ctxs[0].transport);
    pthread_barrier_destroy(&start);
    free(ctxs);
    free(tids);
    return r->failed ? -1 : 0;
}

static int run_initiator(const options_t *o, const char *segment_name)
{
    ferry_engine_h engine;
    ferry_segment_h segment;
    if (make_engine(o, &engine))
        return 1;
    double open_begin = ferry_bench_now();
    ferry_status_t status = ferry_segment_open(engine, segment_name, &segment);
    double open_seconds = ferry_bench_now() - open_begin;
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: open segment %s: %s\n", segment_name,
                ferry_status_string(status));
        ferry_engine_destroy(engine);
        return 1;
    }
    /* The remote buffer is the segment's first (and only) buffer. */
    char *json = NULL;
    uint64_t remote = 0;
    if (ferry_segment_describe(engine, segment, &json) == FERRY_OK) {
        const char *addr = strstr(json, "\"addr\":\"");
        if (addr)
            remote = strtoull(addr + 8, NULL, 16);
    }
    free(json);
    if (remote == 0) {
        fprintf(stderr, "ferry_bench: segment %s has no buffer\n", segment_name);
        ferry_engine_destroy(engine);
        return 1;
    }
    size_t total = o->local_buffer_size * o->threads;
    unsigned char *buffer = ferry_bench_buffer_acquire(engine, o->local_memory, total);
    if (buffer == NULL) {
        ferry_engine_destroy(engine);
        return 1;
    }
    if (!ferry_bench_memory_is_device(o->local_memory))
        memset(buffer, 0, total);
    if (o->baseline && !o->sweep) /* a sweep measures it at each size */
        memcpy_baseline(o, engine, buffer);
    if (o->pingpong) {
        int rc = ferry_bench_pingpong_initiator(engine, segment, remote, buffer, o->block_size,
                                                o->duration);
        ferry_segment_close(engine, segment);
        ferry_bench_buffer_release(engine, o->local_memory, buffer);
        ferry_engine_destroy(engine);
        return rc ? 1 : 0;
    }
    /* A sweep's CSV is its whole stdout. */
    FILE *notes = o->sweep && o->csv ? stderr : stdout;
    if (first_request(o, engine, segment, buffer, remote, open_seconds, notes) != 0) {
        ferry_segment_close(engine, segment);
        ferry_bench_buffer_release(engine, o->local_memory, buffer);
        ferry_engine_destroy(engine);
        return 1;
    }
    ferry_bench_peer_t peer = {.engine = engine, .segment = segment, .local = buffer,
                               .remote = remote, .stride = o->buffer_size,
                               .local_stride = o->local_buffer_size};
    if (o->sweep) {
        int rc = ferry_bench_sweep(o, &peer);
        if (o->stats)
            ferry_bench_stats_print(engine, notes);
        ferry_segment_close(engine, segment);
        ferry_bench_buffer_release(engine, o->local_memory, buffer);
        ferry_engine_destroy(engine);
        return rc ? 1 : 0;
    }
    ferry_bench_result_t result;
    ferry_bench_measure(o, &peer, &result);
    uint64_t bytes = result.bytes, requests = result.requests;
    double seconds = result.seconds;
    int failed = result.failed;
    ferry_bench_samples_t samples = result.samples;
    const char *transport = result.transport;
    char local_buffer[48] = "";
    if (o->local_buffer_size != o->buffer_size)
        snprintf(local_buffer, sizeof(local_buffer), " (here %zu B)", o->local_buffer_size);
    printf("ferry_bench: %s, transport %s, block %zu B, batch %zu, window %u, threads %u, "
           "buffer %zu B%s, memory %s -> %s, %.2f s%s\n", o->write ? "write" : "read",
           transport, o->block_size, o->batch_size, o->window, o->threads, o->buffer_size,
           local_buffer, o->local_memory, o->remote_memory, seconds,
           o->verify ? ", verified" : "");
    printf("throughput: %.3f GB/s, %.0f requests/s\n", bytes / seconds / 1e9,
           requests / seconds);
    printf("RESULT operation=%s transport=%s block_size=%zu batch_size=%zu threads=%u "
           "seconds=%.3f bytes=%" PRIu64 " gbps=%.4f requests_per_s=%.0f verified=%s "
           "status=%s window=%u local_memory=%s remote_memory=%s\n", o->write ? "write" : "read",
           transport, o->block_size, o->batch_size,
           o->threads, seconds, bytes, bytes / seconds / 1e9, requests / seconds,
           o->verify ? "yes" : "no", failed ? "failed" : "ok", o->window, o->local_memory,
           o->remote_memory);
    if (o->latency) {
        size_t n_samples = samples.count;
        double median, p99;
        ferry_bench_samples_summary(&samples, &median, &p99);
        printf("latency: median %.2f us, 99th percentile %.2f us, %zu requests\n", median,
               p99, n_samples);
        printf("LATENCY operation=%s transport=%s block_size=%zu median_us=%.3f p99_us=%.3f "
               "samples=%zu local_memory=%s remote_memory=%s\n", o->write ? "write" : "read",
               transport, o->block_size, median, p99,
               n_samples, o->local_memory, o->remote_memory);
    }
    ferry_bench_samples_free(&samples);
    if (o->stats)
        ferry_bench_stats_print(engine, stdout);
    fflush(stdout);
    ferry_segment_close(engine, segment);
    ferry_bench_buffer_release(engine, o->local_memory, buffer);
    ferry_engine_destroy(engine);
    return failed ? 1 : 0;
}

/* Start "argv[0] --mode=target ..." with a pipe on its stdin (its lifeline)
 * and one on its stdout (its segment name). */
static int spawn_target(char **argv, const options_t *o, pid_t *pid_p, int *lifeline_p,
                        char *segment, size_t segment_len)
{
    int to_child[2], from_child[2];
    if (pipe(to_child) || pipe(from_child))
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        close(to_child[1]);
        close(from_child[0]);
        char buffer_size[32], threads[16];
        snprintf(buffer_size, sizeof(buffer_size), "--buffer-size=%zu", o->buffer_size);
        snprintf(threads, sizeof(threads), "--threads=%u", o->threads);
        char *args[12];
        int n = 0;
        args[n++] = argv[0];
        args[n++] = "--mode=target";
        args[n++] = "--spawn";
        args[n++] = buffer_size;
        args[n++] = threads;
        char metadata[512], transport[256], memory[128];
        if (o->metadata) {
            snprintf(metadata, sizeof(metadata), "--metadata=%s", o->metadata);
            args[n++] = metadata;
        }
        if (o->transport) {
            snprintf(transport, sizeof(transport), "--transport=%s", o->transport);
            args[n++] = transport;
        }
        snprintf(memory, sizeof(memory), "--remote-memory=%s", o->remote_memory);
        args[n++] = memory;
        args[n] = NULL;
        execv("/proc/self/exe", args);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    FILE *in = fdopen(from_child[0], "r");
    char line[1024];
    int found = 0;
    while (!found && in && fgets(line, sizeof(line), in)) {
        if (strncmp(line, SEGMENT_LINE, strlen(SEGMENT_LINE)) == 0) {
            snprintf(segment, segment_len, "%s", line + strlen(SEGMENT_LINE));
            segment[strcspn(segment, "\n")] = '\0';
            found = 1;
        }
    }
    if (in)
        fclose(in);
    *pid_p = pid;
    *lifeline_p = to_child[1];
    return found ? 0 : -1;
}

static int wants_metadata_ops(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--metadata-ops") == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    options_t o;
    if (wants_metadata_ops(argc, argv))
        return ferry_bench_metadata_main(argc, argv);
    if (ferry_bench_parse_options(argc, argv, &o) != 0)
        return 2;
    signal(SIGPIPE, SIG_IGN);
    if (strcmp(o.mode, "target") == 0)
        return run_target(&o);
    if (!o.spawn)
        return run_initiator(&o, o.segment);

    pid_t pid;
    int lifeline;
    char segment[1024];
    if (spawn_target(argv, &o, &pid, &lifeline, segment, sizeof(segment)) != 0) {
        fprintf(stderr, "ferry_bench: the target process did not start\n");
        return 1;
    }
    int rc = run_initiator(&o, segment);
    close(lifeline); /* the target sees EOF and exits */
    int wstatus;
    waitpid(pid, &wstatus, 0);
    return rc;
}
