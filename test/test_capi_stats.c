/* Statistics: what ferry_stats_snapshot reports after real transfers to a
 * peer process, to the engine's own segment, and to a peer killed while
 * requests fly. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "capi_common.h"
#include "peer_process.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

TestSuite(stats, .init = capi_setup, .fini = capi_teardown, .timeout = 60);

static uint64_t latency_count(const ferry_stats_t *s)
{
    uint64_t n = 0;
    for (size_t b = 0; b < FERRY_STATS_BUCKETS; b++)
        n += s->latency[b];
    return n;
}

/* The entry of that name among the engine's entries of kind (asserted there). */
static ferry_stats_t entry_of(ferry_engine_h engine, ferry_stats_kind_t kind, const char *name)
{
    ferry_stats_t all[16];
    size_t n = 0;
    cr_assert_eq(ferry_stats_snapshot(engine, kind, all, 16, &n), FERRY_OK);
    for (size_t i = 0; i < n && i < 16; i++)
        if (strcmp(all[i].name, name) == 0)
            return all[i];
    cr_assert_fail("no statistics entry \"%s\" among %zu", name, n);
    return all[0];
}

static void check_entry(const ferry_stats_t *s, uint64_t requests, uint64_t failures,
                        uint64_t bytes)
{
    cr_assert_eq(s->requests, requests, "%s: %llu requests, want %llu", s->name,
                 (unsigned long long)s->requests, (unsigned long long)requests);
    cr_assert_eq(s->failures, failures, "%s: %llu failures, want %llu", s->name,
                 (unsigned long long)s->failures, (unsigned long long)failures);
    cr_assert_eq(s->bytes, bytes, "%s: %llu bytes, want %llu", s->name,
                 (unsigned long long)s->bytes, (unsigned long long)bytes);
    cr_assert_eq(latency_count(s), requests, "%s: every request has a latency", s->name);
}

/* n requests of length bytes each (op), one batch; its wait status. */
static ferry_status_t run_batch(ferry_opcode_t op, ferry_segment_h segment, uint64_t remote,
                                size_t length, size_t n)
{
    ferry_batch_h batch;
    ferry_request_t reqs[64];
    cr_assert_leq(n, 64);
    cr_assert_eq(ferry_batch_create(capi_engine, n, &batch), FERRY_OK);
    for (size_t i = 0; i < n; i++)
        reqs[i] = (ferry_request_t){.opcode = op, .local = capi_local + i * length,
                                    .target = segment, .target_offset = remote + i * length,
                                    .length = length};
    ferry_status_t status = ferry_batch_submit(batch, reqs, n);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, 30000);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    return status;
}

Test(stats, counts_requests_and_bytes_per_transport_and_peer)
{
    peer_process_t peer;
    ferry_segment_h segment = capi_open_peer(&peer, NULL);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(run_batch(FERRY_OP_WRITE, segment, peer.arena, 4 * KIB, 10), FERRY_OK);
    cr_assert_eq(run_batch(FERRY_OP_READ, segment, peer.arena, KIB, 3), FERRY_OK);
    ferry_stats_t tcp = entry_of(capi_engine, FERRY_STATS_BY_TRANSPORT, "tcp");
    check_entry(&tcp, 13, 0, 10 * 4 * KIB + 3 * KIB);
    ferry_stats_t by_peer = entry_of(capi_engine, FERRY_STATS_BY_PEER, peer.name);
    check_entry(&by_peer, 13, 0, 10 * 4 * KIB + 3 * KIB);
    ferry_stats_t local = entry_of(capi_engine, FERRY_STATS_BY_TRANSPORT, "local");
    check_entry(&local, 0, 0, 0);
    /* a latency is a positive time, below the test's bound */
    cr_assert_gt(ferry_stats_latency_ns(&tcp, 0.5), 0);
    cr_assert_lt(ferry_stats_latency_ns(&tcp, 1.0), (uint64_t)60 * 1000000000u);

    /* copies to our own segment count as "local", under our own name */
    cr_assert_eq(ferry_register(capi_engine, capi_local, MIB, NULL, 0), FERRY_OK);
    ferry_segment_h self;
    const char *own = ferry_engine_segment_name(capi_engine);
    cr_assert_eq(ferry_segment_open(capi_engine, own, &self), FERRY_OK);
    ferry_batch_h batch;
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = capi_local, .target = self,
                           .target_offset = (uintptr_t)capi_local + 512 * KIB,
                           .length = 100};
    cr_assert_eq(ferry_batch_create(capi_engine, 1, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK, "submitted again");
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    local = entry_of(capi_engine, FERRY_STATS_BY_TRANSPORT, "local");
    check_entry(&local, 2, 0, 200);
    ferry_stats_t self_entry = entry_of(capi_engine, FERRY_STATS_BY_PEER, own);
    check_entry(&self_entry, 2, 0, 200);

    /* reset: zeros, the entries stay */
    cr_assert_eq(ferry_stats_reset(capi_engine), FERRY_OK);
    tcp = entry_of(capi_engine, FERRY_STATS_BY_TRANSPORT, "tcp");
    check_entry(&tcp, 0, 0, 0);
    by_peer = entry_of(capi_engine, FERRY_STATS_BY_PEER, peer.name);
    check_entry(&by_peer, 0, 0, 0);
    /* counted again after the reset, through a closed segment's peer too */
    cr_assert_eq(run_batch(FERRY_OP_WRITE, segment, peer.arena, 8, 1), FERRY_OK);
    ferry_segment_close(capi_engine, segment);
    by_peer = entry_of(capi_engine, FERRY_STATS_BY_PEER, peer.name);
    check_entry(&by_peer, 1, 0, 8);
    ferry_segment_close(capi_engine, self);
    cr_assert_eq(ferry_unregister(capi_engine, capi_local), FERRY_OK);
    peer_stop(&peer);
}

Test(stats, failures_on_a_killed_peer_are_counted)
{
    peer_process_t victim;
    ferry_segment_h segment = capi_open_peer(&victim, NULL);
    cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", 4 * MIB), "OK");
    enum { N = 32 };
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(capi_engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++) /* 128 MiB in all: still flying when the peer dies */
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = capi_local,
                                    .target = segment, .target_offset = victim.arena,
                                    .length = 4 * MIB};
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    usleep(20000);
    peer_kill(&victim, SIGKILL);
    cr_assert_neq(ferry_batch_wait(batch, 20000), FERRY_OK);
    uint64_t failed = 0, completed = 0;
    for (int i = 0; i < N; i++) {
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, (size_t)i, &xs), FERRY_OK);
        failed += xs.state == FERRY_XFER_FAILED;
        completed += xs.state == FERRY_XFER_COMPLETED;
    }
    cr_assert_eq(failed + completed, N);
    cr_assert_gt(failed, 0);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    ferry_stats_t tcp = entry_of(capi_engine, FERRY_STATS_BY_TRANSPORT, "tcp");
    check_entry(&tcp, N, failed, completed * 4 * MIB);
    ferry_stats_t by_peer = entry_of(capi_engine, FERRY_STATS_BY_PEER, victim.name);
    check_entry(&by_peer, N, failed, completed * 4 * MIB);
    ferry_segment_close(capi_engine, segment);
}

Test(stats, snapshot_arguments)
{
    size_t n = 99;
    cr_assert_eq(ferry_stats_snapshot(capi_engine, FERRY_STATS_BY_TRANSPORT, NULL, 0, &n),
                 FERRY_OK);
    cr_assert_eq(n, 2, "local and tcp");
    ferry_stats_t one[1];
    cr_assert_eq(ferry_stats_snapshot(capi_engine, FERRY_STATS_BY_TRANSPORT, one, 1, &n),
                 FERRY_OK);
    cr_assert_eq(n, 2, "the count says how many there are");
    cr_assert_str_eq(one[0].name, "local");
    cr_assert_eq(ferry_stats_snapshot(capi_engine, FERRY_STATS_BY_PEER, NULL, 0, &n), FERRY_OK);
    cr_assert_eq(n, 0, "no segment opened yet");
    cr_assert_eq(ferry_stats_snapshot(capi_engine, (ferry_stats_kind_t)7, one, 1, &n),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_stats_snapshot(capi_engine, FERRY_STATS_BY_PEER, NULL, 1, &n),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_stats_snapshot(capi_engine, FERRY_STATS_BY_PEER, one, 1, NULL),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_stats_snapshot(NULL, FERRY_STATS_BY_PEER, one, 1, &n),
                 FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_stats_reset(NULL), FERRY_ERR_INVALID_HANDLE);
}

Test(stats, latency_quantiles_read_the_buckets)
{
    ferry_stats_t s = {0};
    cr_assert_eq(ferry_stats_latency_ns(&s, 0.5), 0, "nothing counted");
    cr_assert_eq(ferry_stats_latency_ns(NULL, 0.5), 0);
    s.latency[10] = 90; /* [1024, 2048) ns */
    s.latency[20] = 10; /* [1 ms, 2 ms) */
    cr_assert_eq(ferry_stats_latency_ns(&s, 0.0), 2048);
    cr_assert_eq(ferry_stats_latency_ns(&s, 0.5), 2048);
    cr_assert_eq(ferry_stats_latency_ns(&s, 0.9), 2048);
    cr_assert_eq(ferry_stats_latency_ns(&s, 0.95), (uint64_t)2 << 20);
    cr_assert_eq(ferry_stats_latency_ns(&s, 7.0), (uint64_t)2 << 20, "clamped to 1");
}

Test(stats, off_counts_nothing)
{
    setenv("FERRY_STATS", "no", 1);
    ferry_engine_h quiet;
    cr_assert_eq(ferry_engine_create(NULL, &quiet), FERRY_OK);
    unsetenv("FERRY_STATS");
    static unsigned char buffer[64 * KIB];
    cr_assert_eq(ferry_register(quiet, buffer, sizeof(buffer), NULL, 0), FERRY_OK);
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open(quiet, ferry_engine_segment_name(quiet), &self), FERRY_OK);
    ferry_batch_h batch;
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = buffer, .target = self,
                           .target_offset = (uintptr_t)buffer + 32 * KIB, .length = 64};
    cr_assert_eq(ferry_batch_create(quiet, 1, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    ferry_stats_t local = entry_of(quiet, FERRY_STATS_BY_TRANSPORT, "local");
    check_entry(&local, 0, 0, 0);
    size_t n = 99;
    cr_assert_eq(ferry_stats_snapshot(quiet, FERRY_STATS_BY_PEER, NULL, 0, &n), FERRY_OK);
    cr_assert_eq(n, 0);
    ferry_segment_close(quiet, self);
    ferry_engine_destroy(quiet);
}
