/* Failures: killed, stopped and restarted peers, hostile frames, invalidation. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/personality.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../src/transport/tcp/tcp.h"
#include "capture_stderr.h"
#include "forged_store.h"
#include "peer_process.h"
#include "tcp_client.h"
#include "service_process.h"
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

static void setup(void)
{
    setenv("FERRY_TCP_TIMEOUT", "1000", 1);
    setenv("FERRY_TRANSPORTS", "tcp", 1); /* peers inherit both */
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&local, 4096, 72 * MIB), 0);
    memset(local, 1, 72 * MIB);
}

static void teardown(void)
{
    ferry_engine_destroy(engine);
    free(local);
}

TestSuite(faults, .init = setup, .fini = teardown, .timeout = 120);

/* One request through engine e; its status. */
static ferry_status_t one_via(ferry_engine_h e, ferry_opcode_t op, void *buf,
                              ferry_segment_h segment, uint64_t remote, size_t length)
{
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(e, 1, &batch), FERRY_OK);
    ferry_request_t req = {
        .opcode = op, .local = buf, .target = segment, .target_offset = remote, .length = length};
    ferry_status_t status = ferry_batch_submit(batch, &req, 1);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, 30000);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    return status;
}

static ferry_status_t write_once(ferry_segment_h segment, uint64_t remote, size_t length)
{
    return one_via(engine, FERRY_OP_WRITE, local, segment, remote, length);
}

/* Start writes of `count` x 64 MiB, hurt the peer, and time the failure. */
static void check_failure_within_bound(int sig)
{
    peer_process_t victim, bystander;
    ferry_segment_h victim_seg, bystander_seg;
    cr_assert_eq(peer_start(&victim, NULL), 0);
    cr_assert_eq(peer_start(&bystander, NULL), 0);
    cr_assert_str_eq(peer_cmd(&victim, "reg 0 %zu", 64 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(&bystander, "reg 0 %zu", 4 * MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, victim.name, &victim_seg), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, bystander.name, &bystander_seg), FERRY_OK);

    enum { N = 64 };
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local,
                                    .target = victim_seg, .target_offset = victim.arena,
                                    .length = 64 * MIB};
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_ERR_BUSY, "destroyed with 4 GiB in flight");
    usleep(50000);
    double start = now();
    peer_kill(&victim, sig);
    ferry_status_t status = ferry_batch_wait(batch, 20000);
    double elapsed = now() - start;
    cr_assert_neq(status, FERRY_OK, "4 GiB cannot finish once the peer is gone");
    cr_assert_neq(status, FERRY_ERR_TIMEOUT, "requests must FAIL, not hang");
    cr_assert_lt(elapsed, 5.0, "failure took %.2f s (bound: FERRY_TCP_TIMEOUT=1 s)", elapsed);
    int failed = 0;
    for (int i = 0; i < N; i++) {
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, (size_t)i, &xs), FERRY_OK);
        cr_assert(xs.state == FERRY_XFER_COMPLETED || xs.state == FERRY_XFER_FAILED);
        failed += xs.state == FERRY_XFER_FAILED;
    }
    cr_assert_gt(failed, 0);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);

    /* Other peers are unaffected. */
    test_pattern_fill(local, 4 * MIB, 8);
    cr_assert_eq(write_once(bystander_seg, bystander.arena, 4 * MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&bystander, "check 0 %zu 8", 4 * MIB), "OK");
    if (sig != SIGKILL)
        peer_kill(&victim, SIGKILL);
    ferry_segment_close(engine, victim_seg);
    ferry_segment_close(engine, bystander_seg);
    peer_stop(&bystander);
}

Test(faults, killed_peer_fails_in_flight_requests_quickly)
{
    check_failure_within_bound(SIGKILL);
}

Test(faults, frozen_peer_fails_in_flight_requests_within_timeout)
{
    check_failure_within_bound(SIGSTOP);
}

Test(faults, restarted_peer_is_reached_again)
{
    /* Inherited by the peers: the second one's arena is where the first
     * one's was, so the cached descriptor still holds the range and the
     * request goes out to the old incarnation: the transport's failure
     * (its tcp endpoint is gone) makes the engine refresh and retry once. */
    personality(ADDR_NO_RANDOMIZE);
    peer_process_t first, second;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&first, NULL), 0);
    cr_assert_str_eq(peer_cmd(&first, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, first.name, &segment), FERRY_OK);
    test_pattern_fill(local, MIB, 1);
    cr_assert_eq(write_once(segment, first.arena, MIB), FERRY_OK);
    peer_kill(&first, SIGKILL);

    char address[64];
    snprintf(address, sizeof(address), "FERRY_RPC_ADDRESS=127.0.0.1:%d", peer_port(&first));
    const char *env[] = {address, NULL};
    cr_assert_eq(peer_start(&second, env), 0);
    cr_assert_str_eq(second.name, first.name, "the restarted peer keeps its name");
    cr_assert_eq(second.arena, first.arena, "no address randomization, the same arena");
    cr_assert_str_eq(peer_cmd(&second, "reg 0 %zu", MIB), "OK");
    /* No refresh by the user: the engine notices the new generation. */
    test_pattern_fill(local, MIB, 2);
    cr_assert_eq(write_once(segment, second.arena, MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&second, "check 0 %zu 2", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&second);
}

/*
 * A run of requests (one registered local buffer, one target buffer) to a
 * restarted peer: the transport refuses the run as a whole, and each
 * request then refreshes and goes alone, with a run of its own and its own
 * references.  Every byte arrives, and the references balance: the batch
 * goes, and the local buffer unregisters at once.
 */
Test(faults, restarted_peer_is_reached_again_by_a_run_of_requests)
{
    personality(ADDR_NO_RANDOMIZE);
    enum { N = 16, L = 4096 };
    peer_process_t first, second;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&first, NULL), 0);
    cr_assert_str_eq(peer_cmd(&first, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, first.name, &segment), FERRY_OK);
    cr_assert_eq(ferry_register(engine, local, MIB, "cpu", 0), FERRY_OK);
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local + i * L,
                                    .target = segment, .target_offset = first.arena + i * L,
                                    .length = L};
    test_pattern_fill(local, N * L, 1);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    peer_kill(&first, SIGKILL);

    char address[64];
    snprintf(address, sizeof(address), "FERRY_RPC_ADDRESS=127.0.0.1:%d", peer_port(&first));
    const char *env[] = {address, NULL};
    cr_assert_eq(peer_start(&second, env), 0);
    cr_assert_eq(second.arena, first.arena, "no address randomization, the same arena");
    cr_assert_str_eq(peer_cmd(&second, "reg 0 %zu", MIB), "OK");
    test_pattern_fill(local, N * L, 2);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&second, "check 0 %d 2", N * L), "OK");
    /* Submitted again, as one run to the new incarnation. */
    test_pattern_fill(local, N * L, 3);
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&second, "check 0 %d 3", N * L), "OK");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    double start = now();
    cr_assert_eq(ferry_unregister(engine, local), FERRY_OK);
    cr_assert_lt(now() - start, 2.0, "a hold of the run outlived its requests");
    ferry_segment_close(engine, segment);
    peer_stop(&second);
}

Test(faults, unregister_tells_peers_at_once)
{
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", MIB, MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(write_once(segment, peer.arena + MIB, MIB), FERRY_OK);
    double start = now();
    cr_assert_str_eq(peer_cmd(&peer, "unreg %zu", MIB), "OK");
    cr_assert_lt(now() - start, 2.0);
    /* Our cached descriptor was invalidated, so the stale range is refused
     * here at submit, not sent to the peer. */
    cr_assert_eq(write_once(segment, peer.arena + MIB, 100), FERRY_ERR_OUT_OF_RANGE);
    cr_assert_eq(write_once(segment, peer.arena, 100), FERRY_OK);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

Test(faults, dead_owner_gives_a_clear_error)
{
    ferry_segment_h segment;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    bind(fd, (struct sockaddr *)&sin, sizeof(sin));
    getsockname(fd, (struct sockaddr *)&sin, &len);
    close(fd); /* a port nobody listens on */
    char name[64];
    snprintf(name, sizeof(name), "127.0.0.1:%d", ntohs(sin.sin_port));
    double start = now();
    cr_assert_eq(ferry_segment_open(engine, name, &segment), FERRY_ERR_CONNECT);
    cr_assert_lt(now() - start, 3.0);
}

/* ---- a hostile initiator speaking the TCP transport's wire format ---- */

/* The tcp transport's endpoint and the generation in an open segment's descriptor. */
static uint64_t tcp_endpoint(ferry_segment_h segment, char *endpoint, size_t len)
{
    char *json;
    uint64_t generation;
    cr_assert_eq(ferry_segment_describe(engine, segment, &json), FERRY_OK);
    tcp_client_target_of(json, endpoint, len, &generation);
    free(json);
    return generation;
}
Test(faults, hostile_frames_touch_nothing_and_leave_the_target_serving)
{
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 4", MIB, MIB), "OK");
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&peer, "sum %zu %zu", MIB, MIB));
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    char endpoint[64];
    uint64_t generation = tcp_endpoint(segment, endpoint, sizeof(endpoint));

    int fd = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(fd, generation ^ 1), FERRY_ERR_STALE, "wrong generation is refused");
    close(fd);

    fd = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(fd, generation), 0);
    /* A write just past the registered megabyte, with its payload. */
    tcp_client_request(fd, FERRY_TCP_OP_WRITE, 0, peer.arena + MIB - 8, 4096);
    static unsigned char junk[4096];
    memset(junk, 0xee, sizeof(junk));
    cr_assert_eq(send(fd, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    cr_assert_lt(tcp_client_response(fd, 0), 0, "out-of-range write must be refused");
    tcp_client_request(fd, FERRY_TCP_OP_READ, 1, peer.arena + 2 * MIB, 64);
    cr_assert_lt(tcp_client_response(fd, 1), 0, "out-of-range read must be refused");
    tcp_client_request(fd, FERRY_TCP_OP_READ, 2, peer.arena + 100, 64); /* in range: served */
    cr_assert_eq(tcp_client_response(fd, 2), 0);
    unsigned char data[64];
    cr_assert_eq(tcp_client_recv(fd, data, sizeof(data)), 0);
    tcp_client_request(fd, 9, 3, peer.arena, 8); /* unknown opcode: the connection is closed */
    cr_assert(tcp_client_closed(fd));
    close(fd);
    fd = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(fd, generation), 0);
    tcp_client_request(fd, FERRY_TCP_OP_WRITE, 0, peer.arena, (uint64_t)1 << 40); /* absurd length */
    cr_assert(tcp_client_closed(fd));
    close(fd);
    fd = tcp_client_connect(endpoint);
    cr_assert_eq(send(fd, "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL), 18);
    cr_assert(tcp_client_closed(fd));
    close(fd);

    cr_assert_str_eq(peer_cmd(&peer, "sum %zu %zu", MIB, MIB), before,
                     "memory outside the registered buffer changed");
    test_pattern_fill(local, MIB, 6);
    cr_assert_eq(write_once(segment, peer.arena, MIB), FERRY_OK, "the target still serves");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 6", MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

Test(faults, garbage_to_the_rpc_listener_leaves_it_serving)
{
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    int fd = tcp_client_connect(peer.name);
    unsigned char garbage[64];
    for (size_t i = 0; i < sizeof(garbage); i++)
        garbage[i] = (unsigned char)(i * 37 + 11);
    send(fd, garbage, sizeof(garbage), MSG_NOSIGNAL);
    cr_assert(tcp_client_closed(fd));
    close(fd);
    /* A valid header announcing a 1 GiB frame. */
    fd = tcp_client_connect(peer.name);
    unsigned char header[16] = {'F', 'R', 'R', 'Y', 1, 1, 0, 0, 0, 0, 0, 0, 0x40, 0, 0, 0};
    send(fd, header, sizeof(header), MSG_NOSIGNAL);
    cr_assert(tcp_client_closed(fd));
    close(fd);
    /* A truncated header from a client that then goes silent. */
    int slow = tcp_client_connect(peer.name);
    send(slow, header, 5, MSG_NOSIGNAL);
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK,
                 "the listener still answers");
    close(slow);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

Test(faults, idle_connections_do_not_lock_out_the_rpc_listener)
{
    peer_process_t peer;
    ferry_segment_h segment;
    cr_assert_eq(peer_start(&peer, NULL), 0);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", MIB), "OK");
    /* More idle connections than the listener keeps, then half headers. */
    enum { IDLE = 300, HALF = 20 };
    static int fds[IDLE + HALF];
    unsigned char header[16] = {'F', 'R', 'R', 'Y', 1, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < IDLE + HALF; i++) {
        fds[i] = tcp_client_connect(peer.name);
        if (i >= IDLE)
            cr_assert_eq(send(fds[i], header, 7, MSG_NOSIGNAL), 7);
    }
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK,
                 "the listener still answers");
    test_pattern_fill(local, MIB, 3);
    cr_assert_eq(write_once(segment, peer.arena, MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 3", MIB), "OK");
    for (int i = 0; i < IDLE + HALF; i++)
        close(fds[i]);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* ---- the tcp listener against idle and half-finished connections ---- */

/* Room for n more descriptors in this process; skips the test where the
 * hard limit does not allow it. */
static void allow_descriptors(rlim_t n)
{
    struct rlimit limit;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &limit), 0);
    if (limit.rlim_cur >= n)
        return;
    if (limit.rlim_max != RLIM_INFINITY && limit.rlim_max < n)
        cr_skip_test("RLIMIT_NOFILE hard limit %llu < %llu", (unsigned long long)limit.rlim_max,
                     (unsigned long long)n);
    limit.rlim_cur = n;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &limit), 0);
}

/* A peer engine started with env and a registered megabyte, its segment
 * open here; fills its tcp endpoint and returns its generation. */
static uint64_t start_target(peer_process_t *peer, const char *const *env,
                             ferry_segment_h *segment_p, char *endpoint, size_t len)
{
    cr_assert_eq(peer_start(peer, env), 0);
    cr_assert_str_eq(peer_cmd(peer, "reg 0 %zu", MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer->name, segment_p), FERRY_OK);
    return tcp_endpoint(*segment_p, endpoint, len);
}

Test(faults, idle_tcp_connections_do_not_lock_out_an_initiator)
{
    enum { FLOOD = 1100, MAX_CONNS = 48, PER_SOURCE = 24 };
    static const char *const sources[] = {"127.0.0.1", "127.0.0.2", "127.0.0.3"};
    allow_descriptors(FLOOD + 256);
    const char *env[] = {"FERRY_TCP_MAX_CONNS=48", "FERRY_TCP_MAX_CONNS_PER_SOURCE=24", NULL};
    peer_process_t peer;
    ferry_segment_h segment;
    char endpoint[64];
    uint64_t generation = start_target(&peer, env, &segment, endpoint, sizeof(endpoint));

    /* More connections than the old fixed cap (1,024), each past its HELLO
     * and then idle, from three addresses, one of them the initiator's. */
    static int fds[FLOOD];
    int greeted = 0;
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = tcp_client_connect_from(sources[i % 3], endpoint);
        greeted += tcp_client_hello(fds[i], generation) == 0;
    }
    cr_assert_gt(greeted, MAX_CONNS);
    test_pattern_fill(local, MIB, 9);
    cr_assert_eq(write_once(segment, peer.arena, MIB), FERRY_OK, "the initiator is locked out");
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 9", MIB), "OK");

    /* The flood holds no more than the caps: each newcomer evicted the oldest. */
    int open = FLOOD, open_per_source[3];
    for (int attempt = 0; attempt < 200 && open > MAX_CONNS - 1; attempt++) {
        usleep(10 * 1000);
        open = 0;
        memset(open_per_source, 0, sizeof(open_per_source));
        for (int i = 0; i < FLOOD; i++) {
            int still = !tcp_client_closed_already(fds[i]);
            open += still;
            open_per_source[i % 3] += still;
        }
    }
    cr_assert_leq(open, MAX_CONNS - 1, "%d of the flood still open", open); /* 1: ours, at least */
    for (int s = 0; s < 3; s++)
        cr_assert_leq(open_per_source[s], PER_SOURCE, "%d open from %s", open_per_source[s],
                      sources[s]);
    cr_assert(!tcp_client_closed_already(fds[FLOOD - 1]), "the newest connection was evicted");
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/* Milliseconds until the peer closed fd, -1 if not within max_ms; the
 * request header in trickle (if any) goes out a byte every 100 ms meanwhile. */
static long ms_until_closed(int fd, int max_ms, const unsigned char *trickle, size_t trickle_len)
{
    uint64_t start = ferry_time_ms();
    size_t sent = 0;
    while (ferry_time_ms() - start < (uint64_t)max_ms) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 100) == 1 && tcp_client_closed_already(fd))
            return (long)(ferry_time_ms() - start);
        if (trickle != NULL && sent < trickle_len)
            cr_assert_eq(send(fd, trickle + sent++, 1, MSG_NOSIGNAL), 1);
    }
    return -1;
}

Test(faults, tcp_listener_closes_idle_connections_and_trickled_headers)
{
    const char *env[] = {"FERRY_TCP_IDLE_TIMEOUT=1000", "FERRY_TCP_TIMEOUT=1000", NULL};
    peer_process_t peer;
    ferry_segment_h segment;
    char endpoint[64];
    uint64_t generation = start_target(&peer, env, &segment, endpoint, sizeof(endpoint));

    int idle = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(idle, generation), 0);
    long closed = ms_until_closed(idle, 5000, NULL, 0);
    cr_assert(closed >= 800 && closed <= 4000, "idle connection closed after %ld ms", closed);
    close(idle);

    /* A byte every 100 ms would keep a per-call socket timeout happy for 3 s. */
    int slow = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(slow, generation), 0);
    unsigned char header[FERRY_TCP_REQUEST_SIZE - 1] = {FERRY_TCP_OP_READ};
    closed = ms_until_closed(slow, 5000, header, sizeof(header));
    cr_assert(closed >= 800 && closed <= 2500, "trickled header closed after %ld ms", closed);
    close(slow);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

struct idle_writes {
    ferry_segment_h segment;
    uintptr_t arena;
    int tcp_port;
    int failed;
    int reused; /* connections kept past half the target's idle timeout */
};

/* Local ports of this network namespace's established connections to
 * port: this process's, as no other connects there.  Returns how many. */
static int ports_connected_to(int port, int *ports, int max)
{
    FILE *file = fopen("/proc/self/net/tcp", "r");
    cr_assert_not_null(file);
    char line[256];
    int n = 0;
    while (fgets(line, sizeof(line), file) != NULL) {
        unsigned local_port, remote_port, state;
        if (sscanf(line, " %*d: %*8s:%x %*8s:%x %x", &local_port, &remote_port, &state) == 3 &&
            (int)remote_port == port && state == 1 && n < max)
            ports[n++] = (int)local_port;
    }
    fclose(file);
    return n;
}

/* A write, a pause past half the target's idle timeout (but short of it),
 * another write: on new connections.  Then back-to-back writes over 2.5 s
 * (one connection busy, the other idle past the target's idle timeout), a
 * pause past it and one more write. */
static void write_around_idle_closes(void *arg)
{
    struct idle_writes *w = arg;
    int before[8], after[8];
    w->failed += write_once(w->segment, w->arena, 4096) != FERRY_OK;
    int n_before = ports_connected_to(w->tcp_port, before, 8);
    usleep(700 * 1000);
    w->failed += write_once(w->segment, w->arena, 4096) != FERRY_OK;
    int n_after = ports_connected_to(w->tcp_port, after, 8);
    for (int i = 0; i < n_before; i++)
        for (int j = 0; j < n_after; j++)
            w->reused += before[i] == after[j];
    double start = now();
    while (now() - start < 2.5)
        w->failed += write_once(w->segment, w->arena, 4096) != FERRY_OK;
    usleep(2000 * 1000); /* the target closes every connection meanwhile */
    w->failed += write_once(w->segment, w->arena, MIB) != FERRY_OK;
}

/* The log level is read once per process, at the first engine's creation. */
static void setup_info_log(void)
{
    setenv("FERRY_LOG_LEVEL", "info", 1);
    setup();
}

TestSuite(faults_logged, .init = setup_info_log, .fini = teardown, .timeout = 120);

Test(faults_logged, initiator_reconnects_when_the_target_closes_idle_connections)
{
    const char *env[] = {"FERRY_TCP_IDLE_TIMEOUT=1000", "FERRY_LOG_LEVEL=warn", NULL};
    peer_process_t peer;
    struct idle_writes w = {0};
    char endpoint[64];
    start_target(&peer, env, &w.segment, endpoint, sizeof(endpoint));
    w.arena = peer.arena;
    w.tcp_port = atoi(strrchr(endpoint, ':') + 1);
    test_pattern_fill(local, MIB, 5);
    char *log = capture_stderr(write_around_idle_closes, &w);
    cr_assert_not_null(log);
    cr_assert_eq(w.failed, 0, "%d writes failed:\n%s", w.failed, log);
    /* A request could meet the target's close on the wire: not past half of it. */
    cr_assert_eq(w.reused, 0, "a connection idle for 700 ms of the target's 1000 was reused");
    /* Transparent: no peer failure, so no refresh of the descriptor either. */
    cr_assert_null(strstr(log, "retrying"), "%s", log);
    free(log);
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %zu 5", MIB), "OK");
    ferry_segment_close(engine, w.segment);
    peer_stop(&peer);
}

/* A WRITE of length bytes at addr on a raw connection, payload sent: the
 * target's status. */
static int raw_write(int fd, uint64_t id, uint64_t addr, size_t length)
{
    static unsigned char junk[8192];
    memset(junk, 0xee, sizeof(junk));
    cr_assert_leq(length, sizeof(junk));
    tcp_client_request(fd, FERRY_TCP_OP_WRITE, id, addr, length);
    cr_assert_eq(send(fd, junk, length, MSG_NOSIGNAL), (ssize_t)length);
    return tcp_client_response(fd, id);
}

/* A READ on a raw connection: the target's status (the data is read). */
static int raw_read(int fd, uint64_t id, uint64_t addr, size_t length)
{
    static unsigned char data[8192];
    cr_assert_leq(length, sizeof(data));
    tcp_client_request(fd, FERRY_TCP_OP_READ, id, addr, length);
    int status = tcp_client_response(fd, id);
    if (status == 0)
        cr_assert_eq(tcp_client_recv(fd, data, length), 0);
    return status;
}

/* The peer's arena around the buffers these tests register (read-only at
 * 0, write-only at 2 MiB, read-write at 4 MiB up to rw_end): a pattern in
 * [0, 2M) (the read-only buffer and after it), [2M, 4M) (the write-only
 * buffer and up to the read-write one) and [rw_end, 8M). */
static void fill_regions(peer_process_t *peer, size_t rw_end)
{
    cr_assert_str_eq(peer_cmd(peer, "fill 0 %zu 4", 2 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(peer, "fill %zu %zu 5", 2 * MIB, 2 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(peer, "fill %zu %zu 7", rw_end, 8 * MIB - rw_end), "OK");
}

static void check_regions(peer_process_t *peer, size_t rw_end)
{
    cr_assert_str_eq(peer_cmd(peer, "check 0 %zu 4", 2 * MIB), "OK",
                     "the read-only buffer (or past it) was written");
    cr_assert_str_eq(peer_cmd(peer, "check %zu %zu 5", 2 * MIB, 2 * MIB), "OK",
                     "memory before the read-write buffer was written");
    cr_assert_str_eq(peer_cmd(peer, "check %zu %zu 7", rw_end, 8 * MIB - rw_end), "OK",
                     "memory past the read-write buffer was written");
}

/*
 * The tcp target's own checks, on requests no well-behaved initiator sends:
 * a WRITE into a read-only buffer and a READ of a write-only one are
 * refused; a request ending at a buffer's last byte is served, one ending
 * a byte later (or starting a byte before it) is refused; nothing refused
 * touches memory.
 */
Test(faults, the_tcp_target_checks_the_flags_and_the_exact_ends_of_buffers)
{
    peer_process_t peer;
    ferry_segment_h segment;
    static const char *const env[] = {"FERRY_TCP_MAX_SLICE=1m", NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    fill_regions(&peer, 5 * MIB);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu r", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu w", 2 * MIB, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu rw", 4 * MIB, MIB), "OK");
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    char endpoint[64];
    uint64_t generation;
    generation = tcp_endpoint(segment, endpoint, sizeof(endpoint));
    int fd = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(fd, generation), 0);

    uint64_t ro = peer.arena, wo = peer.arena + 2 * MIB, rw = peer.arena + 4 * MIB;
    cr_assert_lt(raw_write(fd, 0, ro + 4096, 4096), 0, "a WRITE into a read-only buffer");
    cr_assert_eq(raw_read(fd, 1, ro + 4096, 4096), 0, "a READ of the read-only buffer");
    cr_assert_lt(raw_read(fd, 2, wo + 4096, 4096), 0, "a READ of a write-only buffer");

    cr_assert_eq(raw_write(fd, 3, rw + MIB - 4096, 4096), 0, "a WRITE ending at the last byte");
    cr_assert_eq(raw_write(fd, 4, rw + MIB - 1, 1), 0, "a WRITE of the last byte");
    cr_assert_lt(raw_write(fd, 5, rw + MIB - 4095, 4096), 0, "a WRITE ending one byte past");
    cr_assert_lt(raw_write(fd, 6, rw + MIB, 1), 0, "a WRITE of the byte past the end");
    cr_assert_lt(raw_write(fd, 7, rw - 1, 4096), 0, "a WRITE starting one byte before");
    cr_assert_eq(raw_read(fd, 8, rw + MIB - 4096, 4096), 0, "a READ ending at the last byte");
    cr_assert_lt(raw_read(fd, 9, rw + MIB - 4095, 4096), 0, "a READ ending one byte past");
    cr_assert_lt(raw_read(fd, 10, rw - 1, 2), 0, "a READ starting one byte before");
    close(fd);
    check_regions(&peer, 5 * MIB);

    /* A request longer than the target's FERRY_TCP_MAX_SLICE (1 MiB here),
     * inside a buffer: a protocol error, the connection is closed unserved. */
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu rw", 6 * MIB, 2 * MIB), "OK");
    fd = tcp_client_connect(endpoint);
    cr_assert_eq(tcp_client_hello(fd, generation), 0);
    tcp_client_request(fd, FERRY_TCP_OP_READ, 11, peer.arena + 6 * MIB, MIB + 1);
    cr_assert(tcp_client_closed(fd), "a READ longer than the largest slice was served");
    close(fd);
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

/*
 * The same checks reached by a well-behaved initiator that believes a
 * forged store entry (a read-only buffer said to be writable, a write-only
 * one readable, a buffer said to be a page longer): the initiator sends
 * the requests, the target refuses them (FERRY_ERR_REMOTE_REFUSED, the
 * target's answer; the initiator's own refusals say OUT_OF_RANGE), and
 * nothing refused is written or read.
 */
Test(faults, the_tcp_target_refuses_what_a_forged_descriptor_claims)
{
    service_t metad;
    service_start_forgery_store(&metad);
    ferry_engine_h initiator;
    cr_assert_eq(ferry_engine_create(NULL, &initiator), FERRY_OK);
    peer_process_t peer;
    static const char *const env[] = {"FERRY_SEGMENT_NAME=honest", NULL};
    cr_assert_eq(peer_start(&peer, env), 0);
    fill_regions(&peer, 6 * MIB);
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu r", MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu w", 2 * MIB, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu rw", 4 * MIB, 2 * MIB), "OK");
    forged_store_publish(metad.port, "honest", "writable", "\"access\":\"r\"", "\"access\":\"rw\"");
    forged_store_publish(metad.port, "honest", "readable", "\"access\":\"w\"", "\"access\":\"rw\"");
    char longer[64];
    snprintf(longer, sizeof(longer), "\"length\":\"%zu\"", 2 * MIB + 4096);
    forged_store_publish(metad.port, "honest", "longer", "\"length\":\"2097152\"", longer);

    uint64_t ro = peer.arena, wo = peer.arena + 2 * MIB, rw = peer.arena + 4 * MIB;
    const uint64_t end = rw + 2 * MIB;
    ferry_segment_h writable, readable, past;
    cr_assert_eq(ferry_segment_open(initiator, "writable", &writable), FERRY_OK);
    cr_assert_eq(ferry_segment_open(initiator, "readable", &readable), FERRY_OK);
    cr_assert_eq(ferry_segment_open(initiator, "longer", &past), FERRY_OK);
    test_pattern_fill(local, 64 * 1024, 9);
    cr_assert_eq(one_via(initiator, FERRY_OP_WRITE, local, writable, ro + 4096, 64 * 1024),
                 FERRY_ERR_REMOTE_REFUSED, "a WRITE into a read-only buffer");
    memset(local + MIB, 0, 64 * 1024);
    cr_assert_eq(one_via(initiator, FERRY_OP_READ, local + MIB, readable, wo + 4096, 64 * 1024),
                 FERRY_ERR_REMOTE_REFUSED, "a READ of a write-only buffer");
    for (size_t i = 0; i < 64 * 1024; i++)
        cr_assert_eq(local[MIB + i], 0, "the write-only buffer was read");
    cr_assert_eq(one_via(initiator, FERRY_OP_WRITE, local, past, end - 4096, 4096), FERRY_OK,
                 "a WRITE ending at the last byte");
    cr_assert_eq(one_via(initiator, FERRY_OP_WRITE, local, past, end - 4095, 4096),
                 FERRY_ERR_REMOTE_REFUSED, "a WRITE ending one byte past the buffer");
    cr_assert_eq(one_via(initiator, FERRY_OP_READ, local + MIB, past, end - 4096, 4096), FERRY_OK,
                 "a READ ending at the last byte");
    cr_assert_eq(one_via(initiator, FERRY_OP_READ, local + MIB, past, end - 4095, 4096),
                 FERRY_ERR_REMOTE_REFUSED, "a READ ending one byte past the buffer");
    cr_assert_str_eq(peer_cmd(&peer, "check %zu 4096 9", end - peer.arena - 4096), "OK");
    check_regions(&peer, 6 * MIB);
    ferry_segment_close(initiator, writable);
    ferry_segment_close(initiator, readable);
    ferry_segment_close(initiator, past);
    peer_stop(&peer);
    ferry_engine_destroy(initiator); /* the engine leaves the store before the store goes */
    service_cleanup(&metad);
}

/* One batch of n requests of length bytes each between [remote, +length)
 * and local + i * stride. */
static ferry_status_t op_batch(ferry_opcode_t op, ferry_segment_h segment, uint64_t remote,
                               size_t length, int n, size_t stride)
{
    ferry_batch_h batch;
    ferry_request_t reqs[128];
    cr_assert_leq(n, 128);
    cr_assert_eq(ferry_batch_create(engine, (size_t)n, &batch), FERRY_OK);
    for (int i = 0; i < n; i++)
        reqs[i] = (ferry_request_t){.opcode = op, .local = local + (size_t)i * stride,
                                    .target = segment, .target_offset = remote, .length = length};
    ferry_status_t status = ferry_batch_submit(batch, reqs, (size_t)n);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, 30000);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    return status;
}

/* No setting asks for sockets: a small request keeps one, 64 MiB in flight
 * open more (up to twice the I/O threads), and they stay for the next. */
Test(faults, tcp_connections_follow_the_bytes_outstanding)
{
    peer_process_t peer;
    ferry_segment_h segment;
    char endpoint[64];
    start_target(&peer, NULL, &segment, endpoint, sizeof(endpoint));
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", 4 * MIB, 4 * MIB), "OK");
    int port = atoi(strrchr(endpoint, ':') + 1), ports[64];
    cr_assert_eq(write_once(segment, peer.arena, 4096), FERRY_OK);
    cr_assert_eq(ports_connected_to(port, ports, 64), 1, "one small write, one socket");
    test_pattern_fill(local, 4 * MIB, 3);
    cr_assert_eq(op_batch(FERRY_OP_WRITE, segment, peer.arena + 4 * MIB, 4 * MIB, 16, 0),
                 FERRY_OK);
    int open = ports_connected_to(port, ports, 64);
    cr_assert(open >= 2 && open <= 16, "%d sockets after 64 MiB in flight", open);
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu 3", 4 * MIB, 4 * MIB), "OK");
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}

static int threads_of_this_process(void)
{
    int n = 0;
    DIR *dir = opendir("/proc/self/task");
    cr_assert_not_null(dir);
    for (struct dirent *e; (e = readdir(dir)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

/* Threads per engine, never per peer or connection: one engine writing to
 * PEERS engines of this process starts no thread, at either end. */
Test(faults, tcp_threads_do_not_grow_with_peers)
{
    enum { PEERS = 24 };
    ferry_engine_h targets[PEERS];
    ferry_segment_h segments[PEERS];
    static unsigned char arenas[PEERS][4096];
    for (int i = 0; i < PEERS; i++) {
        cr_assert_eq(ferry_engine_create(NULL, &targets[i]), FERRY_OK);
        cr_assert_eq(ferry_register(targets[i], arenas[i], sizeof(arenas[i]), "cpu",
                                    FERRY_REG_REMOTE),
                     FERRY_OK);
        cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(targets[i]),
                                        &segments[i]),
                     FERRY_OK);
    }
    int before = threads_of_this_process();
    memset(local, 6, 4096);
    for (int i = 0; i < PEERS; i++)
        cr_assert_eq(write_once(segments[i], (uint64_t)(uintptr_t)arenas[i], 4096), FERRY_OK);
    cr_assert_eq(threads_of_this_process(), before, "threads grew with %d peers", PEERS);
    for (int i = 0; i < PEERS; i++) {
        cr_assert_eq(arenas[i][4095], 6);
        ferry_segment_close(engine, segments[i]);
        ferry_engine_destroy(targets[i]);
    }
}

/* More READs in one batch than the target serves in one turn (64 requests,
 * 4 MiB): a turn can end with a READ's data still to send and no request
 * left to read, and the data must still go (FERRY_TCP_TIMEOUT is 1 s here:
 * a connection waiting for input fails the batch). */
Test(faults, tcp_batches_of_reads_longer_than_a_turn_complete)
{
    peer_process_t peer;
    ferry_segment_h segment;
    char endpoint[64];
    start_target(&peer, NULL, &segment, endpoint, sizeof(endpoint));
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", 4 * MIB, 4 * MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 12", 4 * MIB, 4 * MIB), "OK");
    /* 16 x 4 MiB: 64 slices of 1 MiB, as ferry_bench's reads */
    static const struct {
        size_t length;
        int first, last;
    } cases[] = {{64 << 10, 63, 66}, {MIB, 3, 6}, {4 * MIB, 15, 17}};
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        size_t length = cases[c].length;
        for (int n = cases[c].first; n <= cases[c].last; n++) {
            memset(local, 0, (size_t)n * length);
            cr_assert_eq(op_batch(FERRY_OP_READ, segment, peer.arena + 4 * MIB, length, n, length),
                         FERRY_OK, "a batch of %d READs of %zu bytes", n, length);
            for (int i = 0; i < n; i++)
                cr_assert(test_pattern_check(local + (size_t)i * length, length, 12) == SIZE_MAX,
                          "READ %d of %d", i, n);
        }
    }
    ferry_segment_close(engine, segment);
    peer_stop(&peer);
}
