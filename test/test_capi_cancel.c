/* ferry_batch_cancel: a frozen peer holding requests, cancel racing
 * completion, a finished batch; and that a CANCELLED request's bytes never
 * land. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "capi_common.h"
#include "one_request.h"
#include "peer_process.h"
#include "peer_socket.h"
#include "test_clock.h"
#include "test_pattern.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

TestSuite(cancel, .init = capi_setup, .fini = capi_teardown, .timeout = 120);

/* n requests of length bytes, from the same local bytes to remote + i *
 * length. */
static void fill_requests(ferry_request_t *reqs, size_t n, ferry_segment_h segment,
                          uint64_t remote, size_t length)
{
    for (size_t i = 0; i < n; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = capi_local,
                                    .target = segment, .target_offset = remote + i * length,
                                    .length = length};
}

/* A batch of n writes of length bytes to remote + i * length (not submitted). */
static ferry_batch_h batch_of(ferry_request_t *reqs, size_t n, ferry_segment_h segment,
                              uint64_t remote, size_t length)
{
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(capi_engine, n, &batch), FERRY_OK);
    fill_requests(reqs, n, segment, remote, length);
    return batch;
}

static ferry_xfer_state_t state_of(ferry_batch_h batch, size_t i)
{
    ferry_xfer_status_t xs;
    cr_assert_eq(ferry_batch_status(batch, i, &xs), FERRY_OK);
    if (xs.state == FERRY_XFER_CANCELLED)
        cr_assert_eq(xs.error, FERRY_ERR_CANCELED);
    return xs.state;
}

Test(cancel, a_finished_or_empty_batch_is_left_alone)
{
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(capi_engine, 4, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_cancel(batch), FERRY_OK, "nothing submitted yet");
    cr_assert_eq(ferry_register(capi_engine, capi_local, MIB, NULL, 0), FERRY_OK);
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open(capi_engine, ferry_engine_segment_name(capi_engine), &self),
                 FERRY_OK);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = capi_local, .target = self,
                           .target_offset = (uintptr_t)capi_local + 512 * KIB, .length = 4096};
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_eq(ferry_batch_cancel(batch), FERRY_OK);
    cr_assert_eq(state_of(batch, 0), FERRY_XFER_COMPLETED, "a finished request stays so");
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(ferry_batch_cancel(batch), FERRY_ERR_INVALID_HANDLE, "destroyed");
    cr_assert_eq(ferry_batch_cancel(NULL), FERRY_ERR_INVALID_HANDLE);
    ferry_segment_close(capi_engine, self);
    cr_assert_eq(ferry_unregister(capi_engine, capi_local), FERRY_OK);
}

Test(cancel, a_frozen_peer_s_queued_requests_end_cancelled_at_once)
{
    /* 64 MiB in all: most still queued when it freezes.  One slice each
     * (FERRY_TCP_SLICE_SIZE, 1 MiB): a request is wholly on the wire or
     * wholly queued, so a CANCELLED one moved no byte at all. */
    enum { N = 64 };
    const size_t length = MIB;
    peer_process_t victim, bystander;
    ferry_segment_h victim_seg = capi_open_peer(&victim, NULL);
    ferry_segment_h bystander_seg = capi_open_peer(&bystander, NULL);
    cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", N * length), "OK");
    for (size_t i = 0; i < N; i++) /* each region its own pattern, as check reads it */
        cr_assert_str_eq(peer_cmd(&victim, "fill %zu %zu 21", i * length, length), "OK");
    cr_assert_str_eq(peer_cmd(&bystander, "reg 0 %zu", N * length), "OK");
    test_pattern_fill(capi_local, length, 22);

    ferry_request_t reqs[N];
    ferry_batch_h batch = batch_of(reqs, N, victim_seg, victim.arena, length);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    int stopped;
    peer_kill(&victim, SIGSTOP);
    cr_assert_eq(waitpid(victim.pid, &stopped, WUNTRACED), victim.pid);

    double start = test_now();
    cr_assert_eq(ferry_batch_cancel(batch), FERRY_OK);
    cr_assert_lt(test_now() - start, 1.0, "cancel returns at once");
    size_t cancelled_at_once = 0;
    for (size_t i = 0; i < N; i++)
        cancelled_at_once += state_of(batch, i) == FERRY_XFER_CANCELLED;
    cr_assert_gt(cancelled_at_once, 0, "the queued requests end CANCELLED at once");
    /* the rest (bytes on the wire) end as they would: here FAILED after
     * FERRY_TCP_TIMEOUT (1 s), or COMPLETED if they arrived before */
    ferry_status_t status = ferry_batch_wait(batch, 20000);
    cr_assert_neq(status, FERRY_ERR_TIMEOUT);
    cr_assert_neq(status, FERRY_OK);
    size_t cancelled = 0, failed = 0, completed = 0;
    for (size_t i = 0; i < N; i++) {
        ferry_xfer_state_t state = state_of(batch, i);
        cancelled += state == FERRY_XFER_CANCELLED;
        failed += state == FERRY_XFER_FAILED;
        completed += state == FERRY_XFER_COMPLETED;
    }
    cr_assert_eq(cancelled + failed + completed, N);
    cr_assert_geq(cancelled, cancelled_at_once, "a CANCELLED request stays so");

    /* thawed, the peer takes whatever its socket still held: never the
     * bytes of a CANCELLED request */
    peer_kill(&victim, SIGCONT);
    usleep(300000);
    for (size_t i = 0; i < N; i++)
        if (state_of(batch, i) == FERRY_XFER_CANCELLED)
            cr_assert_str_eq(peer_cmd(&victim, "check %zu %zu 21", i * length, length), "OK",
                             "request %zu was CANCELLED, yet its bytes landed", i);

    /* counted as failures */
    ferry_stats_t all[4];
    size_t n;
    cr_assert_eq(ferry_stats_snapshot(capi_engine, FERRY_STATS_BY_PEER, all, 4, &n), FERRY_OK);
    cr_assert_eq(strcmp(all[0].name, victim.name), 0);
    cr_assert_eq(all[0].requests, N);
    cr_assert_eq(all[0].failures, cancelled + failed);

    /* the batch and the engine stay usable */
    fill_requests(reqs, 4, bystander_seg, bystander.arena, length);
    cr_assert_eq(ferry_batch_submit(batch, reqs, 4), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&bystander, "check %zu %zu 22", 3 * length, length), "OK");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    ferry_segment_close(capi_engine, victim_seg);
    ferry_segment_close(capi_engine, bystander_seg);
    peer_stop(&victim);
    peer_stop(&bystander);
}

typedef struct canceller {
    ferry_batch_h batch;
    atomic_int stop;
    unsigned calls;
} canceller_t;

static void *cancel_loop(void *arg)
{
    canceller_t *c = arg;
    while (!atomic_load(&c->stop)) {
        cr_assert_eq(ferry_batch_cancel(c->batch), FERRY_OK);
        c->calls++;
        sched_yield();
    }
    return NULL;
}

Test(cancel, racing_completion_each_request_ends_once)
{
    enum { N = 8, ROUNDS = 300 };
    const size_t length = 64 * KIB;
    peer_process_t peer;
    ferry_segment_h segment = capi_open_peer(&peer, NULL);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", N * length), "OK");
    test_pattern_fill(capi_local, length, 23);
    ferry_request_t reqs[N];
    ferry_batch_h batch = batch_of(reqs, N, segment, peer.arena, length);
    canceller_t c = {.batch = batch};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, cancel_loop, &c), 0);
    size_t cancelled = 0, completed = 0;
    for (int round = 0; round < ROUNDS; round++) {
        cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
        ferry_status_t status = ferry_batch_wait(batch, 30000);
        cr_assert(status == FERRY_OK || status == FERRY_ERR_CANCELED, "round %d: %s", round,
                  ferry_status_string(status));
        for (size_t i = 0; i < N; i++) {
            ferry_xfer_state_t state = state_of(batch, i);
            cr_assert(state == FERRY_XFER_COMPLETED || state == FERRY_XFER_CANCELLED,
                      "round %d request %zu: state %d", round, i, (int)state);
            cancelled += state == FERRY_XFER_CANCELLED;
            completed += state == FERRY_XFER_COMPLETED;
        }
    }
    atomic_store(&c.stop, 1);
    pthread_join(thread, NULL);
    cr_log_info("%zu completed, %zu cancelled, %u cancel calls", completed, cancelled, c.calls);
    /* nothing was lost: the engine moves the next bytes whole */
    cr_assert_eq(capi_write(segment, peer.arena, N * length, 24), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 24", N * length), "OK");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    ferry_segment_close(capi_engine, segment);
    peer_stop(&peer);
}

/* One request of 64 slices over a frozen peer: its first slices are on the
 * wire (each connection's first send), the rest queued.  Cancel takes the
 * queued ones back, the sent ones fail at FERRY_TCP_TIMEOUT: the request
 * is FAILED, never CANCELLED, since its sent bytes may still land.  The
 * peer is frozen before the submit and the cancel waits until its sockets
 * hold the request's first bytes: the engine's worker sends on its own
 * thread, and a cancel that came before its first send would (rightly)
 * take the whole request back. */
Test(cancel, a_request_partly_on_the_wire_ends_failed)
{
    const size_t length = 64 * MIB;
    peer_process_t victim;
    ferry_segment_h segment = capi_open_peer(&victim, NULL);
    cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", length), "OK");
    /* connected first: a connection is made while the peer answers */
    cr_assert_eq(capi_write(segment, victim.arena, 4096, 5), FERRY_OK);
    unsigned char *big = malloc(length);
    cr_assert_not_null(big);
    memset(big, 7, length);
    ferry_batch_h batch;
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = big, .target = segment,
                           .target_offset = victim.arena, .length = length};
    cr_assert_eq(ferry_batch_create(capi_engine, 1, &batch), FERRY_OK);
    int stopped;
    peer_kill(&victim, SIGSTOP);
    cr_assert_eq(waitpid(victim.pid, &stopped, WUNTRACED), victim.pid);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    /* 64 MiB do not fit the sockets' buffers: the frozen peer holds part
     * (32 KiB: more than any control message, less than a socket holds) */
    cr_assert_gt(peer_socket_wait_unread(victim.pid, 32 * 1024, 10.0), 0,
                 "the request's bytes did not reach the frozen peer in 10 s");
    cr_assert_eq(ferry_batch_cancel(batch), FERRY_OK);
    ferry_status_t status = ferry_batch_wait(batch, 20000);
    cr_assert_neq(status, FERRY_ERR_TIMEOUT);
    cr_assert_eq(state_of(batch, 0), FERRY_XFER_FAILED, "%s", ferry_status_string(status));
    cr_assert_neq(status, FERRY_ERR_CANCELED);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    peer_kill(&victim, SIGKILL);
    ferry_segment_close(capi_engine, segment);
    free(big);
}

typedef struct unregisterer {
    void *addr;
    ferry_status_t status;
    double done_at;
} unregisterer_t;

static void *unregister_thread(void *arg)
{
    unregisterer_t *u = arg;
    u->status = ferry_unregister(capi_engine, u->addr);
    u->done_at = test_now();
    return NULL;
}

/* The local buffer of requests a frozen peer holds is unregistered while
 * they are cancelled: the unregister waits for the requests still on the
 * wire (they fail at FERRY_TCP_TIMEOUT), not for the cancelled ones, and
 * everything ends. */
Test(cancel, racing_an_unregister_of_the_local_buffer)
{
    enum { N = 32 };
    const size_t length = MIB;
    peer_process_t victim;
    ferry_segment_h segment = capi_open_peer(&victim, NULL);
    cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", N * length), "OK");
    cr_assert_eq(ferry_register(capi_engine, capi_local, length, NULL, 0), FERRY_OK);
    ferry_request_t reqs[N];
    ferry_batch_h batch = batch_of(reqs, N, segment, victim.arena, length);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    int stopped;
    peer_kill(&victim, SIGSTOP);
    cr_assert_eq(waitpid(victim.pid, &stopped, WUNTRACED), victim.pid);
    unregisterer_t u = {.addr = capi_local};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, unregister_thread, &u), 0);
    usleep(10000);
    cr_assert_eq(ferry_batch_cancel(batch), FERRY_OK);
    double cancelled_at = test_now();
    ferry_status_t status = ferry_batch_wait(batch, 20000);
    cr_assert_neq(status, FERRY_ERR_TIMEOUT);
    pthread_join(thread, NULL);
    cr_assert_eq(u.status, FERRY_OK);
    cr_assert_lt(u.done_at - cancelled_at, 10.0, "the unregister ended %.2f s after the cancel",
                 u.done_at - cancelled_at);
    for (size_t i = 0; i < N; i++) {
        ferry_xfer_state_t state = state_of(batch, i);
        cr_assert(state == FERRY_XFER_CANCELLED || state == FERRY_XFER_FAILED ||
                  state == FERRY_XFER_COMPLETED);
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    peer_kill(&victim, SIGKILL);
    ferry_segment_close(capi_engine, segment);
}
