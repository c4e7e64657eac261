/*
 * The UCX transport plugin: two-process transfers over shared memory and
 * over TCP, keys through the descriptor, failures, unregistration, restarts,
 * shared memory really used on one host, notifies through UCX.
 *
 * Every test sets FERRY_* / UCX_* variables before it starts peers or the
 * engine: peers inherit the environment, and Criterion runs each test in a
 * process of its own.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "peer_process.h"
#include "service_process.h"
#include "capture_stderr.h"
#include "one_request.h"
#include "put_get.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static ferry_engine_h engine;
static unsigned char *local;
static size_t local_size = 72 * MIB;

/* Engine and peers use UCX with this UCX_TLS (NULL: UCX's default). */
static void start(const char *tls, const char *transports)
{
    setenv("FERRY_TRANSPORTS", transports, 1);
    setenv("FERRY_UCX_TIMEOUT", "2000", 1); /* tight, yet above a loaded host's stalls */
    setenv("UCX_WARN_UNUSED_ENV_VARS", "n", 1);
    if (tls != NULL)
        setenv("UCX_TLS", tls, 1);
    else
        unsetenv("UCX_TLS");
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&local, 4096, local_size), 0);
    memset(local, 1, local_size);
}

static void stop(void)
{
    if (engine)
        ferry_engine_destroy(engine);
    engine = NULL;
    free(local);
    local = NULL;
}

TestSuite(ucx, .fini = stop, .timeout = 60);

/* One request in its own batch; checks the transport that served it. */
static ferry_status_t transfer(ferry_opcode_t op, void *buf, ferry_segment_h segment,
                               uint64_t remote, size_t length, const char *want_transport)
{
    return one_request_served_by(engine, op, buf, segment, remote, length, want_transport);
}

/* Write then read back sizes 1 B .. 64 MiB at unaligned offsets, bytes
 * checked on both sides; the local buffer registered or not.  allocated:
 * the peer's memory comes from ferry_alloc (UCX-mapped, attached by same-host
 * peers) instead of being registered user memory. */
static void put_get(int allocated)
{
    peer_process_t peer;
    ferry_segment_h segment;
    static const char *const alloc_env[] = {"FERRY_TEST_PEER_ALLOC=1", NULL};
    cr_assert_eq(peer_start(&peer, allocated ? alloc_env : NULL), 0,
                 "test peer did not start");
    if (!allocated)
        cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 70 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_register(engine, local, local_size, "cpu", 0), FERRY_OK);

    /* The small ones: each way a copy into attached memory is made. */
    static const size_t sizes[] = {1,  2,  3,  4,  5,  7,    8,     13,      16,      17,
                                   31, 32, 33, 63, 64, 65, 4096, 65537, MIB + 3, 64 * MIB};
    put_get_sizes(engine, &peer, segment, local, sizes, sizeof(sizes) / sizeof(sizes[0]), "ucx");
    put_get_unregistered(engine, &peer, segment, "ucx");
    put_get_batch(engine, &peer, segment, local, NULL);

    cr_assert_eq(ferry_unregister(engine, local), FERRY_OK);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

Test(ucx, put_get_over_shared_memory_1B_to_64MiB)
{
    /* require: the endpoint must use a shared-memory lane, or ucx refuses it */
    setenv("FERRY_UCX_SAME_HOST_SHM", "require", 1);
    start("sm,self", "ucx");
    put_get(0);
}

Test(ucx, put_get_into_ferry_alloc_memory_over_shared_memory)
{
    setenv("FERRY_UCX_SAME_HOST_SHM", "require", 1);
    start("sm,self", "ucx");
    put_get(1);
}

Test(ucx, put_get_over_tcp_1B_to_64MiB)
{
    setenv("FERRY_UCX_SAME_HOST_SHM", "ignore", 1);
    start("tcp", "ucx");
    put_get(0);
}

/* Writes as UCX's emulated puts instead of eager writes. */
Test(ucx, put_get_over_tcp_with_emulated_puts)
{
    setenv("FERRY_UCX_SAME_HOST_SHM", "ignore", 1);
    setenv("FERRY_UCX_EAGER_WRITE", "0", 1);
    start("tcp", "ucx");
    put_get(0);
}

Test(ucx, put_get_into_ferry_alloc_memory_over_tcp)
{
    setenv("FERRY_UCX_SAME_HOST_SHM", "ignore", 1);
    start("tcp", "ucx");
    put_get(1);
}

Test(ucx, several_workers_on_both_sides)
{
    setenv("FERRY_UCX_WORKERS", "3", 1);
    start("sm,self", "ucx");
    peer_process_t peers[2];
    ferry_segment_h segments[2];
    for (int p = 0; p < 2; p++) {
        cr_assert_eq(peer_start(&peers[p], NULL), 0);
        cr_assert_str_eq(peer_cmd(&peers[p], "reg 0 %zu", 4 * MIB), "OK");
        cr_assert_eq(ferry_segment_open(engine, peers[p].name, &segments[p]), FERRY_OK);
    }
    for (int p = 0; p < 2; p++) {
        test_pattern_fill(local, 4 * MIB, 20 + (unsigned)p);
        cr_assert_eq(transfer(FERRY_OP_WRITE, local, segments[p], peers[p].arena, 4 * MIB,
                              "ucx"),
                     FERRY_OK);
        cr_assert_str_eq(peer_cmd(&peers[p], "check 0 %zu %d", 4 * MIB, 20 + p), "OK");
        ferry_segment_close(engine, segments[p]);
        peer_stop(&peers[p]);
    }
}

/* Batches of eager writes from two threads at once, with ferry_batch_wait
 * sleeping at once (FERRY_WAIT_SPIN=0): only the worker's thread completes
 * them, so it must come back to the worker after each caller's posting,
 * however the two callers' posts overlap. */
typedef struct writer {
    ferry_segment_h segment;
    unsigned char *from;
    uint64_t to;
    ferry_status_t status;
} writer_t;

static void *write_batches(void *arg)
{
    enum { PER_BATCH = 64, ROUNDS = 8 };
    const size_t block = 64 * 1024;
    writer_t *wr = arg;
    ferry_request_t reqs[PER_BATCH];
    for (int i = 0; i < PER_BATCH; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE,
                                    .local = wr->from + i * block,
                                    .target = wr->segment,
                                    .target_offset = wr->to + i * block,
                                    .length = block};
    wr->status = FERRY_OK;
    for (int round = 0; round < ROUNDS && wr->status == FERRY_OK; round++) {
        ferry_batch_h batch;
        if ((wr->status = ferry_batch_create(engine, PER_BATCH, &batch)) != FERRY_OK)
            break;
        if ((wr->status = ferry_batch_submit(batch, reqs, PER_BATCH)) == FERRY_OK)
            wr->status = ferry_batch_wait(batch, 30000);
        ferry_batch_destroy(batch);
    }
    return NULL;
}

Test(ucx, progress_thread_alone_completes_concurrent_eager_writes_over_tcp)
{
    setenv("FERRY_UCX_SAME_HOST_SHM", "ignore", 1);
    setenv("FERRY_WAIT_SPIN", "0", 1);
    start("tcp", "ucx");
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 8 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_register(engine, local, 8 * MIB, "cpu", 0), FERRY_OK);
    writer_t writers[2];
    pthread_t threads[2];
    for (int t = 0; t < 2; t++) {
        test_pattern_fill(local + t * 4 * MIB, 4 * MIB, 30 + (unsigned)t);
        writers[t] = (writer_t){segment, local + t * 4 * MIB, peer.arena + t * 4 * MIB, 0};
        cr_assert_eq(pthread_create(&threads[t], NULL, write_batches, &writers[t]), 0);
    }
    for (int t = 0; t < 2; t++)
        pthread_join(threads[t], NULL); /* both, before an assertion can end the test */
    for (int t = 0; t < 2; t++) {
        cr_assert_eq(writers[t].status, FERRY_OK, "writer %d: %s", t,
                     ferry_status_string(writers[t].status));
        cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu %d", t * 4 * MIB, 4 * MIB, 30 + t), "OK");
    }
    cr_assert_eq(ferry_unregister(engine, local), FERRY_OK);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* The key in the descriptor is text (base64 of the packed rkey), the
 * endpoint carries the worker address, and a transfer works through them. */
Test(ucx, packed_rkey_survives_the_descriptor_round_trip)
{
    start("sm,self", "ucx");
    peer_process_t peer;
    ferry_segment_h segment;
    char *json;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, segment, &json), FERRY_OK);
    const char *endpoint = strstr(json, "\"ucx\":\"ucx1:");
    cr_assert_not_null(endpoint, "no ucx endpoint in %s", json);
    const char *keys = strstr(json, "\"keys\"");
    cr_assert_not_null(keys);
    const char *key = strstr(keys, "\"ucx\":\"");
    cr_assert_not_null(key, "no ucx key in %s", json);
    key += 7;
    size_t len = strcspn(key, "\"");
    cr_assert_gt(len, 0);
    cr_assert_eq(len % 4, 0, "a base64 key has a multiple of 4 characters");
    for (size_t i = 0; i < len; i++)
        cr_assert(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=",
                         key[i]) != NULL, "key character %zu is not base64", i);
    free(json);
    test_pattern_fill(local, MIB, 3);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena, MIB, "ucx"), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 3", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

struct killer {
    peer_process_t *victim;
    int sig;
    unsigned delay_ms;
    double at;
};

static void *kill_later(void *arg)
{
    struct killer *k = arg;
    usleep(k->delay_ms * 1000);
    k->at = now();
    kill(k->victim->pid, k->sig);
    return NULL;
}

/* Batches of 64 large writes to a victim, hurt while they run: they FAIL
 * with FERRY_ERR_PEER_FAILED within the bound, and another peer still
 * works.  allocated: the peers' memory comes from ferry_alloc; eager_write:
 * FERRY_UCX_EAGER_WRITE, NULL for the default (over tcp every slice goes as
 * an eager write, ucx_eager.c; "0": UCX's emulated puts). */
static void check_failure_within_bound(const char *tls, int sig, int allocated,
                                       const char *eager_write)
{
    if (strcmp(tls, "tcp") == 0)
        setenv("FERRY_UCX_SAME_HOST_SHM", "ignore", 1);
    if (eager_write != NULL)
        setenv("FERRY_UCX_EAGER_WRITE", eager_write, 1);
    start(tls, "ucx");
    peer_process_t victim, bystander;
    ferry_segment_h victim_seg, bystander_seg;
    static const char *const alloc_env[] = {"FERRY_TEST_PEER_ALLOC=1", NULL};
    cr_assert_eq(peer_start(&victim, allocated ? alloc_env : NULL), 0);
    cr_assert_eq(peer_start(&bystander, allocated ? alloc_env : NULL), 0);
    if (!allocated) {
        cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", 64 * MIB), "OK");
        cr_assert_str_eq(peer_cmd(&bystander, "reg 0 %zu", 4 * MIB), "OK");
    }
    cr_assert_eq(ferry_segment_open(engine, victim.name, &victim_seg), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, bystander.name, &bystander_seg), FERRY_OK);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, victim_seg, victim.arena, 4096, "ucx"),
                 FERRY_OK);

    enum { N = 64 };
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    size_t length = allocated ? 16 * MIB : 64 * MIB;
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local,
                                    .target = victim_seg, .target_offset = victim.arena,
                                    .length = length};
    /* Submit may itself copy (shared memory): hurt the peer from aside, and
     * keep writing until a batch fails (with plain stores into attached
     * memory a batch can finish between two looks at the peer). */
    struct killer k = {.victim = &victim, .sig = sig, .delay_ms = 100};
    pthread_t thread;
    pthread_create(&thread, NULL, kill_later, &k);
    double begin = now();
    ferry_status_t status;
    do {
        status = ferry_batch_submit(batch, reqs, N);
        if (status == FERRY_OK)
            status = ferry_batch_wait(batch, 20000);
    } while (status == FERRY_OK && now() - begin < 15.0);
    double failed_at = now();
    pthread_join(thread, NULL); /* k.at is the killer's until it is joined */
    double elapsed = failed_at - k.at;
    cr_assert_neq(status, FERRY_OK, "writes cannot keep succeeding once the peer is gone");
    cr_assert_neq(status, FERRY_ERR_TIMEOUT, "requests must FAIL, not hang");
    cr_assert_lt(elapsed, 5.0, "failure took %.2f s (bound: FERRY_UCX_TIMEOUT=2 s)", elapsed);
    int failed = put_get_count_peer_failed(batch, N);
    cr_assert_gt(failed, 0);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);

    /* Other peers are unaffected. */
    test_pattern_fill(local, 4 * MIB, 8);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, bystander_seg, bystander.arena, 4 * MIB,
                          "ucx"),
                 FERRY_OK);
    cr_assert_str_eq(peer_cmd(&bystander, "check 0 %zu 8", 4 * MIB), "OK");
    if (sig != SIGKILL)
        kill(victim.pid, SIGKILL);
    peer_kill(&victim, SIGKILL);
    ferry_segment_close(engine, victim_seg);
    ferry_segment_close(engine, bystander_seg);
    peer_stop(&bystander);
}

/* Shared memory with ferry_alloc memory, the way ucx serves same-host
 * peers by default: plain stores into the attached segment, nothing written
 * into our FIFOs by the victim.  (With registered user memory UCX emulates
 * RMA through the FIFOs, and a victim killed in the middle of writing one
 * stalls the worker for every peer: a UCX 1.13 limit, which is why ucx
 * serves such buffers only as a last resort; ucx_backends/README.md.) */
Test(ucx, killed_peer_fails_in_flight_requests_over_shared_memory)
{
    check_failure_within_bound("sm,self", SIGKILL, 1, NULL);
}

Test(ucx, killed_peer_fails_in_flight_eager_writes_over_tcp)
{
    check_failure_within_bound("tcp", SIGKILL, 0, NULL);
}

Test(ucx, killed_peer_fails_in_flight_emulated_puts_over_tcp)
{
    check_failure_within_bound("tcp", SIGKILL, 0, "0");
}

/* No acknowledgement ever comes: the deadline fails them. */
Test(ucx, frozen_peer_fails_in_flight_eager_writes_within_timeout)
{
    check_failure_within_bound("tcp", SIGSTOP, 0, NULL);
}

Test(ucx, frozen_peer_fails_in_flight_emulated_puts_within_timeout)
{
    check_failure_within_bound("tcp", SIGSTOP, 0, "0");
}

Test(ucx, frozen_peer_with_ferry_alloc_memory_fails_within_timeout)
{
    check_failure_within_bound("tcp", SIGSTOP, 1, NULL);
}

/* After the target unregisters a buffer, the next request to it is refused
 * at submit, and no memory outside live registrations changes. */
Test(ucx, unregistered_buffer_is_refused_and_untouched)
{
    start("sm,self", "ucx");
    put_get_refused_after_unregister(engine, local, "ucx");
}

/* A peer (1 MiB registered, its segment open) that dies and starts again
 * under the same name (its RPC address) with its arena at the same place
 * (address randomization off, inherited by the peers): the cached
 * descriptor still holds the range, so a request goes to the dead
 * incarnation first.  write_before: the first one was written to. */
static void restart_peer(peer_process_t *first, peer_process_t *second, ferry_segment_h *segment_p,
                         int write_before)
{
    personality(ADDR_NO_RANDOMIZE);
    start("sm,self", "ucx");
    cr_assert_eq(peer_start(first, NULL), 0);
    cr_assert_str_eq(peer_cmd(first, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, first->name, segment_p), FERRY_OK);
    if (write_before) {
        test_pattern_fill(local, MIB, 1);
        cr_assert_eq(transfer(FERRY_OP_WRITE, local, *segment_p, first->arena, MIB, "ucx"),
                     FERRY_OK);
    }
    peer_kill(first, SIGKILL);
    char address[64];
    snprintf(address, sizeof(address), "FERRY_RPC_ADDRESS=127.0.0.1:%d", peer_port(first));
    const char *env[] = {address, NULL};
    cr_assert_eq(peer_start(second, env), 0);
    cr_assert_str_eq(second->name, first->name, "the restarted peer keeps its name");
    cr_assert_eq(second->arena, first->arena, "no address randomization, the same arena");
    cr_assert_str_eq(peer_cmd(second, "reg 0 %zu", MIB), "OK");
}

Test(ucx, restarted_peer_is_reached_again)
{
    peer_process_t first, second;
    ferry_segment_h segment;
    restart_peer(&first, &second, &segment, 1);
    /* No refresh by the user: the engine notices the new incarnation. */
    double start_time = now();
    test_pattern_fill(local, MIB, 2);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, second.arena, MIB, "ucx"), FERRY_OK);
    cr_assert_lt(now() - start_time, 1.0, "the dead incarnation was noticed at once");
    cr_assert_str_eq(peer_cmd(&second, "check 0 %zu 2", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&second);
}

struct write_args {
    ferry_segment_h segment;
    uint64_t remote;
    ferry_status_t status;
};

static void write_to_arena(void *arg)
{
    struct write_args *args = arg;
    args->status = transfer(FERRY_OP_WRITE, local, args->segment, args->remote, MIB, "ucx");
}

/* An incarnation that died before we ever wrote to it: it is seen dead
 * before an endpoint is built into it (UCX would try to attach to the dead
 * process's memory and fail, loudly), and the write goes to the new one. */
Test(ucx, a_peer_dead_before_the_first_write_is_not_connected_to)
{
    peer_process_t first, second;
    ferry_segment_h segment;
    restart_peer(&first, &second, &segment, 0);
    struct write_args args = {segment, second.arena, FERRY_ERR_IO};
    test_pattern_fill(local, MIB, 3);
    char *log = capture_stderr(write_to_arena, &args);
    cr_assert_eq(args.status, FERRY_OK);
    cr_assert_null(strstr(log, "no endpoint"), "an endpoint into the dead process: %s", log);
    free(log);
    cr_assert_str_eq(peer_cmd(&second, "check 0 %zu 3", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&second);
}

/* A write of length bytes at the peer's arena through batch, waited for. */
static ferry_status_t batch_write(ferry_batch_h batch, ferry_segment_h segment,
                                  const peer_process_t *peer, size_t length)
{
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
                           .target_offset = peer->arena, .length = length};
    ferry_status_t status = ferry_batch_submit(batch, &req, 1);
    return status == FERRY_OK ? ferry_batch_wait(batch, 10000) : status;
}

/* A batch keeps the connection of its last submit for the next one: it
 * must follow the batch to another peer and back, notice its peer's death
 * (attached memory included, where a write would "succeed"), and reach the
 * peer's next incarnation; the other peer is not disturbed meanwhile. */
Test(ucx, one_batch_follows_its_peers_across_a_death_and_a_restart)
{
    start("sm,self", "ucx");
    static const char *const alloc_env[] = {"FERRY_TEST_PEER_ALLOC=1", NULL};
    peer_process_t attached, plain, again;
    ferry_segment_h to_attached, to_plain;
    cr_assert_eq(peer_start(&attached, alloc_env), 0);
    cr_assert_eq(peer_start(&plain, NULL), 0);
    cr_assert_str_eq(peer_cmd(&plain, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, attached.name, &to_attached), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, plain.name, &to_plain), FERRY_OK);
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    for (unsigned round = 1; round <= 4; round++) {
        test_pattern_fill(local, 64, round);
        cr_assert_eq(batch_write(batch, to_attached, &attached, 64), FERRY_OK);
        cr_assert_eq(batch_write(batch, to_attached, &attached, 64), FERRY_OK); /* cached */
        cr_assert_str_eq(peer_cmd(&attached, "check 0 64 %u", round), "OK");
        cr_assert_eq(batch_write(batch, to_plain, &plain, 64), FERRY_OK);
        cr_assert_str_eq(peer_cmd(&plain, "check 0 64 %u", round), "OK");
    }

    char address[64];
    snprintf(address, sizeof(address), "FERRY_RPC_ADDRESS=127.0.0.1:%d", peer_port(&attached));
    peer_kill(&attached, SIGKILL);
    usleep(100 * 1000); /* past the liveness look's interval (FERRY_UCX_LIVENESS_MS) */
    test_pattern_fill(local, 64, 9);
    cr_assert_neq(batch_write(batch, to_attached, &attached, 64), FERRY_OK,
                  "a write to a dead peer's attached memory completed");
    cr_assert_eq(batch_write(batch, to_plain, &plain, 64), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&plain, "check 0 64 9"), "OK");

    const char *env[] = {address, alloc_env[0], NULL};
    cr_assert_eq(peer_start(&again, env), 0);
    cr_assert_str_eq(again.name, attached.name);
    test_pattern_fill(local, 64, 10);
    cr_assert_eq(batch_write(batch, to_attached, &again, 64), FERRY_OK);
    cr_assert_eq(batch_write(batch, to_attached, &again, 64), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&again, "check 0 64 10"), "OK");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    ferry_segment_close(engine, to_attached);
    ferry_segment_close(engine, to_plain);
    peer_stop(&again);
    peer_stop(&plain);
}

/* Write an 8-byte counter, the same request again and again through one
 * batch (the repeat and short paths), then read it back with a batch of its
 * own; returns the status of the first write that failed, else FERRY_OK. */
static ferry_status_t repeat_counter(ferry_batch_h batch, ferry_segment_h segment,
                                     uint64_t remote, uint64_t first, unsigned times)
{
    uint64_t *counter = (uint64_t *)local;
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = counter, .target = segment,
                           .target_offset = remote, .length = sizeof(*counter)};
    for (unsigned i = 0; i < times; i++) {
        *counter = first + i;
        ferry_status_t status = ferry_batch_submit(batch, &req, 1);
        if (status == FERRY_OK)
            status = ferry_batch_wait(batch, 10000);
        if (status != FERRY_OK)
            return status;
    }
    uint64_t *back = (uint64_t *)(local + 4096);
    *back = 0;
    ferry_status_t status = transfer(FERRY_OP_READ, back, segment, remote, sizeof(*back), "ucx");
    if (status == FERRY_OK)
        cr_assert_eq(*back, first + times - 1, "the last write did not land");
    return status;
}

/* A batch whose every round is the previous one again skips resolving it
 * (ucx: and the key lookup): the target's unregistering, freeing and
 * allocating again must each be seen by the very next round. */
Test(ucx, a_request_repeated_through_one_batch_follows_the_targets_buffers)
{
    start("sm,self", "ucx");
    peer_process_t peer;
    ferry_segment_h segment;
    ferry_batch_h batch;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_register(engine, local, MIB, "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);

    /* Registered memory (ucp puts), then gone, then back. */
    cr_assert_eq(repeat_counter(batch, segment, peer.arena + 64, 100, 50), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "unreg 0"), "OK");
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&peer, "sum 0 %zu", MIB));
    cr_assert_eq(repeat_counter(batch, segment, peer.arena + 64, 200, 1), FERRY_ERR_OUT_OF_RANGE,
                 "a repeated write reached an unregistered buffer");
    cr_assert_str_eq(peer_cmd(&peer, "sum 0 %zu", MIB), before, "unregistered memory changed");
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(repeat_counter(batch, segment, peer.arena + 64, 300, 50), FERRY_OK);

    /* Attached memory (ferry_alloc: plain stores), freed, allocated again:
     * where the new buffer lands where the old one was, the write must go
     * to the new one. */
    uintptr_t first, second;
    cr_assert_eq(sscanf(peer_cmd(&peer, "alloc %zu", 64 * (size_t)1024), "ALLOC %lx", &first), 1);
    cr_assert_eq(repeat_counter(batch, segment, first + 8, 400, 50), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "free 0x%lx", (unsigned long)first), "OK");
    cr_assert_eq(repeat_counter(batch, segment, first + 8, 500, 1), FERRY_ERR_OUT_OF_RANGE,
                 "a repeated write reached a freed buffer");
    cr_assert_eq(sscanf(peer_cmd(&peer, "alloc %zu", 64 * (size_t)1024), "ALLOC %lx", &second), 1);
    cr_assert_eq(repeat_counter(batch, segment, second + 8, 600, 50), FERRY_OK);
    cr_assert_eq(repeat_counter(batch, segment, first + 8, 700, 1),
                 second == first ? FERRY_OK : FERRY_ERR_OUT_OF_RANGE);

    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(ferry_unregister(engine, local), FERRY_OK);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* UCX 1.13 leaves posix/sysv shared memory out of endpoints with peer error
 * handling unless UCX_{POSIX,SYSV}_ERROR_HANDLING=y; the plugin turns them
 * on.  FERRY_UCX_SAME_HOST_SHM=require makes ucx refuse a same-host endpoint
 * whose lanes include no shared memory, so the native tcp transport serves
 * the request instead: the transport in the status tells which happened. */
static const char *same_host_write_transport(int debian_defaults, int allocated)
{
    setenv("FERRY_UCX_SAME_HOST_SHM", "require", 1);
    if (debian_defaults) {
        /* What UCX does without the plugin's setting, the user's choice here. */
        setenv("UCX_POSIX_ERROR_HANDLING", "n", 1);
        setenv("UCX_SYSV_ERROR_HANDLING", "n", 1);
    }
    start(NULL, "ucx,tcp"); /* every UCX transport: shm, cma, tcp */
    peer_process_t peer;
    ferry_segment_h segment;
    static const char *const alloc_env[] = {"FERRY_TEST_PEER_ALLOC=1", NULL};
    cr_assert_eq(peer_start(&peer, allocated ? alloc_env : NULL), 0);
    if (!allocated)
        cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", 8 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    test_pattern_fill(local, 8 * MIB, 4);
    ferry_batch_h batch;
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
                           .target_offset = peer.arena, .length = 8 * MIB};
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    ferry_xfer_status_t xs;
    cr_assert_eq(ferry_batch_status(batch, 0, &xs), FERRY_OK);
    static char transport[32];
    snprintf(transport, sizeof(transport), "%s", xs.transport);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 4", 8 * MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    return transport;
}

Test(ucx, same_host_transfer_uses_shared_memory)
{
    cr_assert_str_eq(same_host_write_transport(0, 1), "ucx",
                     "the ucx endpoint to a same-host peer has a shared-memory lane");
}

Test(ucx, without_shm_error_handling_ucx_falls_back_to_tcp_loopback)
{
    /* The control: with Debian's defaults UCX would have used TCP over
     * loopback, which require refuses, so the native tcp transport served. */
    cr_assert_str_eq(same_host_write_transport(1, 1), "tcp");
}

/* A same-host peer's registered user memory: UCX could only emulate RMA
 * through its shared-memory FIFOs, so another transport serves it, unless
 * the user asks for the emulation. */
Test(ucx, same_host_registered_memory_prefers_another_transport)
{
    cr_assert_str_eq(same_host_write_transport(0, 0), "tcp");
}

Test(ucx, same_host_registered_memory_through_ucx_when_asked)
{
    setenv("FERRY_UCX_SAME_HOST_EMULATED", "y", 1);
    cr_assert_str_eq(same_host_write_transport(0, 0), "ucx");
}

struct notify_case {
    ferry_segment_h segment;
    peer_process_t *peer;
    const char *msg;
};

static void write_with_notify(void *arg)
{
    struct notify_case *c = arg;
    ferry_batch_h batch;
    test_pattern_fill(local, MIB, 5);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = local, .target = c->segment,
                           .target_offset = c->peer->arena, .length = MIB};
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_notify(batch, c->segment, c->msg, strlen(c->msg)), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(ferry_notify_send(engine, c->segment, "short", 5), FERRY_OK);
}

/* A notify attached to a batch arrives, after the data, through UCX active
 * messages: the engine would fall back to its RPC only after logging that
 * the transport failed, and nothing is logged. */
Test(ucx, notify_arrives_through_ucx_after_the_data)
{
    unsetenv("FERRY_LOG_LEVEL");
    start("sm,self", "ucx");
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    char msg[301];
    for (size_t i = 0; i < sizeof(msg) - 1; i++)
        msg[i] = (char)('a' + i % 26);
    msg[sizeof(msg) - 1] = '\0';
    struct notify_case c = {segment, &peer, msg};
    char *logged = capture_stderr(write_with_notify, &c);
    cr_assert(strstr(logged, "trying RPC") == NULL, "the notify fell back to RPC:\n%s", logged);
    free(logged);

    char expected[512];
    snprintf(expected, sizeof(expected), "NOTIFY %s %s", ferry_engine_segment_name(engine), msg);
    cr_assert_str_eq(peer_cmd(&peer, "notify 5000"), expected);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 5", MIB), "OK", "the data came first");
    snprintf(expected, sizeof(expected), "NOTIFY %s short", ferry_engine_segment_name(engine));
    cr_assert_str_eq(peer_cmd(&peer, "notify 5000"), expected, "ferry_notify_send too");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* ferry_notify_send returns once the owner queued the notify (ferry.h): the
 * owner's first look finds it, every time, with no wait.  (UCX's completion
 * of the send alone means the bytes reached the owner's receive queue, which
 * its progress thread may not have read yet.) */
Test(ucx, notify_is_queued_at_the_owner_when_send_returns)
{
    start("sm,self", "ucx");
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 4096"), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    char expected[512], msg[32];
    for (int i = 0; i < 200; i++) {
        snprintf(msg, sizeof(msg), "n%d", i);
        cr_assert_eq(ferry_notify_send(engine, segment, msg, strlen(msg)), FERRY_OK);
        snprintf(expected, sizeof(expected), "NOTIFY %s %s", ferry_engine_segment_name(engine),
                 msg);
        cr_assert_str_eq(peer_cmd(&peer, "notify 0"), expected, "notify %d", i);
    }
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* What ferry_info ARGS prints with ENV before it ("NAME=VALUE ..."). */
static const char *info_output(const char *env, const char *args)
{
    static char output[1 << 16];
    char command[1024];
    const char *info = getenv("FERRY_INFO");
    cr_assert_not_null(info);
    snprintf(command, sizeof(command), "%s %s %s", env, info, args);
    FILE *pipe = popen(command, "r");
    cr_assert_not_null(pipe);
    size_t n = fread(output, 1, sizeof(output) - 1, pipe);
    output[n] = '\0';
    cr_assert_eq(pclose(pipe), 0);
    return output;
}

/* ferry_info shows UCX's version, the transports it found and the settings. */
Test(ucx, ferry_info_shows_ucx)
{
    /* One command: info_output's buffer holds one output at a time. */
    const char *output = info_output("", "; $FERRY_INFO -c");
    const char *expected[] = {"transport ucx", "ucx: UCX 1.", "transports: ", "self/",
                              "FERRY_UCX_WORKERS=", "FERRY_UCX_PROGRESS=", "FERRY_UCX_TIMEOUT=",
                              "FERRY_UCX_SPIN=", "FERRY_UCX_SLICE_SIZE=",
                              "FERRY_UCX_SAME_HOST_SHM="};
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
        cr_assert(strstr(output, expected[i]) != NULL, "missing %s in:\n%s", expected[i],
                  output);
}

static int info_mentions(const char *env, const char *text)
{
    return strstr(info_output(env, ""), text) != NULL;
}

/* ferry_info lists the UCX defaults the plugin changes, and a user's own
 * choice (here a receive segment, which bounds the send segment) keeps
 * UCX's. */
Test(ucx, ferry_info_lists_the_changed_ucx_defaults)
{
    cr_assert(info_mentions("", "UCX_TCP_TX_SEG_SIZE=64K"));
    cr_assert(info_mentions("", "UCX_POSIX/SYSV_ERROR_HANDLING=y"));
    cr_assert(!info_mentions("UCX_TCP_RX_SEG_SIZE=32K", "UCX_TCP_TX_SEG_SIZE="));
    cr_assert(!info_mentions("UCX_TLS=sm,self", "UCX_TCP_TX_SEG_SIZE="),
              "no tcp transport, nothing to change");
    cr_assert(!info_mentions("UCX_POSIX_ERROR_HANDLING=n", "ERROR_HANDLING=y"));
}

/* A bad setting is refused with a clear error, not a crash. */
Test(ucx, bad_setting_fails_engine_creation)
{
    setenv("FERRY_TRANSPORTS", "ucx", 1);
    setenv("FERRY_UCX_PROGRESS", "sometimes", 1);
    cr_assert_neq(ferry_engine_create(NULL, &engine), FERRY_OK);
    engine = NULL;
}

/* Put into the store a copy of segment "honest"'s descriptor named
 * "forged" whose buffer of honest_length bytes claims 1 GiB instead. */
static void publish_forged(const service_t *metad, size_t honest_length)
{
    static char json[1 << 16];
    size_t length;
    cr_assert_eq(http_call(metad->port, "GET", "/metadata?key=ferry%2Fsegments%2Fhonest", NULL,
                           NULL, 0, json, sizeof(json), &length),
                 200);
    char buffer_length[32];
    static char forged[1 << 17];
    snprintf(buffer_length, sizeof(buffer_length), "\"length\":\"%zu\"", honest_length);
    char *name = strstr(json, "\"name\":\"honest\"");
    char *buffer = strstr(json, buffer_length);
    cr_assert(name != NULL && buffer != NULL, "unexpected descriptor %s", json);
    *name = '\0';
    *buffer = '\0';
    int n = snprintf(forged, sizeof(forged), "%s\"name\":\"forged\"%.*s\"length\":\"1073741824\"%s",
                     json, (int)(buffer - name - strlen("\"name\":\"honest\"")),
                     name + strlen("\"name\":\"honest\""), buffer + strlen(buffer_length));
    cr_assert(n > 0 && (size_t)n < sizeof(forged));
    cr_assert_eq(http_call(metad->port, "PUT", "/metadata?key=ferry%2Fsegments%2Fforged", NULL,
                           forged, strlen(forged), NULL, 0, NULL),
                 200);
}

static const char *const honest_env[] = {"FERRY_SEGMENT_NAME=honest", NULL};

/* One batch of four 64 KiB writes, the one at index refused (-1: none)
 * aimed past the registration; returns the batch's wait status and checks
 * that the refused one reports FERRY_ERR_OUT_OF_RANGE.  Over tcp the four
 * share one acknowledgement, so a refusal in the middle of the run must
 * reach it. */
static ferry_status_t write_run(ferry_segment_h segment, uint64_t arena, int refused)
{
    enum { N = 4 };
    const size_t block = 64 * 1024;
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE,
                                    .local = local + i * block,
                                    .target = segment,
                                    .target_offset = i == refused ? arena + MIB + 4096
                                                                  : arena + 64 + i * block,
                                    .length = block};
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    ferry_status_t status = ferry_batch_wait(batch, 30000);
    if (refused >= 0) {
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, (size_t)refused, &xs), FERRY_OK);
        cr_assert_eq(xs.state, FERRY_XFER_FAILED, "write %d of the run", refused);
        cr_assert_eq(xs.error, FERRY_ERR_OUT_OF_RANGE, "write %d of the run: %s", refused,
                     ferry_status_string(xs.error));
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    return status;
}

/* Over tcp writes go eager: the target itself checks the range against
 * its registrations, so a forged descriptor's claim gets
 * FERRY_ERR_OUT_OF_RANGE from it, with nothing written. */
Test(ucx, forged_descriptor_cannot_make_an_eager_write_reach_past_a_registration)
{
    /* The transport's own checks, behind the owner's confirmation, which
     * would refuse these forged descriptors before any of them is used. */
    setenv("FERRY_CONFIRM_DESCRIPTORS", "no", 1);
    service_t metad;
    service_start_forgery_store(&metad);
    setenv("FERRY_UCX_SAME_HOST_SHM", "ignore", 1);
    start("tcp", "ucx");
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, honest_env), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 21", MIB, MIB), "OK");
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&peer, "sum %zu %zu", MIB, MIB));
    publish_forged(&metad, MIB);

    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, "forged", &segment), FERRY_OK);
    for (size_t length = 1; length <= 256 * 1024; length *= 8) {
        test_pattern_fill(local, length, (unsigned)length);
        cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + 64, length, "ucx"),
                     FERRY_OK, "%zu bytes inside the registration", length);
        cr_assert_str_eq(peer_cmd(&peer, "check 64 %zu %zu", length, length), "OK");
        cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + MIB + 4096, length,
                              NULL),
                     FERRY_ERR_OUT_OF_RANGE, "%zu bytes past the registration", length);
        size_t across = length < 2 ? 2 : length;
        cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + MIB - 1, across, NULL),
                     FERRY_ERR_OUT_OF_RANGE, "%zu bytes across its end", across);
    }
    /* A write longer than FERRY_UCX_EAGER_PIECE goes in pieces, each checked
     * against the whole write: the pieces inside the registration are
     * refused with the rest. */
    const size_t whole = 256 * 1024, inside = 192 * 1024;
    char kept[64];
    snprintf(kept, sizeof(kept), "%s", peer_cmd(&peer, "sum %zu %zu", MIB - inside, inside));
    test_pattern_fill(local, whole, 23);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + MIB - inside, whole, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a write of pieces across the end");
    cr_assert_str_eq(peer_cmd(&peer, "sum %zu %zu", MIB - inside, inside), kept,
                     "a refused write's first pieces were written");
    test_pattern_fill(local, 4 * 64 * 1024, 22);
    for (int refused = 0; refused < 4; refused++) {
        cr_assert_neq(write_run(segment, peer.arena, refused), FERRY_OK, "refused: %d", refused);
        /* The next run starts clean: the refusal was the last run's. */
        cr_assert_eq(write_run(segment, peer.arena, -1), FERRY_OK, "after refused %d", refused);
        cr_assert_str_eq(peer_cmd(&peer, "check 64 %zu 22", (size_t)4 * 64 * 1024), "OK");
    }
    cr_assert_str_eq(peer_cmd(&peer, "sum %zu %zu", MIB, MIB), before,
                     "memory outside the registration changed");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    stop(); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

/* A descriptor that claims more than the peer's ferry_alloc buffer (put in
 * the metadata store by someone else): ucx copies only inside what the key
 * really maps, and refuses the rest without touching memory. */
Test(ucx, forged_descriptor_cannot_reach_past_the_attached_memory)
{
    /* The transport's own checks, behind the owner's confirmation, which
     * would refuse these forged descriptors before any of them is used. */
    setenv("FERRY_CONFIRM_DESCRIPTORS", "no", 1);
    service_t metad;
    service_start_forgery_store(&metad);
    start("sm,self", "ucx");
    peer_process_t peer;
    static const char *const env[] = {"FERRY_TEST_PEER_ALLOC=1", "FERRY_SEGMENT_NAME=honest",
                                      NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    publish_forged(&metad, peer.arena_size);

    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(engine, "forged", &segment), FERRY_OK);
    test_pattern_fill(local, MIB, 31);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + 4096, MIB, "ucx"),
                 FERRY_OK, "inside the real buffer");
    cr_assert_str_eq(peer_cmd(&peer, "check 4096 %zu 31", MIB), "OK");
    uint64_t past = peer.arena + peer.arena_size + 16 * MIB;
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, past, 4096, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a write past the attached memory is refused");
    cr_assert_eq(transfer(FERRY_OP_READ, local, segment, past, 4096, NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a read past the attached memory is refused");
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, segment, peer.arena + peer.arena_size - 8, 4096,
                          NULL),
                 FERRY_ERR_OUT_OF_RANGE, "a write across the end is refused");
    cr_assert_str_eq(peer_cmd(&peer, "check 4096 %zu 31", MIB), "OK", "the peer still serves");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
    stop(); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

/* The same with ferry_alloc memory, which ucx attaches: once the peer frees
 * a buffer (and says so), requests to it are refused, others go on. */
Test(ucx, freed_ferry_alloc_buffer_is_refused_and_others_work)
{
    start("sm,self", "ucx");
    peer_process_t peer;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    put_get_after_free(engine, &peer, local, "cpu", "ucx");
    peer_stop(&peer);
}
