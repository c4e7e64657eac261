/* Control-plane RPC: frames, payload encoding, server robustness, client bounds. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../src/rpc/rpc.h"

#define TIMEOUT_MS 300
#define MAX_FRAME (1024 * 1024)

static ferry_rpc_server_t *server;
static char endpoint[64];
static atomic_int handled;
static atomic_int wrong_thread;
static pthread_t handler_thread;
static atomic_int handler_thread_set;

/* FETCH echoes ("missing" fails, "big" is too large to send back, "sleep"
 * holds the server thread for 300 ms first); PROBE answers u64 + str; NOTIFY
 * is acknowledged by default; INVALIDATE fails. */
static ferry_status_t echo_handler(void *arg, int type, const void *payload, size_t length,
                                   int *reply_type_p, void **reply_p, size_t *reply_length_p)
{
    if (atomic_exchange(&handler_thread_set, 1) == 0)
        handler_thread = pthread_self();
    else if (!pthread_equal(handler_thread, pthread_self()))
        atomic_store(&wrong_thread, 1);
    atomic_fetch_add(&handled, 1);
    if (type == FERRY_RPC_FETCH) {
        if (length == 7 && memcmp(payload, "missing", 7) == 0)
            return FERRY_ERR_SEGMENT_NOT_FOUND;
        size_t reply_length = length;
        if (length == 3 && memcmp(payload, "big", 3) == 0)
            reply_length = MAX_FRAME + 1;
        if (length == 5 && memcmp(payload, "sleep", 5) == 0)
            usleep(300 * 1000);
        void *reply = calloc(1, reply_length + 1);
        memcpy(reply, payload, length);
        *reply_type_p = FERRY_RPC_FETCH_REPLY;
        *reply_p = reply;
        *reply_length_p = reply_length;
        return FERRY_OK;
    }
    if (type == FERRY_RPC_PROBE) {
        ferry_wire_writer_t writer = {0};
        ferry_wire_put_u64(&writer, 0x0123456789abcdefull);
        ferry_wire_put_str(&writer, "echo");
        *reply_type_p = FERRY_RPC_PROBE_REPLY;
        *reply_p = writer.data;
        *reply_length_p = writer.length;
        return FERRY_OK;
    }
    if (type == FERRY_RPC_NOTIFY)
        return FERRY_OK;
    return FERRY_ERR_UNSUPPORTED;
}

static void start_server_with(const ferry_rpc_server_limits_t *limits)
{
    int port;
    cr_assert_eq(ferry_rpc_server_start("127.0.0.1", 0, limits, echo_handler, NULL, &server,
                                        &port), FERRY_OK);
    cr_assert_gt(port, 0);
    snprintf(endpoint, sizeof(endpoint), "127.0.0.1:%d", port);
}

static void start_server(unsigned timeout_ms)
{
    ferry_rpc_server_limits_t limits = {.max_frame = MAX_FRAME, .timeout_ms = timeout_ms,
                                        .idle_timeout_ms = 10 * timeout_ms, .max_conns = 256};
    start_server_with(&limits);
}

static void setup(void)
{
    start_server(TIMEOUT_MS);
}

static void teardown(void)
{
    ferry_rpc_server_stop(server);
    cr_expect_eq(atomic_load(&wrong_thread), 0, "handler ran on more than one thread");
}

static int raw_connect(void)
{
    int fd = -1;
    cr_assert_eq(ferry_net_connect(endpoint, 1000, &fd), FERRY_OK);
    ferry_net_set_timeout(fd, 3000);
    return fd;
}

static void pack(uint8_t *out, int type, uint32_t length)
{
    ferry_rpc_header_t h = {.magic = FERRY_RPC_MAGIC, .version = FERRY_RPC_VERSION,
                            .type = (uint8_t)type, .length = length};
    ferry_rpc_header_pack(&h, out);
}

/* Reads one reply; returns its payload (NUL-terminated, malloc-ed) or NULL. */
static char *raw_reply(int fd, ferry_rpc_header_t *h)
{
    uint8_t bytes[FERRY_RPC_HEADER_SIZE];
    if (ferry_net_recv_all(fd, bytes, sizeof(bytes)) != FERRY_OK ||
        ferry_rpc_header_unpack(bytes, MAX_FRAME, h) != FERRY_OK)
        return NULL;
    char *payload = calloc(1, h->length + 1);
    if (ferry_net_recv_all(fd, payload, h->length) != FERRY_OK) {
        free(payload);
        return NULL;
    }
    return payload;
}

/* One FETCH on a raw connection; 1 when echoed. */
static int raw_echo(int fd, const char *text)
{
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    pack(header, FERRY_RPC_FETCH, (uint32_t)strlen(text));
    struct iovec iov[2] = {{header, sizeof(header)}, {(void *)text, strlen(text)}};
    if (ferry_net_sendv_all(fd, iov, 2) != FERRY_OK)
        return 0;
    ferry_rpc_header_t h;
    char *reply = raw_reply(fd, &h);
    int ok = reply && h.type == FERRY_RPC_FETCH_REPLY && h.status == 0 &&
             strcmp(reply, text) == 0;
    free(reply);
    return ok;
}

/* Milliseconds until the server closed fd (EOF or reset), -1 if it did not
 * within max_ms or sent data instead. */
static long wait_closed(int fd, int max_ms)
{
    uint64_t start = ferry_time_ms();
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, max_ms) != 1)
        return -1;
    char byte;
    ssize_t got = recv(fd, &byte, 1, MSG_DONTWAIT);
    if (got == 0 || (got < 0 && errno == ECONNRESET))
        return (long)(ferry_time_ms() - start);
    return -1;
}

static void assert_call_echoes(const char *text)
{
    void *reply = NULL;
    size_t length = 0;
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_FETCH, text, strlen(text), TIMEOUT_MS,
                                MAX_FRAME, &reply, &length), FERRY_OK);
    cr_assert_eq(length, strlen(text));
    cr_assert_str_eq(reply, text); /* the extra NUL makes it a C string */
    free(reply);
}

TestSuite(rpc, .init = setup, .fini = teardown, .timeout = 20);

Test(rpc, round_trip_small)
{
    assert_call_echoes("hello");
    assert_call_echoes("");

    void *reply = NULL;
    size_t length = 99;
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_PROBE, NULL, 0, TIMEOUT_MS, MAX_FRAME,
                                &reply, &length), FERRY_OK);
    ferry_wire_reader_t reader = {.data = reply, .length = length};
    char name[16];
    cr_assert_eq(ferry_wire_get_u64(&reader), 0x0123456789abcdefull);
    ferry_wire_get_str(&reader, name, sizeof(name));
    cr_assert_not(reader.failed);
    cr_assert_str_eq(name, "echo");
    free(reply);

    /* No reply type set on success: the matching ack, empty; reply_p optional. */
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_NOTIFY, "x", 1, TIMEOUT_MS, MAX_FRAME,
                                NULL, &length), FERRY_OK);
    cr_assert_eq(length, 0);
}

Test(rpc, handler_errors_reach_the_caller)
{
    void *reply = (void *)1;
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_FETCH, "missing", 7, TIMEOUT_MS, MAX_FRAME,
                                &reply, NULL), FERRY_ERR_SEGMENT_NOT_FOUND);
    cr_assert_null(reply);
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_INVALIDATE, NULL, 0, TIMEOUT_MS, MAX_FRAME,
                                NULL, NULL), FERRY_ERR_UNSUPPORTED);
    /* A reply over the frame limit is refused on the server, not sent. */
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_FETCH, "big", 3, TIMEOUT_MS, MAX_FRAME,
                                NULL, NULL), FERRY_ERR_NO_RESOURCE);
    assert_call_echoes("still fine");
}

Test(rpc, large_payloads)
{
    uint8_t *payload = malloc(MAX_FRAME + 1);
    for (size_t i = 0; i <= MAX_FRAME; i++)
        payload[i] = (uint8_t)(i * 7 + 3);
    void *reply = NULL;
    size_t length = 0;
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_FETCH, payload, MAX_FRAME, 2000, MAX_FRAME,
                                &reply, &length), FERRY_OK);
    cr_assert_eq(length, MAX_FRAME);
    cr_assert_eq(memcmp(reply, payload, MAX_FRAME), 0);
    free(reply);
    cr_assert_eq(ferry_rpc_call(endpoint, FERRY_RPC_FETCH, payload, MAX_FRAME + 1, TIMEOUT_MS,
                                MAX_FRAME, &reply, &length), FERRY_ERR_INVALID_PARAM);
    free(payload);
}

Test(rpc, pipelined_requests_answered_in_order)
{
    int fd = raw_connect();
    uint8_t frames[20 * 64];
    size_t used = 0;
    for (int i = 0; i < 20; i++) {
        char text[32];
        int n = snprintf(text, sizeof(text), "request-%d", i);
        pack(frames + used, FERRY_RPC_FETCH, (uint32_t)n);
        memcpy(frames + used + FERRY_RPC_HEADER_SIZE, text, (size_t)n);
        used += FERRY_RPC_HEADER_SIZE + (size_t)n;
    }
    cr_assert_eq(ferry_net_send_all(fd, frames, used), FERRY_OK);
    for (int i = 0; i < 20; i++) {
        char text[32];
        snprintf(text, sizeof(text), "request-%d", i);
        ferry_rpc_header_t h;
        char *reply = raw_reply(fd, &h);
        cr_assert_not_null(reply);
        cr_assert_str_eq(reply, text);
        free(reply);
    }
    close(fd);
}

struct big_sender {
    int fd;
    int count;
    size_t size;
    int ok;
};

static void *send_big_frames(void *arg)
{
    struct big_sender *s = arg;
    uint8_t *frame = malloc(FERRY_RPC_HEADER_SIZE + s->size);
    s->ok = 1;
    for (int i = 0; i < s->count && s->ok; i++) {
        pack(frame, FERRY_RPC_FETCH, (uint32_t)s->size);
        memset(frame + FERRY_RPC_HEADER_SIZE, 'a' + i, s->size);
        s->ok = ferry_net_send_all(s->fd, frame, FERRY_RPC_HEADER_SIZE + s->size) == FERRY_OK;
    }
    free(frame);
    return NULL;
}

/* A client whose receive window is tiny, so replies cannot leave at once. */
static int small_window_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int size = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001),
                               .sin_port = htons((uint16_t)atoi(strchr(endpoint, ':') + 1))};
    cr_assert_eq(connect(fd, (struct sockaddr *)&addr, sizeof(addr)), 0);
    ferry_net_set_timeout(fd, 3000);
    return fd;
}

/* Replies larger than the socket buffers go out as the client reads them. */
Test(rpc, pipelined_large_replies_are_flow_controlled)
{
    int fd = small_window_connect();
    struct big_sender sender = {.fd = fd, .count = 6, .size = 600 * 1024};
    pthread_t thread;
    pthread_create(&thread, NULL, send_big_frames, &sender);
    for (int i = 0; i < sender.count; i++) {
        usleep(20 * 1000); /* read slower than the server writes */
        ferry_rpc_header_t h;
        char *reply = raw_reply(fd, &h);
        cr_assert_not_null(reply, "reply %d", i);
        cr_assert_eq(h.length, sender.size);
        cr_assert_eq(reply[0], 'a' + i);
        cr_assert_eq(reply[sender.size - 1], 'a' + i);
        free(reply);
    }
    pthread_join(thread, NULL);
    cr_assert(sender.ok);
    close(fd);
}

/* A client that asks and never reads cannot hold a reply buffer forever. */
Test(rpc, client_that_never_reads_is_cut_off)
{
    int fd = small_window_connect();
    uint64_t start = ferry_time_ms();
    /* More replies than the kernel buffers hold, then not a byte read. */
    struct big_sender sender = {.fd = fd, .count = 8, .size = MAX_FRAME};
    send_big_frames(&sender);
    usleep(3 * TIMEOUT_MS * 1000);
    size_t total = 0;
    ssize_t got;
    char buf[65536];
    while ((got = recv(fd, buf, sizeof(buf), 0)) > 0)
        total += (size_t)got;
    cr_assert(got == 0 || errno == ECONNRESET, "recv: %s", strerror(errno));
    cr_assert_lt(total, sender.count * (FERRY_RPC_HEADER_SIZE + MAX_FRAME));
    cr_assert_lt(ferry_time_ms() - start, 2000, "closed by the idle limit, not the stall");
    close(fd);
    assert_call_echoes("others still served");
}

/* Each bad connection is closed; a concurrent well-behaved call still works. */
static void assert_only_this_closed(int fd, int min_ms, int max_ms)
{
    assert_call_echoes("neighbour");
    long closed_ms = wait_closed(fd, max_ms + 500);
    cr_assert_geq(closed_ms, min_ms, "closed after %ld ms", closed_ms);
    cr_assert_leq(closed_ms, max_ms, "closed after %ld ms", closed_ms);
    close(fd);
    assert_call_echoes("after");
}

Test(rpc, oversized_frame_closes_only_that_connection)
{
    int fd = raw_connect();
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    pack(header, FERRY_RPC_FETCH, MAX_FRAME + 1);
    cr_assert_eq(ferry_net_send_all(fd, header, sizeof(header)), FERRY_OK);
    assert_only_this_closed(fd, 0, 200);
}

Test(rpc, garbage_closes_only_that_connection)
{
    int fd = raw_connect();
    const char *garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    cr_assert_eq(ferry_net_send_all(fd, garbage, strlen(garbage)), FERRY_OK);
    assert_only_this_closed(fd, 0, 200);
}

Test(rpc, truncated_frame_then_close)
{
    int fd = raw_connect();
    uint8_t frame[FERRY_RPC_HEADER_SIZE + 10] = {0};
    pack(frame, FERRY_RPC_FETCH, 100);
    cr_assert_eq(ferry_net_send_all(fd, frame, sizeof(frame)), FERRY_OK);
    shutdown(fd, SHUT_WR);
    assert_only_this_closed(fd, 0, 200);
    cr_assert_eq(atomic_load(&handled), 2, "the truncated frame reached the handler");
}

Test(rpc, slow_loris_is_cut_off)
{
    int fd = raw_connect();
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    pack(header, FERRY_RPC_FETCH, 4);
    cr_assert_eq(ferry_net_send_all(fd, header, 3), FERRY_OK);
    assert_only_this_closed(fd, TIMEOUT_MS - 50, TIMEOUT_MS + 400);

    /* Trickling a byte at a time does not reset the frame's deadline. */
    fd = raw_connect();
    uint64_t start = ferry_time_ms();
    long closed = -1;
    for (size_t i = 0; i < sizeof(header) && closed < 0; i++) {
        cr_assert_eq(send(fd, header + i, 1, MSG_NOSIGNAL), 1);
        closed = wait_closed(fd, 100);
    }
    cr_assert_geq(closed, 0, "trickling connection was not closed");
    long elapsed = (long)(ferry_time_ms() - start);
    cr_assert(elapsed >= TIMEOUT_MS - 50 && elapsed <= TIMEOUT_MS + 400, "%ld ms", elapsed);
    close(fd);
}

Test(rpc, idle_connection_is_closed)
{
    ferry_rpc_server_stop(server);
    start_server(100); /* idle limit: 1000 ms */
    int fd = raw_connect();
    cr_assert(raw_echo(fd, "one"));
    long closed_ms = wait_closed(fd, 3000);
    cr_assert(closed_ms >= 800 && closed_ms <= 2000, "closed after %ld ms", closed_ms);
    close(fd);
}

/* A bound socket that does not listen: the port is ours and refuses.
 * Close the returned socket when done. */
static int refusing_endpoint(char *endpoint_out, size_t size)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t len = sizeof(addr);
    cr_assert_eq(bind(fd, (struct sockaddr *)&addr, len), 0);
    getsockname(fd, (struct sockaddr *)&addr, &len);
    snprintf(endpoint_out, size, "127.0.0.1:%d", ntohs(addr.sin_port));
    return fd;
}

Test(rpc, refused_connect_fails_fast)
{
    char dead[64];
    int fd = refusing_endpoint(dead, sizeof(dead));
    uint64_t start = ferry_time_ms();
    cr_assert_eq(ferry_rpc_call(dead, FERRY_RPC_PROBE, NULL, 0, 2000, MAX_FRAME, NULL, NULL),
                 FERRY_ERR_CONNECT);
    cr_assert_lt(ferry_time_ms() - start, 200);
    close(fd);
}

/* More endpoints than the fan-out keeps open at once (256), refusing ones
 * among them: every live one is asked and answers, every dead one says
 * CONNECT, none is left out -- within a descriptor limit that the server's
 * 256 connections and the window fit, and 600 calls at once would not. */
Test(rpc, fan_out_past_its_window_reaches_every_endpoint)
{
    char dead[64];
    int fd = refusing_endpoint(dead, sizeof(dead));

    struct rlimit files = {.rlim_cur = 600, .rlim_max = 600}, old;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
    if (old.rlim_max < files.rlim_max)
        cr_skip("RLIMIT_NOFILE is below 600 here");
    files.rlim_max = old.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &files), 0);
    enum { N = 900 };
    const char *endpoints[N];
    ferry_status_t statuses[N];
    for (size_t i = 0; i < N; i++)
        endpoints[i] = i % 3 == 2 ? dead : endpoint;
    int before = atomic_load(&handled);
    ferry_rpc_call_all(endpoints, N, FERRY_RPC_PROBE, NULL, 0, 20000, MAX_FRAME, statuses);
    int live = 0;
    for (size_t i = 0; i < N; i++) {
        cr_assert_eq(statuses[i], i % 3 == 2 ? FERRY_ERR_CONNECT : FERRY_OK, "endpoint %zu: %d",
                     i, statuses[i]);
        live += i % 3 != 2;
    }
    cr_assert_eq(atomic_load(&handled) - before, live);
    close(fd);
    setrlimit(RLIMIT_NOFILE, &old);
}

struct mute_peer {
    int listen_fd;
    int trickle; /* send the reply header a byte every 100 ms instead of nothing */
};

static void *mute_peer_main(void *arg)
{
    struct mute_peer *peer = arg;
    int fd = accept(peer->listen_fd, NULL, NULL);
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    pack(header, FERRY_RPC_FETCH_REPLY, 0);
    /* Swallow the request and hold the connection until the client gives up. */
    for (size_t sent = 0; fd >= 0 && sent < sizeof(header);) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        char sink[64];
        if (poll(&pfd, 1, 100) == 1 && recv(fd, sink, sizeof(sink), 0) <= 0)
            break;
        if (peer->trickle && send(fd, header + sent++, 1, MSG_NOSIGNAL) != 1)
            break;
    }
    if (fd >= 0)
        close(fd);
    return NULL;
}

static void assert_times_out(int trickle)
{
    struct mute_peer peer = {.trickle = trickle};
    int port;
    cr_assert_eq(ferry_net_listen("127.0.0.1", 0, 4, &peer.listen_fd, &port), FERRY_OK);
    pthread_t thread;
    pthread_create(&thread, NULL, mute_peer_main, &peer);
    char mute[64];
    snprintf(mute, sizeof(mute), "127.0.0.1:%d", port);
    uint64_t start = ferry_time_ms();
    cr_assert_eq(ferry_rpc_call(mute, FERRY_RPC_FETCH, "x", 1, TIMEOUT_MS, MAX_FRAME, NULL,
                                NULL), FERRY_ERR_TIMEOUT);
    uint64_t elapsed = ferry_time_ms() - start;
    cr_assert(elapsed >= TIMEOUT_MS - 20 && elapsed <= TIMEOUT_MS + 300, "%lu ms",
              (unsigned long)elapsed);
    pthread_join(thread, NULL);
    close(peer.listen_fd);
}

Test(rpc, silent_server_times_out)
{
    assert_times_out(0);
}

Test(rpc, trickling_server_times_out)
{
    assert_times_out(1);
}

#define CLIENT_THREADS 8
#define CONNS_PER_THREAD 16

static pthread_barrier_t all_connected;

static void *many_client(void *arg)
{
    long id = (long)arg;
    int fds[CONNS_PER_THREAD];
    int good = 0;
    for (int i = 0; i < CONNS_PER_THREAD; i++) {
        if (ferry_net_connect(endpoint, 2000, &fds[i]) != FERRY_OK)
            fds[i] = -1;
        else
            ferry_net_set_timeout(fds[i], 3000);
    }
    pthread_barrier_wait(&all_connected); /* every connection is open at once */
    for (int i = 0; i < CONNS_PER_THREAD; i++) {
        char text[32];
        snprintf(text, sizeof(text), "thread-%ld-conn-%d", id, i);
        good += fds[i] >= 0 && raw_echo(fds[i], text);
    }
    for (int i = 0; i < CONNS_PER_THREAD; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
    }
    for (int i = 0; i < 10; i++) {
        void *reply = NULL;
        good += ferry_rpc_call(endpoint, FERRY_RPC_FETCH, "call", 4, 2000, MAX_FRAME, &reply,
                               NULL) == FERRY_OK && strcmp(reply, "call") == 0;
        free(reply);
    }
    return (void *)(long)good;
}

Test(rpc, many_concurrent_connections)
{
    pthread_t threads[CLIENT_THREADS];
    pthread_barrier_init(&all_connected, NULL, CLIENT_THREADS);
    for (long i = 0; i < CLIENT_THREADS; i++)
        pthread_create(&threads[i], NULL, many_client, (void *)i);
    long good = 0;
    for (int i = 0; i < CLIENT_THREADS; i++) {
        void *result;
        pthread_join(threads[i], &result);
        good += (long)result;
    }
    pthread_barrier_destroy(&all_connected);
    cr_assert_eq(good, CLIENT_THREADS * (CONNS_PER_THREAD + 10));
}

/* A connection to the test server from a given loopback address. */
static int connect_from(const char *source)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in from = {.sin_family = AF_INET};
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(atoi(strchr(endpoint,
                                                                                  ':') + 1))};
    inet_pton(AF_INET, source, &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    cr_assert_eq(bind(fd, (struct sockaddr *)&from, sizeof(from)), 0, "bind %s", source);
    cr_assert_eq(connect(fd, (struct sockaddr *)&to, sizeof(to)), 0);
    ferry_net_set_timeout(fd, 3000);
    return fd;
}

/* The server has closed fd (EOF or reset waiting), without blocking. */
static int is_closed(int fd)
{
    char byte;
    ssize_t got = recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
    return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}

/* How many of fds[0..n) the server has not closed. */
static int count_open(const int *fds, int n)
{
    int open = 0;
    for (int i = 0; i < n; i++)
        open += !is_closed(fds[i]);
    return open;
}

Test(rpc, idle_connections_past_the_cap_evict_the_oldest)
{
    enum { LIMIT = 256, FLOOD = 300 };
    ferry_rpc_server_stop(server);
    /* No idle timeout within the test's time, however slow the machine. */
    ferry_rpc_server_limits_t limits = {.max_frame = MAX_FRAME, .timeout_ms = TIMEOUT_MS,
                                        .idle_timeout_ms = 600000, .max_conns = LIMIT};
    start_server_with(&limits);
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = raw_connect();
        cr_assert(raw_echo(fds[i], "held"), "connection %d", i);
    }
    /* Another client is served at once, by evicting the connection idle longest. */
    assert_call_echoes("still served");
    int open = -1;
    for (int attempt = 0; attempt < 100 && open != LIMIT - 1; attempt++) {
        usleep(10 * 1000);
        open = count_open(fds, FLOOD);
    }
    cr_assert_eq(open, LIMIT - 1, "%d of the flood still open", open);
    cr_assert(is_closed(fds[0]) && is_closed(fds[FLOOD - LIMIT]), "the oldest went first");
    cr_assert(raw_echo(fds[FLOOD - 1], "newest"), "the newest idle connection still works");
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
}

Test(rpc, busy_connections_are_not_evicted)
{
    ferry_rpc_server_stop(server);
    ferry_rpc_server_limits_t limits = {.max_frame = MAX_FRAME, .timeout_ms = 3000,
                                        .idle_timeout_ms = 10000, .max_conns = 8};
    start_server_with(&limits);
    int fds[8];
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    pack(header, FERRY_RPC_FETCH, 4);
    for (int i = 0; i < 8; i++) {
        fds[i] = raw_connect();
        cr_assert_eq(ferry_net_send_all(fds[i], header, 5), FERRY_OK); /* half a header */
    }
    usleep(50 * 1000);
    int extra = raw_connect();
    cr_assert_geq(wait_closed(extra, 500), 0, "a ninth connection was let in");
    close(extra);
    cr_assert_eq(count_open(fds, 8), 8, "a connection inside a frame was evicted");
    /* The header timeout frees them: then clients are served again. */
    for (int i = 0; i < 8; i++)
        cr_assert_geq(wait_closed(fds[i], 6000), 0, "half a header was kept past the timeout");
    assert_call_echoes("served again");
    for (int i = 0; i < 8; i++)
        close(fds[i]);
}

Test(rpc, a_flood_from_one_source_does_not_lock_out_another)
{
    ferry_rpc_server_stop(server);
    ferry_rpc_server_limits_t limits = {.max_frame = MAX_FRAME, .timeout_ms = 15000,
                                        .idle_timeout_ms = 60000, .max_conns = 256,
                                        .max_conns_per_source = 64};
    start_server_with(&limits);
    enum { FLOOD = 300 };
    static int fds[FLOOD];
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    pack(header, FERRY_RPC_FETCH, 4);
    /* Connections that never finish their header cannot be evicted... */
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = connect_from("127.0.0.2");
        send(fds[i], header, 5, MSG_NOSIGNAL);
    }
    /* ...but they hold no more than their source's share. */
    int open = FLOOD;
    for (int attempt = 0; attempt < 200 && open > 64; attempt++) {
        usleep(10 * 1000);
        open = count_open(fds, FLOOD);
    }
    cr_assert_leq(open, 64, "%d connections of one source open", open);
    assert_call_echoes("another source is served");
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
}

Test(rpc, a_request_waiting_to_be_read_is_not_evicted)
{
    ferry_rpc_server_stop(server);
    ferry_rpc_server_limits_t limits = {.max_frame = MAX_FRAME, .timeout_ms = 2000,
                                        .idle_timeout_ms = 60000, .max_conns = 1};
    start_server_with(&limits);
    /* While the server thread sleeps in the handler, b connects and sends its
     * request and c connects: both wait to be accepted.  b then fills the one
     * slot (evicting the sleeper's connection, idle once answered); c finds b
     * not yet read, but with its request in: c is the one closed. */
    int sleeper = raw_connect();
    uint8_t header[FERRY_RPC_HEADER_SIZE];
    pack(header, FERRY_RPC_FETCH, 5);
    struct iovec iov[2] = {{header, sizeof(header)}, {"sleep", 5}};
    cr_assert_eq(ferry_net_sendv_all(sleeper, iov, 2), FERRY_OK);
    usleep(100 * 1000);
    int b = raw_connect();
    pack(header, FERRY_RPC_FETCH, 1);
    iov[1] = (struct iovec){"b", 1};
    cr_assert_eq(ferry_net_sendv_all(b, iov, 2), FERRY_OK);
    int c = raw_connect();
    ferry_rpc_header_t h;
    char *reply = raw_reply(b, &h);
    cr_assert_not_null(reply, "a request waiting to be read was evicted");
    cr_assert_str_eq(reply, "b");
    free(reply);
    cr_assert_geq(wait_closed(c, 2000), 0);
    close(sleeper);
    close(b);
    close(c);
}

/* Closes its first connection unread, answers a FETCH on the second. */
static void *evicting_server_main(void *arg)
{
    int listen_fd = *(int *)arg;
    int first = accept(listen_fd, NULL, NULL);
    close(first);
    int fd = accept(listen_fd, NULL, NULL);
    ferry_net_set_timeout(fd, 3000);
    uint8_t bytes[FERRY_RPC_HEADER_SIZE];
    ferry_rpc_header_t h;
    char payload[64];
    if (ferry_net_recv_all(fd, bytes, sizeof(bytes)) == FERRY_OK &&
        ferry_rpc_header_unpack(bytes, sizeof(payload), &h) == FERRY_OK &&
        ferry_net_recv_all(fd, payload, h.length) == FERRY_OK) {
        pack(bytes, FERRY_RPC_FETCH_REPLY, h.length);
        struct iovec iov[2] = {{bytes, sizeof(bytes)}, {payload, h.length}};
        ferry_net_sendv_all(fd, iov, 2);
    }
    close(fd);
    return NULL;
}

Test(rpc, a_call_closed_before_its_reply_is_sent_again)
{
    int listen_fd, port;
    cr_assert_eq(ferry_net_listen("127.0.0.1", 0, 4, &listen_fd, &port), FERRY_OK);
    pthread_t thread;
    pthread_create(&thread, NULL, evicting_server_main, &listen_fd);
    char evicting[64];
    snprintf(evicting, sizeof(evicting), "127.0.0.1:%d", port);
    void *reply = NULL;
    cr_assert_eq(ferry_rpc_call(evicting, FERRY_RPC_FETCH, "again", 5, 2000, MAX_FRAME, &reply,
                                NULL), FERRY_OK);
    cr_assert_str_eq(reply, "again");
    free(reply);
    pthread_join(thread, NULL);
    close(listen_fd);
}

Test(rpc, stop_with_open_connections)
{
    int idle = raw_connect();
    int partial = raw_connect();
    cr_assert_eq(ferry_net_send_all(partial, "FRR", 3), FERRY_OK);
    usleep(20 * 1000);
    uint64_t start = ferry_time_ms();
    ferry_rpc_server_stop(server);
    cr_assert_lt(ferry_time_ms() - start, 100);
    cr_assert_geq(wait_closed(idle, 500), 0);
    cr_assert_geq(wait_closed(partial, 500), 0);
    close(idle);
    close(partial);
    start_server(TIMEOUT_MS); /* for teardown */
}

/* The listener's cost follows ready connections, not open ones: with
 * thousands of idle ones held, calls are answered, the idle ones all close
 * at their idle timeout (each from the deadline heap, none missed), and the
 * counters saw every call. */
Test(rpc, thousands_of_idle_connections_cost_calls_nothing_and_all_expire)
{
    enum { IDLE = 2000, CALLS = 200, IDLE_MS = 1500 };
    ferry_rpc_server_stop(server);
    ferry_rpc_server_limits_t limits = {.max_frame = MAX_FRAME, .timeout_ms = 2000,
                                        .idle_timeout_ms = IDLE_MS, .max_conns = IDLE + 64};
    start_server_with(&limits);
    int *fds = calloc(IDLE, sizeof(*fds));
    cr_assert_not_null(fds);
    uint64_t accepted = ferry_rpc_counter_get(FERRY_RPC_COUNT_ACCEPTED);
    uint64_t fetches = ferry_rpc_counter_get(FERRY_RPC_COUNT_SERVED_FETCH);
    uint64_t start = ferry_time_ms();
    for (int i = 0; i < IDLE; i++)
        fds[i] = raw_connect();
    for (int i = 0; i < CALLS; i++)
        assert_call_echoes("among idle ones");
    uint64_t opened_and_called = ferry_time_ms() - start;
    cr_assert_eq(ferry_rpc_counter_get(FERRY_RPC_COUNT_SERVED_FETCH) - fetches, CALLS);
    cr_assert_geq(ferry_rpc_counter_get(FERRY_RPC_COUNT_ACCEPTED) - accepted, IDLE + CALLS);
    /* Every idle one is closed by the server, none before its timeout
     * (counted from its accept, which came after `start`). */
    int closed = 0;
    for (int i = 0; i < IDLE; i++) {
        long waited = wait_closed(fds[i], IDLE_MS + 5000);
        closed += waited >= 0;
        close(fds[i]);
    }
    cr_assert_eq(closed, IDLE, "%d of %d idle connections closed", closed, IDLE);
    cr_assert_geq(ferry_time_ms() - start, IDLE_MS, "closed before the idle timeout");
    cr_log_info("%d idle connections + %d calls: %llu ms", IDLE, CALLS,
                (unsigned long long)opened_and_called);
    free(fds);
}

Test(heap, earliest_deadline_first_through_moves_and_removals)
{
    enum { N = 500 };
    static ferry_deadline_entry_t entries[N];
    ferry_deadline_heap_t heap;
    cr_assert_eq(ferry_deadline_heap_init(&heap, N), FERRY_OK);
    for (int i = 0; i < N; i++)
        entries[i] = (ferry_deadline_entry_t)FERRY_DEADLINE_ENTRY_INIT;
    unsigned seed = 19;
    for (int step = 0; step < 20000; step++) {
        ferry_deadline_entry_t *entry = &entries[rand_r(&seed) % N];
        /* One in four removes (UINT64_MAX), the others queue or move. */
        uint64_t deadline = rand_r(&seed) % 4 == 0 ? UINT64_MAX : (uint64_t)(rand_r(&seed) % 1000);
        ferry_deadline_heap_set(&heap, entry, deadline);
        uint64_t earliest = UINT64_MAX;
        size_t queued = 0;
        for (int i = 0; i < N; i++) {
            if (entries[i].index == FERRY_DEADLINE_UNQUEUED)
                continue;
            queued++;
            earliest = FERRY_MIN(earliest, entries[i].deadline);
            cr_assert_eq(heap.entries[entries[i].index], &entries[i]);
        }
        cr_assert_eq(heap.count, queued);
        ferry_deadline_entry_t *top = ferry_deadline_heap_top(&heap);
        if (queued == 0)
            cr_assert_null(top);
        else
            cr_assert_eq(top->deadline, earliest, "step %d", step);
    }
    /* Draining from the top gives the deadlines in order. */
    uint64_t last = 0;
    ferry_deadline_entry_t *top;
    while ((top = ferry_deadline_heap_top(&heap)) != NULL) {
        cr_assert_geq(top->deadline, last);
        last = top->deadline;
        ferry_deadline_heap_set(&heap, top, UINT64_MAX);
    }
    ferry_deadline_heap_fini(&heap);
}

Test(frame, header_round_trip_and_rejections)
{
    ferry_rpc_header_t in = {.magic = FERRY_RPC_MAGIC, .version = FERRY_RPC_VERSION,
                             .type = FERRY_RPC_PROBE_REPLY, .status = FERRY_ERR_STALE,
                             .length = 1234}, out;
    uint8_t bytes[FERRY_RPC_HEADER_SIZE];
    ferry_rpc_header_pack(&in, bytes);
    cr_assert_eq(bytes[0], 'F');
    cr_assert_eq(bytes[3], 'Y');
    cr_assert_eq(ferry_rpc_header_unpack(bytes, 1234, &out), FERRY_OK);
    cr_assert_eq(out.type, FERRY_RPC_PROBE_REPLY);
    cr_assert_eq(out.status, FERRY_ERR_STALE);
    cr_assert_eq(out.length, 1234);
    cr_assert_eq(ferry_rpc_header_unpack(bytes, 1233, &out), FERRY_ERR_PROTOCOL);

    static const struct { size_t at; uint8_t value; } bad[] = {
        {0, 'G'}, {4, 2}, {5, 0}, {5, 10}, {6, 1}, {7, 1},
    };
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(bad); i++) {
        uint8_t copy[FERRY_RPC_HEADER_SIZE];
        memcpy(copy, bytes, sizeof(copy));
        copy[bad[i].at] = bad[i].value;
        cr_assert_eq(ferry_rpc_header_unpack(copy, 1 << 20, &out), FERRY_ERR_PROTOCOL,
                     "byte %zu = %u accepted", bad[i].at, bad[i].value);
    }
}

Test(wire, round_trip)
{
    ferry_wire_writer_t w = {0};
    ferry_wire_put_u64(&w, UINT64_MAX - 1);
    ferry_wire_put_str(&w, "name");
    ferry_wire_put_bytes(&w, "\0\1\2", 3);
    ferry_wire_put_str(&w, NULL);
    for (int i = 0; i < 100; i++) /* past the first buffer */
        ferry_wire_put_str(&w, "0123456789");
    cr_assert_not(w.failed);

    ferry_wire_reader_t r = {.data = w.data, .length = w.length};
    char text[16];
    size_t length;
    cr_assert_eq(ferry_wire_get_u64(&r), UINT64_MAX - 1);
    ferry_wire_get_str(&r, text, sizeof(text));
    cr_assert_str_eq(text, "name");
    const uint8_t *bytes = ferry_wire_get_bytes(&r, &length);
    cr_assert_eq(length, 3);
    cr_assert_eq(bytes[2], 2);
    ferry_wire_get_str(&r, text, sizeof(text));
    cr_assert_str_eq(text, "");
    for (int i = 0; i < 100; i++)
        ferry_wire_get_str(&r, text, sizeof(text));
    cr_assert_str_eq(text, "0123456789");
    cr_assert_not(r.failed);
    cr_assert_eq(r.offset, w.length);
    free(w.data);
}

Test(wire, reader_rejects_truncated_and_bad_input)
{
    ferry_wire_writer_t w = {0};
    ferry_wire_put_u64(&w, 7);
    ferry_wire_put_str(&w, "abcdef");
    char text[16];

    /* Every proper prefix of the message fails somewhere, and stays failed. */
    for (size_t cut = 0; cut < w.length; cut++) {
        ferry_wire_reader_t r = {.data = w.data, .length = cut};
        ferry_wire_get_u64(&r);
        ferry_wire_get_str(&r, text, sizeof(text));
        cr_assert(r.failed, "prefix of %zu bytes accepted", cut);
        cr_assert_str_eq(text, "");
        cr_assert_eq(ferry_wire_get_u64(&r), 0);
    }
    ferry_wire_reader_t r = {.data = w.data + 8, .length = w.length - 8};
    size_t length = 99;
    cr_assert_null(ferry_wire_get_bytes(&(ferry_wire_reader_t){.data = w.data + 8, .length = 5},
                                        &length));
    cr_assert_eq(length, 0);

    /* A string that does not fit, or that hides a NUL, is refused. */
    ferry_wire_get_str(&r, text, 6);
    cr_assert(r.failed);
    ferry_wire_writer_t nul = {0};
    ferry_wire_put_bytes(&nul, "ab\0cd", 5);
    r = (ferry_wire_reader_t){.data = nul.data, .length = nul.length};
    ferry_wire_get_str(&r, text, sizeof(text));
    cr_assert(r.failed);
    cr_assert_str_eq(text, "");
    free(nul.data);
    free(w.data);
}
