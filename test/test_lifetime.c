/*
 * Lifetimes: what another thread or a completion still touches must stay
 * alive until it is done.  Engine teardown with transfers in flight on
 * either side, a batch destroyed the moment its wait returns, refreshes of
 * one segment racing each other.  Under AddressSanitizer or
 * ThreadSanitizer (make check in a sanitizer build) each of these reports
 * the freed memory it used to touch.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../src/transport/tcp/tcp.h"
#include "one_request.h"
#include "peer_process.h"
#include "tcp_client.h"
#include "test_clock.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)

static void setup(void)
{
    setenv("FERRY_TRANSPORTS", "tcp", 1); /* peers inherit it */
}

TestSuite(lifetime, .init = setup, .timeout = 120);

/* A peer with length bytes of its arena registered, its segment opened. */
static ferry_segment_h peer_with_buffer(ferry_engine_h engine, peer_process_t *peer,
                                        size_t length)
{
    cr_assert_eq(peer_start(peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(peer, "reg 0 %zu", length), "OK");
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, peer->name, &segment), FERRY_OK);
    return segment;
}

/* Initiator side: the registered local buffer's entry is held by every
 * request until the transport finishes it, which teardown makes happen. */
Test(lifetime, engine_destroy_with_writes_in_flight_to_a_frozen_peer)
{
    setenv("FERRY_TCP_TIMEOUT", "60s", 1); /* nothing fails by itself meanwhile */
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    enum { N = 16 };
    unsigned char *local = NULL;
    cr_assert_eq(posix_memalign((void **)&local, 4096, 4 * MIB), 0);
    memset(local, 3, 4 * MIB);
    cr_assert_eq(ferry_register(engine, local, 4 * MIB, "cpu", 0), FERRY_OK);
    peer_process_t peer;
    ferry_segment_h segment = peer_with_buffer(engine, &peer, 64 * MIB);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment, peer.arena, 4096, NULL),
                 FERRY_OK); /* connected */
    peer_kill(&peer, SIGSTOP);

    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
                                    .target_offset = peer.arena + (uint64_t)i * 4 * MIB,
                                    .length = 4 * MIB};
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    usleep(100000); /* the sockets fill up */
    cr_assert_eq(ferry_batch_wait(batch, 0), FERRY_ERR_TIMEOUT, "a frozen peer took 64 MiB");
    double start = test_now();
    ferry_engine_destroy(engine); /* the batch, its requests and the registration with it */
    cr_assert_lt(test_now() - start, 10.0, "teardown waited for the frozen peer");
    peer_kill(&peer, SIGKILL);
    free(local);
}

/* The engine's own tcp endpoint and generation, for a raw client. */
static void own_tcp_target(ferry_engine_h engine, char *endpoint, size_t size,
                           uint64_t *generation_p)
{
    ferry_segment_h self;
    char *json;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, self, &json), FERRY_OK);
    tcp_client_target_of(json, endpoint, size, generation_p);
    free(json);
    ferry_segment_close(engine, self);
}

/* An engine with its 4 MiB buffer registered and a raw client that sent a
 * WRITE of all of it with half of its payload (0x5a bytes, in payload):
 * the target's connection thread holds the registration, waiting for the
 * rest.  Returns the client's socket. */
static unsigned char payload[4 << 20];

static int half_received_write(ferry_engine_h *engine_p, unsigned char **buffer_p)
{
    cr_assert_eq(ferry_engine_create(NULL, engine_p), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)buffer_p, 4096, sizeof(payload)), 0);
    memset(*buffer_p, 0, sizeof(payload));
    cr_assert_eq(ferry_register(*engine_p, *buffer_p, sizeof(payload), "cpu", 0), FERRY_OK);
    char endpoint[128];
    uint64_t generation;
    own_tcp_target(*engine_p, endpoint, sizeof(endpoint), &generation);
    int fd = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(fd, generation), 0);
    tcp_client_request(fd, FERRY_TCP_OP_WRITE, 0, (uintptr_t)*buffer_p, sizeof(payload));
    memset(payload, 0x5a, sizeof(payload));
    cr_assert_eq(send(fd, payload, sizeof(payload) / 2, MSG_NOSIGNAL),
                 (ssize_t)(sizeof(payload) / 2));
    usleep(100000); /* the target reads the first half and waits for the rest */
    return fd;
}

/* Target side: a connection thread holds the registration while a WRITE's
 * payload arrives; teardown ends that before the registration goes. */
Test(lifetime, engine_destroy_while_a_write_to_it_is_half_received)
{
    ferry_engine_h engine;
    unsigned char *buffer;
    int fd = half_received_write(&engine, &buffer);
    double start = test_now();
    ferry_engine_destroy(engine);
    cr_assert_lt(test_now() - start, 10.0, "teardown waited for the silent initiator");
    cr_assert(tcp_client_closed(fd), "the connection outlived its engine");
    close(fd);
    free(buffer);
}

struct unregistering {
    ferry_engine_h engine;
    void *addr;
    ferry_status_t status;
    atomic_int done;
};

static void *unregister_thread(void *arg)
{
    struct unregistering *u = arg;
    u->status = ferry_unregister(u->engine, u->addr);
    atomic_store(&u->done, 1);
    return NULL;
}

/* The target's connection thread holds the registration while a WRITE's
 * payload arrives: unregister waits for it, and the release that ends the
 * hold wakes it. */
Test(lifetime, unregister_waits_for_a_write_being_received)
{
    ferry_engine_h engine;
    unsigned char *buffer;
    int fd = half_received_write(&engine, &buffer);
    struct unregistering u = {.engine = engine, .addr = buffer};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, unregister_thread, &u), 0);
    usleep(200000);
    cr_assert_eq(atomic_load(&u.done), 0, "unregister returned while a write was landing");
    cr_assert_eq(send(fd, payload + 2 * MIB, 2 * MIB, MSG_NOSIGNAL), (ssize_t)(2 * MIB));
    cr_assert_eq(tcp_client_response(fd, 0), 0, "the write that began before is served");
    for (int waited = 0; waited < 1000 && !atomic_load(&u.done); waited++)
        usleep(10000);
    cr_assert_eq(atomic_load(&u.done), 1, "unregister still waits after the write ended");
    pthread_join(thread, NULL);
    cr_assert_eq(u.status, FERRY_OK);
    for (size_t i = 0; i < 4 * MIB; i += 4096)
        cr_assert_eq(buffer[i], 0x5a, "byte %zu: the write had not landed", i);
    close(fd);
    ferry_engine_destroy(engine);
    free(buffer);
}

/* Initiator side: the requests of a run (one registered local buffer, one
 * target buffer) hold the buffer's entry once for the run, until the last
 * of them finishes: an unregister after the first one finished still waits
 * for the others. */
Test(lifetime, unregister_waits_for_the_last_request_of_a_run)
{
    /* Both of several slices (FERRY_TCP_SLICE_SIZE: 1m): one run. */
    const size_t SMALL = 2 * MIB, large = 64 * MIB;
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    peer_process_t peer;
    ferry_segment_h segment = peer_with_buffer(engine, &peer, SMALL + large);
    unsigned char *local = malloc(SMALL + large);
    cr_assert(local != NULL);
    memset(local, 0x3c, SMALL + large);
    cr_assert_eq(ferry_register(engine, local, SMALL + large, "cpu", 0), FERRY_OK);
    ferry_request_t reqs[2] = {
        {.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
         .target_offset = peer.arena, .length = SMALL},
        {.opcode = FERRY_OP_WRITE, .local = local + SMALL, .target = segment,
         .target_offset = peer.arena + SMALL, .length = large}};
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 2, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, reqs, 2), FERRY_OK);
    ferry_xfer_status_t first, second;
    do
        cr_assert_eq(ferry_batch_status(batch, 0, &first), FERRY_OK);
    while (first.state == FERRY_XFER_PENDING);
    peer_kill(&peer, SIGSTOP); /* the large one stays in flight */
    cr_assert_eq(first.state, FERRY_XFER_COMPLETED);
    usleep(50000); /* answers the peer sent before it stopped arrive meanwhile */
    cr_assert_eq(ferry_batch_status(batch, 1, &second), FERRY_OK);
    if (second.state != FERRY_XFER_PENDING) {
        peer_kill(&peer, SIGCONT);
        cr_skip_test("the large request finished before the peer was stopped");
    }
    struct unregistering u = {.engine = engine, .addr = local};
    pthread_t thread;
    cr_assert_eq(pthread_create(&thread, NULL, unregister_thread, &u), 0);
    usleep(200000);
    int early = atomic_load(&u.done);
    peer_kill(&peer, SIGCONT);
    cr_assert_eq(ferry_batch_wait(batch, 60000), FERRY_OK);
    pthread_join(thread, NULL);
    cr_assert_eq(early, 0, "unregister returned while a request of the run was in flight");
    cr_assert_eq(u.status, FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);
    free(local);
}

/* A completion must not touch the batch once its count reached zero: the
 * waiter may destroy it at once.  Sleeping waits (no spin), completions
 * from the transport's I/O thread. */
Test(lifetime, batch_destroyed_the_moment_its_wait_returns)
{
    setenv("FERRY_WAIT_SPIN", "0", 1);
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    peer_process_t peer;
    ferry_segment_h segment = peer_with_buffer(engine, &peer, MIB);
    unsigned char local[64];
    memset(local, 7, sizeof(local));
    for (int round = 0; round < 2000; round++)
        cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment,
                                 peer.arena + 64 * (round % 16), 64, NULL),
                     FERRY_OK, "round %d", round);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);
}

struct refresher {
    ferry_engine_h engine;
    const char *name;
    int failures;
};

static void *refresh_loop(void *arg)
{
    struct refresher *r = arg;
    for (int i = 0; i < 200; i++)
        r->failures += ferry_segment_refresh(r->engine, r->name) != FERRY_OK;
    return NULL;
}

/* Each refetch replaces the segment's descriptor and drops the old one,
 * which another thread's refetch may just have published. */
Test(lifetime, concurrent_refreshes_of_one_segment)
{
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    peer_process_t peer;
    ferry_segment_h segment = peer_with_buffer(engine, &peer, MIB);
    enum { THREADS = 4 };
    pthread_t threads[THREADS];
    struct refresher r[THREADS];
    for (int i = 0; i < THREADS; i++) {
        r[i] = (struct refresher){.engine = engine, .name = peer.name};
        cr_assert_eq(pthread_create(&threads[i], NULL, refresh_loop, &r[i]), 0);
    }
    /* The owner changes its buffers meanwhile: new descriptors, invalidations. */
    for (int i = 0; i < 20; i++) {
        cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", 2 * MIB, MIB), "OK");
        cr_assert_str_eq(peer_cmd(&peer, "unreg %zu", 2 * MIB), "OK");
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        cr_assert_eq(r[i].failures, 0, "thread %d: %d refreshes failed", i, r[i].failures);
    }
    unsigned char local[256];
    test_pattern_fill(local, sizeof(local), 9);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment, peer.arena, sizeof(local),
                             NULL),
                 FERRY_OK, "the peer is still known");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 9", sizeof(local)), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    ferry_engine_destroy(engine);
}
