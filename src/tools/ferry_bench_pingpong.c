/*
 * ferry_bench --pingpong: the latency of a write with completion measured
 * the way ucx_perftest's put_lat and OSU's latency tests measure it, as half
 * of a round trip in which each side writes into the other's memory.
 *
 * Each side's registered buffer holds a receive block at offset 0 (the peer
 * writes there) and a send block after it, in cache lines of its own (as
 * OSU's separate send and receive buffers are).  The last 8 bytes of a
 * block carry a sequence number.  The initiator writes seq into the
 * target's receive block, waits for the write to complete, then polls its
 * own receive block until the target's write of seq lands; the target polls,
 * then writes seq back and waits for completion.  Every write completes
 * (the data is in the peer's memory) before that side's next one.  The
 * initiator tells the target where its buffer is by a notify
 * "PINGPONG <segment> <address hex> <block>"; the target clears its receive
 * block and writes PINGPONG_READY into the initiator's, and the initiator
 * starts once it sees that (so no write lands before the target listens).
 * The initiator ends the exchange by writing PINGPONG_END.
 *
 * Polling is bounded: a side that sees nothing new for POLL_LIMIT_S gives
 * up (the peer died), so the benchmark never hangs.
 */
#include "ferry_bench.h"
#include "../util/tsan_annotate.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PINGPONG_PREFIX        "PINGPONG "
#define PINGPONG_END           UINT64_MAX
#define PINGPONG_READY         (UINT64_MAX - 1)
#define POLL_LIMIT_S           10.0
#define ROUND_TRIPS_PER_SAMPLE 32

/* Two cache lines (the adjacent-line prefetcher moves pairs) between the
 * blocks. */
#define PINGPONG_LINE_GAP 128

size_t ferry_bench_pingpong_stride(size_t block)
{
    return (block + 2 * PINGPONG_LINE_GAP - 1) / PINGPONG_LINE_GAP * PINGPONG_LINE_GAP;
}

size_t ferry_bench_pingpong_size(size_t block)
{
    return ferry_bench_pingpong_stride(block) + block;
}

/* The sequence word at the end of a block (written by the peer's transport).
 * A receive block is written while we poll it, as RDMA's polling idiom: by
 * the peer process (shm, cxl, ucx) or, over tcp, by our tcp target's thread
 * serving the peer; the peer's turn-taking and the fences order it, which
 * ThreadSanitizer cannot follow (util/tsan_annotate.h). */
static uint64_t seq_load(const unsigned char *block, size_t length)
{
    uint64_t seq;
    FERRY_TSAN_IGNORE_BEGIN();
    memcpy(&seq, block + length - sizeof(seq), sizeof(seq));
    FERRY_TSAN_IGNORE_END();
    return seq;
}

static void seq_store(unsigned char *block, size_t length, uint64_t seq)
{
    memcpy(block + length - sizeof(seq), &seq, sizeof(seq));
}

/* Spin until the receive block's sequence word is want (exact) or differs
 * from want (!exact), progressing the engine as ucx_perftest's loop calls
 * ucp_worker_progress; *got_p is what it saw.  0 on success, -1 after
 * POLL_LIMIT_S without it. */
static int poll_seq(ferry_engine_h engine, const volatile unsigned char *block, size_t length,
                    uint64_t want, int exact, uint64_t *got_p)
{
    double limit = 0;
    for (unsigned spins = 0;; spins++) {
        atomic_thread_fence(memory_order_acquire);
        uint64_t seq = seq_load((const unsigned char *)block, length);
        if ((seq == want) == (exact != 0)) {
            *got_p = seq;
            return 0;
        }
        ferry_engine_progress(engine);
        if ((spins & 4095) == 4095) { /* a reply in time costs no clock read */
            double now = ferry_bench_now();
            if (limit == 0)
                limit = now + POLL_LIMIT_S;
            else if (now > limit)
                return -1;
        }
    }
}

static ferry_status_t write_and_complete(ferry_batch_h batch, unsigned char *local,
                                         ferry_segment_h segment, uint64_t remote, size_t length)
{
    ferry_request_t req = {.opcode = FERRY_OP_WRITE,
                           .local = local,
                           .target = segment,
                           .target_offset = remote,
                           .length = length};
    ferry_status_t status = ferry_batch_submit(batch, &req, 1);
    return status == FERRY_OK ? ferry_batch_wait(batch, -1) : status;
}

int ferry_bench_pingpong_initiator(ferry_engine_h engine, ferry_segment_h segment, uint64_t remote,
                                   unsigned char *buffer, size_t block, double duration)
{
    unsigned char *receive = buffer, *send = buffer + ferry_bench_pingpong_stride(block);
    char hello[512];
    int n = snprintf(hello, sizeof(hello), PINGPONG_PREFIX "%s %" PRIxPTR " %zu",
                     ferry_engine_segment_name(engine), (uintptr_t)buffer, block);
    ferry_status_t status = ferry_notify_send(engine, segment, hello, (size_t)n);
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: pingpong: notify to the target failed: %s\n",
                ferry_status_string(status));
        return -1;
    }
    ferry_batch_h batch;
    if (ferry_batch_create(engine, 1, &batch) != FERRY_OK)
        return -1;
    ferry_bench_samples_t samples = {0};
    char transport[32] = "?";
    uint64_t seq = 0, got = 0;
    int failed = 0;
    if (!failed && poll_seq(engine, receive, block, PINGPONG_READY, 1, &got) != 0) {
        fprintf(stderr, "ferry_bench: pingpong: the target did not answer in %.0f s\n",
                POLL_LIMIT_S);
        failed = 1;
    }
    double begin = ferry_bench_now(), group = begin, end = begin + duration;
    while (!failed) {
        seq_store(send, block, ++seq);
        status = write_and_complete(batch, send, segment, remote, block);
        if (status != FERRY_OK) {
            fprintf(stderr, "ferry_bench: pingpong: write failed: %s\n",
                    ferry_status_string(status));
            failed = 1;
            break;
        }
        if (seq == 1) {
            ferry_xfer_status_t xs;
            if (ferry_batch_status(batch, 0, &xs) == FERRY_OK)
                snprintf(transport, sizeof(transport), "%s", xs.transport);
        }
        if (poll_seq(engine, receive, block, seq, 1, &got) != 0) {
            fprintf(stderr, "ferry_bench: pingpong: no reply for %.0f s (round trip %" PRIu64 ")\n",
                    POLL_LIMIT_S, seq);
            failed = 1;
            break;
        }
        if (seq % ROUND_TRIPS_PER_SAMPLE == 0) {
            double now = ferry_bench_now();
            /* half a round trip, mean of the group */
            ferry_bench_samples_add(&samples, (now - group) * 1e6 / ROUND_TRIPS_PER_SAMPLE / 2);
            group = now;
            if (now >= end)
                break;
        }
    }
    if (!failed) {
        seq_store(send, block, PINGPONG_END);
        write_and_complete(batch, send, segment, remote, block);
    }
    ferry_batch_destroy(batch);
    size_t count = samples.count;
    if (count > 0) {
        double median, p99;
        ferry_bench_samples_summary(&samples, &median, &p99);
        printf("ferry_bench: pingpong, transport %s, block %zu B, %" PRIu64 " round trips\n",
               transport, block, seq);
        printf("latency (half round trip): median %.3f us, 99th percentile %.3f us\n", median, p99);
        printf(
            "PINGPONG transport=%s block_size=%zu median_us=%.3f p99_us=%.3f round_trips=%" PRIu64
            " status=%s\n",
            transport, block, median, p99, seq, failed ? "failed" : "ok");
    }
    ferry_bench_samples_free(&samples);
    return failed || count == 0 ? -1 : 0;
}

int ferry_bench_pingpong_target(ferry_engine_h engine, const ferry_notify_t *hello,
                                unsigned char *buffer, size_t size)
{
    char name[256];
    uintptr_t peer_buffer;
    size_t block;
    char text[FERRY_NOTIFY_MAX + 1];
    memcpy(text, hello->msg, hello->length);
    text[hello->length] = '\0';
    if (strncmp(text, PINGPONG_PREFIX, strlen(PINGPONG_PREFIX)) != 0)
        return 0; /* not for us */
    if (sscanf(text + strlen(PINGPONG_PREFIX), "%255s %" SCNxPTR " %zu", name, &peer_buffer,
               &block) != 3 ||
        block < sizeof(uint64_t) || ferry_bench_pingpong_size(block) > size) {
        fprintf(stderr, "ferry_bench: target: bad pingpong request \"%s\"\n", text);
        return -1;
    }
    ferry_segment_h segment;
    ferry_status_t status = ferry_segment_open(engine, name, &segment);
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_bench: target: open %s: %s\n", name, ferry_status_string(status));
        return -1;
    }
    ferry_batch_h batch;
    if (ferry_batch_create(engine, 1, &batch) != FERRY_OK) {
        ferry_segment_close(engine, segment);
        return -1;
    }
    unsigned char *receive = buffer, *send = buffer + ferry_bench_pingpong_stride(block);
    uint64_t seq = 0;
    FERRY_TSAN_IGNORE_BEGIN(); /* before the READY that lets the initiator write it */
    seq_store(receive, block, 0);
    FERRY_TSAN_IGNORE_END();
    atomic_thread_fence(memory_order_seq_cst);
    seq_store(send, block, PINGPONG_READY);
    int rc =
        write_and_complete(batch, send, segment, (uint64_t)peer_buffer, block) == FERRY_OK ? 0 : -1;
    while (rc == 0) {
        if (poll_seq(engine, receive, block, seq, 0, &seq) != 0) {
            fprintf(stderr, "ferry_bench: target: the pingpong initiator went quiet\n");
            rc = -1;
        } else if (seq == PINGPONG_END) {
            break;
        } else {
            seq_store(send, block, seq);
            status = write_and_complete(batch, send, segment, (uint64_t)peer_buffer, block);
            if (status != FERRY_OK) {
                fprintf(stderr, "ferry_bench: target: pingpong write failed: %s\n",
                        ferry_status_string(status));
                rc = -1;
            }
        }
    }
    ferry_batch_destroy(batch);
    ferry_segment_close(engine, segment);
    return rc;
}
