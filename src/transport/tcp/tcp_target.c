/*
 * tcp target side: the listener and one thread per accepted connection.
 *
 * Requests on a connection are served in order, straight between the socket
 * and the engine's registered memory, and only inside a range that
 * access_acquire granted.  Whatever an initiator sends, the worst it gets is
 * an error status or a closed connection.
 *
 * What one client can hold is bounded: the HELLO must arrive within
 * CONNECT_TIMEOUT and a request header within TIMEOUT of its first byte
 * (deadlines, so trickling bytes does not stretch them), an idle connection
 * closes after IDLE_TIMEOUT, and the caps on connections evict the idle ones
 * (tcp.h), so idle connections, however many, never lock out an initiator.
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define DRAIN_CHUNK (64u << 10)
/* Responses to small requests wait while the next header is already here,
 * then leave in one send: one syscall and one wake-up for many slices.
 * A request above COALESCE_MAX flushes first, so no response waits long. */
#define COALESCE_COUNT 64
#define COALESCE_MAX (256u << 10)
#define REFUSED_WARN_INTERVAL_MS 10000

typedef struct pending {
    unsigned count;
    unsigned char responses[COALESCE_COUNT][FERRY_TCP_RESPONSE_SIZE];
} pending_t;

static ferry_status_t flush(int fd, pending_t *out)
{
    if (out->count == 0)
        return FERRY_OK;
    ferry_status_t status =
        ferry_net_send_all(fd, out->responses, out->count * (size_t)FERRY_TCP_RESPONSE_SIZE);
    out->count = 0;
    return status;
}

static ferry_status_t respond(int fd, pending_t *out, uint64_t id, ferry_status_t status,
                              uint64_t length)
{
    ferry_tcp_encode_response(out->responses[out->count++], id, status);
    if (out->count == COALESCE_COUNT || length > COALESCE_MAX)
        return flush(fd, out);
    return FERRY_OK;
}

/* Read exactly len bytes before an absolute deadline: a peer that trickles
 * bytes cannot stretch the HELLO phase the way a per-call timeout allows. */
static ferry_status_t recv_deadline(int fd, void *buf, size_t len, uint64_t deadline_ms)
{
    char *p = buf;
    while (len > 0) {
        uint64_t now = ferry_time_ms();
        if (now >= deadline_ms)
            return FERRY_ERR_TIMEOUT;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        uint64_t wait = deadline_ms - now;
        int rc = poll(&pfd, 1, wait > INT32_MAX ? INT32_MAX : (int)wait);
        if (rc < 0 && errno != EINTR)
            return FERRY_ERR_IO;
        if (rc <= 0)
            continue;
        ssize_t got = recv(fd, p, len, MSG_DONTWAIT);
        if (got == 0)
            return FERRY_ERR_PEER_FAILED;
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                continue;
            return FERRY_ERR_PEER_FAILED;
        }
        p += got;
        len -= (size_t)got;
    }
    return FERRY_OK;
}

static void send_ack(ferry_tcp_target_conn_t *conn, ferry_status_t status)
{
    unsigned char ack[FERRY_TCP_ACK_SIZE];
    const ferry_tcp_settings_t *settings = &conn->tcp->settings;
    ferry_tcp_encode_ack(ack, status, settings->idle_timeout_ms, conn->tcp->svc.generation,
                         settings->max_slice);
    (void)ferry_net_send_all(conn->fd, ack, sizeof(ack));
}

/* The connection's thread takes it out of HELLO or IDLE; 0: the listener
 * evicted it first. */
static int claim(ferry_tcp_target_conn_t *conn, int from)
{
    int expected = from;
    return atomic_compare_exchange_strong(&conn->state, &expected, FERRY_TCP_TARGET_BUSY);
}

/* HELLO within CONNECT_TIMEOUT, generation check, HELLO_ACK. */
static ferry_status_t greet(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_t *tcp = conn->tcp;
    unsigned connect_timeout = tcp->settings.connect_timeout_ms;
    uint64_t deadline = connect_timeout ? ferry_time_ms() + connect_timeout : UINT64_MAX;
    unsigned char hello[FERRY_TCP_HELLO_SIZE];
    char rpc[FERRY_TCP_HELLO_RPC_MAX + 1];

    ferry_net_set_timeout(conn->fd, connect_timeout);
    ferry_status_t status = recv_deadline(conn->fd, hello, sizeof(hello), deadline);
    if (status != FERRY_OK) {
        ferry_debug("tcp: connection closed before its HELLO: %s", ferry_status_string(status));
        return status;
    }
    ferry_tcp_hello_t parsed;
    status = ferry_tcp_hello_parse(hello, &parsed);
    if (status == FERRY_ERR_UNSUPPORTED)
        send_ack(conn, FERRY_ERR_UNSUPPORTED);
    if (status != FERRY_OK)
        return FERRY_ERR_PROTOCOL;
    uint64_t expected = parsed.expected_generation;
    uint16_t rpc_len = parsed.rpc_len;
    status = recv_deadline(conn->fd, rpc, rpc_len, deadline);
    if (status != FERRY_OK)
        return status;
    if (!claim(conn, FERRY_TCP_TARGET_HELLO))
        return FERRY_ERR_CANCELED;
    if (ferry_tcp_hello_rpc_parse(rpc, rpc_len) != FERRY_OK)
        return FERRY_ERR_PROTOCOL;
    if (expected != tcp->svc.generation) {
        ferry_debug("tcp: peer %s expects generation %016llx, this is %016llx", rpc,
                    (unsigned long long)expected, (unsigned long long)tcp->svc.generation);
        send_ack(conn, FERRY_ERR_STALE);
        return FERRY_ERR_STALE;
    }
    /* Before the ACK: the engine must know whom to tell about an unregister
     * before that peer can touch any memory. */
    if (rpc_len > 0 && tcp->svc.peer_seen != NULL)
        tcp->svc.peer_seen(tcp->svc.engine, rpc);
    send_ack(conn, FERRY_OK);
    ferry_net_set_timeout(conn->fd, tcp->settings.timeout_ms);
    ferry_debug("tcp: connection from %s accepted", rpc_len ? rpc : "(no rpc endpoint)");
    return FERRY_OK;
}

/* Swallow the payload of a refused WRITE so the stream stays in step. */
static ferry_status_t drain(int fd, uint64_t length, void **scratch_p)
{
    if (*scratch_p == NULL && (*scratch_p = malloc(DRAIN_CHUNK)) == NULL)
        return FERRY_ERR_NO_MEMORY;
    while (length > 0) {
        size_t chunk = length < DRAIN_CHUNK ? (size_t)length : DRAIN_CHUNK;
        ferry_status_t status = ferry_net_recv_all(fd, *scratch_p, chunk);
        if (status != FERRY_OK)
            return status;
        length -= chunk;
    }
    return FERRY_OK;
}

/* Wait for the next request header; pending responses leave as soon as we
 * would wait.  An idle connection closes after IDLE_TIMEOUT (or when the
 * listener evicts it); once a header started, it must complete within
 * TIMEOUT. */
static ferry_status_t next_header(ferry_tcp_target_conn_t *conn, unsigned char *hdr, pending_t *out)
{
    const ferry_tcp_settings_t *settings = &conn->tcp->settings;
    int fd = conn->fd;
    uint64_t idle_since = 0;
    for (;;) {
        ssize_t got = recv(fd, hdr, FERRY_TCP_REQUEST_SIZE, MSG_DONTWAIT);
        int err = got < 0 ? errno : 0;
        if (got == FERRY_TCP_REQUEST_SIZE)
            return FERRY_OK;
        if (got == 0 || (got < 0 && err != EINTR && err != EAGAIN && err != EWOULDBLOCK))
            return FERRY_ERR_PEER_FAILED;
        if (err != EINTR && flush(fd, out) != FERRY_OK)
            return FERRY_ERR_PEER_FAILED;
        if (got > 0) {
            uint64_t deadline =
                settings->timeout_ms ? ferry_time_ms() + settings->timeout_ms : UINT64_MAX;
            ferry_status_t status =
                recv_deadline(fd, hdr + got, FERRY_TCP_REQUEST_SIZE - (size_t)got, deadline);
            if (status == FERRY_ERR_TIMEOUT)
                ferry_warn("tcp: a peer did not complete a request header within %u ms; "
                           "closing", settings->timeout_ms);
            return status;
        }
        if (err == EINTR)
            continue;
        uint64_t now = ferry_time_ms();
        if (idle_since == 0) {
            idle_since = now;
            atomic_store(&conn->idle_ms, now);
        }
        int wait_ms = -1;
        if (settings->idle_timeout_ms != 0) {
            if (now - idle_since >= settings->idle_timeout_ms) {
                ferry_debug("tcp: closing a connection idle for %u ms", settings->idle_timeout_ms);
                return FERRY_ERR_TIMEOUT;
            }
            wait_ms = (int)(idle_since + settings->idle_timeout_ms - now);
        }
        /* shutdown() by destroy or an eviction wakes this poll */
        atomic_store(&conn->state, FERRY_TCP_TARGET_IDLE);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int rc = poll(&pfd, 1, wait_ms);
        int poll_errno = errno;
        if (!claim(conn, FERRY_TCP_TARGET_IDLE))
            return FERRY_ERR_CANCELED;
        if (rc < 0 && poll_errno != EINTR)
            return FERRY_ERR_IO;
    }
}


/* Device memory (a registered GPU buffer): the payload goes through the
 * engine's page-locked buffers, each copied to the device while the next
 * arrives. */
typedef struct staged_recv {
    int fd;
    size_t received;
    int socket_failed;
} staged_recv_t;

static ferry_status_t recv_staged(void *arg, void *buffer, size_t length)
{
    staged_recv_t *in = arg;
    ferry_status_t status = ferry_net_recv_all(in->fd, buffer, length);
    in->received += status == FERRY_OK ? length : 0;
    in->socket_failed = status != FERRY_OK;
    return status;
}

static ferry_status_t send_staged(void *arg, const void *buffer, size_t length)
{
    return ferry_net_send_all(*(int *)arg, buffer, length);
}

/* A WRITE into device memory.  A failed device copy leaves the socket
 * where it was: the rest of the payload is drained and *granted_p says
 * what the initiator hears. */
static ferry_status_t write_device(ferry_tcp_target_conn_t *conn, void *token, uint64_t addr,
                                   uint64_t length, void **scratch_p, ferry_status_t *granted_p)
{
    ferry_tcp_t *tcp = conn->tcp;
    staged_recv_t in = {.fd = conn->fd};
    ferry_status_t status = tcp->svc.stage_in(tcp->svc.engine, token, (void *)(uintptr_t)addr,
                                              (size_t)length, recv_staged, &in);
    if (status == FERRY_OK || in.socket_failed)
        return status;
    ferry_error("tcp: a %llu-byte WRITE into device memory at 0x%llx failed: %s",
                (unsigned long long)length, (unsigned long long)addr,
                ferry_status_string(status));
    *granted_p = status < 0 ? status : FERRY_ERR_IO;
    return drain(conn->fd, length - in.received, scratch_p);
}

static ferry_status_t serve_one(ferry_tcp_target_conn_t *conn, const unsigned char *hdr,
                                pending_t *out, void **scratch_p)
{
    ferry_tcp_t *tcp = conn->tcp;
    ferry_tcp_request_t request;
    if (ferry_tcp_request_parse(hdr, tcp->settings.max_slice, &request) != FERRY_OK)
        return FERRY_ERR_PROTOCOL;
    unsigned op = request.op;
    uint64_t id = request.id, addr = request.addr, length = request.length;

    ferry_status_t status = FERRY_OK;
    if (op == FERRY_TCP_OP_WRITE && length > COALESCE_MAX)
        status = flush(conn->fd, out); /* not held while a large payload arrives */
    if (status != FERRY_OK)
        return status;

    void *token = NULL;
    ferry_access_t access = op == FERRY_TCP_OP_WRITE ? FERRY_ACCESS_WRITE : FERRY_ACCESS_READ;
    ferry_status_t granted = FERRY_ERR_OUT_OF_RANGE;
    if (addr + length > addr) /* no wrap-around: a range the engine can judge */
        granted = tcp->svc.access_acquire(tcp->svc.engine, addr, length, access, &token);
    if (granted > 0) /* only errors travel back; anything else is a refusal */
        granted = FERRY_ERR_REMOTE_REFUSED;
    if (granted != FERRY_OK)
        ferry_debug("tcp: refused %s of %llu bytes at 0x%llx: %s",
                    op == FERRY_TCP_OP_WRITE ? "WRITE" : "READ", (unsigned long long)length,
                    (unsigned long long)addr, ferry_status_string(granted));

    int device = granted == FERRY_OK && tcp->svc.access_is_device(tcp->svc.engine, token);
    if (op == FERRY_TCP_OP_WRITE) {
        if (granted == FERRY_OK && device) {
            status = write_device(conn, token, addr, length, scratch_p, &granted);
            tcp->svc.access_release(tcp->svc.engine, token);
        } else if (granted == FERRY_OK) {
            status = ferry_net_recv_all(conn->fd, (void *)(uintptr_t)addr, (size_t)length);
            tcp->svc.access_release(tcp->svc.engine, token);
        } else {
            status = drain(conn->fd, length, scratch_p);
        }
        if (status == FERRY_OK)
            status = respond(conn->fd, out, id, granted, length);
    } else if (granted == FERRY_OK && device) {
        /* The answer goes first: a device copy that fails later in the
         * stream can only close the connection (the peer fails the READ). */
        ferry_tcp_encode_response(out->responses[out->count++], id, FERRY_OK);
        status = flush(conn->fd, out);
        if (status == FERRY_OK)
            status = tcp->svc.stage_out(tcp->svc.engine, token, (const void *)(uintptr_t)addr,
                                        (size_t)length, send_staged, &conn->fd);
        tcp->svc.access_release(tcp->svc.engine, token);
    } else if (granted == FERRY_OK) {
        /* pending responses, this one and the data: one sendmsg */
        ferry_tcp_encode_response(out->responses[out->count++], id, FERRY_OK);
        struct iovec iov[2] = {{out->responses, out->count * (size_t)FERRY_TCP_RESPONSE_SIZE},
                               {(void *)(uintptr_t)addr, (size_t)length}};
        out->count = 0;
        status = ferry_net_sendv_all(conn->fd, iov, 2);
        tcp->svc.access_release(tcp->svc.engine, token);
    } else {
        status = respond(conn->fd, out, id, granted, 0);
    }
    if (status == FERRY_ERR_TIMEOUT)
        ferry_warn("tcp: a peer stopped moving data during a %llu-byte %s; closing",
                   (unsigned long long)length, op == FERRY_TCP_OP_WRITE ? "WRITE" : "READ");
    else if (status != FERRY_OK) /* it canceled or died: its own log says why */
        ferry_info("tcp: a peer closed its connection during a %llu-byte %s",
                   (unsigned long long)length, op == FERRY_TCP_OP_WRITE ? "WRITE" : "READ");
    return status;
}

static void *target_conn_main(void *arg)
{
    ferry_tcp_target_conn_t *conn = arg;
    ferry_tcp_t *tcp = conn->tcp;
    void *scratch = NULL;
    pending_t *out = malloc(sizeof(*out));
    if (out != NULL && greet(conn) == FERRY_OK) {
        unsigned char hdr[FERRY_TCP_REQUEST_SIZE];
        out->count = 0;
        for (;;) {
            ferry_status_t status = next_header(conn, hdr, out);
            if (status != FERRY_OK) {
                ferry_debug("tcp: connection ended: %s", ferry_status_string(status));
                break;
            }
            if (serve_one(conn, hdr, out, &scratch) != FERRY_OK)
                break;
        }
    }
    free(out);
    free(scratch);
    /* The peer sees EOF now; the fd itself is closed by whoever joins us. */
    shutdown(conn->fd, SHUT_RDWR);
    atomic_store(&conn->finished, 1);
    ssize_t rc = write(tcp->wake_pipe[1], "r", 1); /* full pipe: a wake-up is pending anyway */
    (void)rc;
    return NULL;
}

static void target_conn_free(ferry_tcp_target_conn_t *conn)
{
    pthread_join(conn->thread, NULL);
    close(conn->fd);
    free(conn);
}

/* Join the connection threads that have finished (listener thread only). */
static void reap_finished(ferry_tcp_t *tcp)
{
    ferry_tcp_target_conn_t *done = NULL;
    pthread_mutex_lock(&tcp->target_lock);
    for (ferry_tcp_target_conn_t **pp = &tcp->target_conns; *pp != NULL;) {
        ferry_tcp_target_conn_t *conn = *pp;
        if (atomic_load(&conn->finished)) {
            *pp = conn->next;
            conn->next = done;
            done = conn;
            tcp->n_target_conns--;
        } else {
            pp = &conn->next;
        }
    }
    pthread_mutex_unlock(&tcp->target_lock);
    while (done != NULL) {
        ferry_tcp_target_conn_t *next = done->next;
        target_conn_free(done);
        done = next;
    }
}

/* Full or out of descriptors: say so, but not once per connection attempt. */
static void warn_refused(ferry_tcp_t *tcp, const char *why)
{
    unsigned long count =
        ferry_log_burst_due(&tcp->refused, ferry_time_ms(), REFUSED_WARN_INTERVAL_MS);
    if (count != 0)
        ferry_warn("tcp: refusing connections (%s); %lu refused since the last warning", why,
                   count);
}

static int is_evictable(int state)
{
    return state == FERRY_TCP_TARGET_HELLO || state == FERRY_TCP_TARGET_IDLE;
}

/* The link to the connection idle longest, among those from source (NULL:
 * all); NULL: none is idle.  The list is newest first, so of two idle since
 * the same millisecond the older wins.  target_lock held. */
static ferry_tcp_target_conn_t **oldest_idle_locked(ferry_tcp_t *tcp,
                                                    const ferry_net_source_t *source)
{
    ferry_tcp_target_conn_t **oldest = NULL;
    uint64_t oldest_ms = UINT64_MAX;
    for (ferry_tcp_target_conn_t **pp = &tcp->target_conns; *pp != NULL; pp = &(*pp)->next) {
        ferry_tcp_target_conn_t *conn = *pp;
        if (!is_evictable(atomic_load(&conn->state)) ||
            (source != NULL && memcmp(&conn->source, source, sizeof(*source)) != 0))
            continue;
        uint64_t idle_ms = atomic_load(&conn->idle_ms);
        if (idle_ms <= oldest_ms) {
            oldest = pp;
            oldest_ms = idle_ms;
        }
    }
    return oldest;
}

/* Room for a connection from source: *victim_p (or NULL) is out of the list
 * and EVICTED, for the caller to close.  0: the caps are reached and nothing
 * in the way is idle.  target_lock held. */
static int make_room_locked(ferry_tcp_t *tcp, const ferry_net_source_t *source,
                            ferry_tcp_target_conn_t **victim_p)
{
    size_t same = 0;
    for (ferry_tcp_target_conn_t *conn = tcp->target_conns; conn != NULL; conn = conn->next)
        same += memcmp(&conn->source, source, sizeof(*source)) == 0;
    ferry_net_admit_t admit = ferry_net_admit(tcp->n_target_conns, same, tcp->settings.max_conns,
                                              tcp->settings.max_conns_per_source);
    if (admit == FERRY_NET_ADMIT)
        return 1;
    const ferry_net_source_t *from = admit == FERRY_NET_EVICT_SAME_SOURCE ? source : NULL;
    /* A connection the scan found idle may turn busy before the swap: look again. */
    for (int attempt = 0; attempt < 8; attempt++) {
        ferry_tcp_target_conn_t **pp = oldest_idle_locked(tcp, from);
        if (pp == NULL)
            break;
        ferry_tcp_target_conn_t *conn = *pp;
        if (ferry_net_has_input(conn->fd)) {
            /* A request (or HELLO) is in, its thread not yet awake: busy in
             * all but name, so last in the eviction order. */
            atomic_store(&conn->idle_ms, ferry_time_ms());
            continue;
        }
        int state = atomic_load(&conn->state);
        if (is_evictable(state) &&
            atomic_compare_exchange_strong(&conn->state, &state, FERRY_TCP_TARGET_EVICTED)) {
            *pp = conn->next;
            tcp->n_target_conns--;
            *victim_p = conn;
            return 1;
        }
    }
    warn_refused(tcp, from ? "too many connections from one address, none idle"
                           : "all connections busy");
    return 0;
}

static void accept_one(ferry_tcp_t *tcp, int fd, const struct sockaddr *addr)
{
    int one = 1;
    /* 16-byte responses must not wait for Nagle */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ferry_tcp_tune_socket(tcp, fd);
    ferry_tcp_target_conn_t *conn = calloc(1, sizeof(*conn));
    if (conn == NULL) {
        close(fd);
        return;
    }
    conn->tcp = tcp;
    conn->fd = fd;
    atomic_init(&conn->state, FERRY_TCP_TARGET_HELLO);
    atomic_init(&conn->idle_ms, ferry_time_ms());
    ferry_net_source_of(addr, &conn->source);

    reap_finished(tcp); /* threads that left do not count */
    ferry_tcp_target_conn_t *victim = NULL;
    pthread_mutex_lock(&tcp->target_lock);
    int room = make_room_locked(tcp, &conn->source, &victim);
    pthread_mutex_unlock(&tcp->target_lock);
    if (victim != NULL) {
        /* Its thread is in poll() or about to be, holding nothing: it leaves
         * at once, so joining here holds up accepting for no time. */
        ferry_debug("tcp: evicting the connection idle longest for a new one");
        shutdown(victim->fd, SHUT_RDWR);
        target_conn_free(victim);
    }
    if (!room) {
        close(fd);
        free(conn);
        return;
    }
    /* Only this thread adds connections, so the room made is still there. */
    pthread_mutex_lock(&tcp->target_lock);
    if (ferry_tcp_thread_start(&conn->thread, FERRY_TCP_TARGET_STACK, target_conn_main, conn) !=
        FERRY_OK) {
        pthread_mutex_unlock(&tcp->target_lock);
        close(fd);
        free(conn);
        return;
    }
    conn->next = tcp->target_conns;
    tcp->target_conns = conn;
    tcp->n_target_conns++;
    pthread_mutex_unlock(&tcp->target_lock);
}

static void *listener_main(void *arg)
{
    ferry_tcp_t *tcp = arg;
    int backoff = 0;
    for (;;) {
        struct pollfd pfd[2] = {{.fd = tcp->wake_pipe[0], .events = POLLIN},
                                {.fd = tcp->listen_fd, .events = backoff ? 0 : POLLIN}};
        int rc = poll(pfd, 2, backoff ? 100 : -1);
        if (rc < 0 && errno != EINTR) {
            ferry_error("tcp: listener poll: %s", strerror(errno));
            break;
        }
        if (rc == 0)
            backoff = 0;
        if (pfd[0].revents & POLLIN) {
            char buf[64];
            while (read(tcp->wake_pipe[0], buf, sizeof(buf)) > 0)
                ;
            pthread_mutex_lock(&tcp->target_lock);
            int stopping = tcp->stopping;
            pthread_mutex_unlock(&tcp->target_lock);
            if (stopping)
                break;
            reap_finished(tcp);
        }
        if (!(pfd[1].revents & POLLIN))
            continue;
        struct sockaddr_storage addr;
        socklen_t addrlen = sizeof(addr);
        int fd = accept4(tcp->listen_fd, (struct sockaddr *)&addr, &addrlen, SOCK_CLOEXEC);
        if (fd >= 0) {
            accept_one(tcp, fd, (const struct sockaddr *)&addr);
        } else if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* out of descriptors: pause instead of spinning on a readable socket */
            ferry_error("tcp: accept: %s; pausing accepts for 100 ms", strerror(errno));
            backoff = 1;
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                   errno != ECONNABORTED) {
            ferry_warn("tcp: accept: %s", strerror(errno));
        }
    }
    return NULL;
}

ferry_status_t ferry_tcp_target_start(ferry_tcp_t *tcp, const char *host, int *port_p)
{
    ferry_status_t status = ferry_net_listen(host, 0, 128, &tcp->listen_fd, port_p);
    if (status != FERRY_OK)
        return status;
    fcntl(tcp->listen_fd, F_SETFL, fcntl(tcp->listen_fd, F_GETFL) | O_NONBLOCK);
    if (pipe2(tcp->wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        ferry_error("tcp: pipe: %s", strerror(errno));
        close(tcp->listen_fd);
        tcp->listen_fd = -1;
        tcp->wake_pipe[0] = tcp->wake_pipe[1] = -1;
        return FERRY_ERR_IO;
    }
    status = ferry_tcp_thread_start(&tcp->listener, FERRY_TCP_TARGET_STACK, listener_main, tcp);
    if (status != FERRY_OK)
        return status; /* ferry_tcp_target_stop closes the descriptors */
    tcp->listener_started = 1;
    return FERRY_OK;
}

void ferry_tcp_target_stop(ferry_tcp_t *tcp)
{
    if (tcp->listener_started) {
        pthread_mutex_lock(&tcp->target_lock);
        tcp->stopping = 1;
        pthread_mutex_unlock(&tcp->target_lock);
        ssize_t rc = write(tcp->wake_pipe[1], "s", 1);
        (void)rc;
        pthread_join(tcp->listener, NULL);
        tcp->listener_started = 0;
    }
    /* No accepts any more: wake every connection thread, then join them. */
    pthread_mutex_lock(&tcp->target_lock);
    ferry_tcp_target_conn_t *conns = tcp->target_conns;
    tcp->target_conns = NULL;
    tcp->n_target_conns = 0;
    pthread_mutex_unlock(&tcp->target_lock);
    for (ferry_tcp_target_conn_t *conn = conns; conn != NULL; conn = conn->next)
        shutdown(conn->fd, SHUT_RDWR);
    while (conns != NULL) {
        ferry_tcp_target_conn_t *next = conns->next;
        target_conn_free(conns);
        conns = next;
    }
    if (tcp->listen_fd >= 0)
        close(tcp->listen_fd);
    for (int i = 0; i < 2; i++)
        if (tcp->wake_pipe[i] >= 0)
            close(tcp->wake_pipe[i]);
    tcp->listen_fd = tcp->wake_pipe[0] = tcp->wake_pipe[1] = -1;
}
