/*
 * RPC server: one thread, one epoll set holding the listening socket, a
 * wake-up eventfd and the client connections.  Sockets are non-blocking so
 * that a slow or hostile peer can only ever cost its own connection.
 *
 * Cost per wake-up follows the connections that are ready, not those that
 * are open: epoll reports the ready ones (level-triggered, so a connection
 * cut short by the per-event read bound is reported again on the next
 * wake-up), and every connection's next deadline sits in a min-heap, so the
 * wait's timeout is the heap's top and only expired connections are looked
 * at.  Only admission past the caps walks the connections (counting one
 * source's, finding the idle longest): it happens when the listener is full.
 *
 * Per connection, requests are handled one at a time: read the header, then
 * the payload, call the handler, queue the reply.  While a reply has not gone
 * out, the connection is not read (epoll watches it for output only), so a
 * client that pipelines requests without reading replies is held back by
 * TCP instead of growing our memory.
 *
 * What clients can hold is bounded (limits in rpc.h): a frame must complete
 * and a reply must move within the timeout, an idle connection closes after
 * the idle timeout, and a new connection past the per-source or the global
 * cap evicts the connection idle longest -- so a flood of idle connections
 * costs the flooder its oldest ones, never another client its call.
 *
 * A connection is freed only by the server thread, and only outside the
 * loop over one wait's events, except for the connection that event is
 * about: no event of the same batch can point at a freed connection.
 */
#include "rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#define RPC_BACKLOG 1024
/* A frame's first read allocates at most this much; the payload buffer then
 * grows with the bytes that really arrive, so a header that merely claims a
 * large frame costs nothing. */
#define RPC_PAYLOAD_CHUNK (64 * 1024)
/* Reads per connection per wake-up, so one busy peer cannot starve others. */
#define RPC_READS_PER_EVENT 64
#define RPC_WARN_INTERVAL_MS 10000
#define RPC_ACCEPT_PAUSE_MS 100
/* Accepts per wake-up: the requests of a burst of clients are read between
 * rounds, so they are inside a frame, not idle, when the caps are reached. */
#define RPC_ACCEPTS_PER_EVENT 16
/* Idle-looking connections found with a request in, before giving up. */
#define RPC_EVICT_TRIES 8
/* Ready connections taken from epoll per wait; more wait for the next one
 * (epoll hands them out in turn). */
#define RPC_EVENTS_PER_WAIT 256

typedef struct rpc_conn {
    int fd;
    size_t slot;             /* its index in server->conns */
    uint64_t serial;         /* accept order: of two idle since the same ms, the older goes */
    uint32_t watched;        /* EPOLLIN or EPOLLOUT: what epoll reports for it now */
    ferry_deadline_entry_t deadline; /* in server->deadlines while it has one */
    char peer[INET6_ADDRSTRLEN + 8];
    ferry_net_source_t source;
    uint8_t header_bytes[FERRY_RPC_HEADER_SIZE];
    size_t header_got;
    ferry_rpc_header_t header; /* valid once header_got == FERRY_RPC_HEADER_SIZE */
    uint8_t *payload;
    size_t payload_capacity;
    size_t payload_got;
    uint8_t *out;           /* unsent part of the replies: out[out_sent, out_length) */
    size_t out_length;
    size_t out_sent;
    size_t out_capacity;
    uint64_t frame_start_ms; /* first byte of the frame being read; 0: none */
    uint64_t active_ms;      /* last byte moved either way */
    uint64_t out_progress_ms;
} rpc_conn_t;

struct ferry_rpc_server {
    int listen_fd;
    int wake_fd;
    int epoll_fd;
    pthread_t thread;
    ferry_rpc_server_limits_t limits;
    ferry_rpc_handler_fn handler;
    void *arg;
    /* Everything below belongs to the server thread alone (and to stop,
     * after the join). */
    rpc_conn_t **conns; /* limits.max_conns slots; [0, n_conns) used, in no order */
    size_t n_conns;
    uint64_t next_serial;
    ferry_deadline_heap_t deadlines; /* of the connections that have one */
    uint64_t accept_paused_until_ms; /* 0: the listener is watched */
    ferry_log_burst_t refused;
};

/* What epoll's data.ptr is for the two sockets that are not connections. */
#define RPC_TAG_WAKE(server) ((void *)&(server)->wake_fd)
#define RPC_TAG_LISTEN(server) ((void *)&(server)->listen_fd)

static rpc_conn_t *conn_of_deadline(ferry_deadline_entry_t *entry)
{
    return (rpc_conn_t *)((char *)entry - offsetof(rpc_conn_t, deadline));
}

/* Unlink it from the table and the heap, then free it.  close() also takes
 * it out of the epoll set (nobody else holds the descriptor). */
static void conn_close(ferry_rpc_server_t *server, rpc_conn_t *conn)
{
    ferry_deadline_heap_set(&server->deadlines, &conn->deadline, UINT64_MAX);
    rpc_conn_t *last = server->conns[--server->n_conns];
    server->conns[conn->slot] = last;
    last->slot = conn->slot;
    close(conn->fd);
    free(conn->payload);
    free(conn->out);
    free(conn);
}

static int watch(ferry_rpc_server_t *server, int op, int fd, uint32_t events, void *tag)
{
    struct epoll_event event = {.events = events, .data.ptr = tag};
    if (epoll_ctl(server->epoll_fd, op, fd, &event) == 0)
        return 1;
    ferry_error("RPC server: epoll_ctl: %s", strerror(errno));
    return 0;
}

static void format_peer(const struct sockaddr_storage *addr, socklen_t addrlen, char *out,
                        size_t len)
{
    char host[INET6_ADDRSTRLEN] = "?";
    char port[8] = "?";
    getnameinfo((const struct sockaddr *)addr, addrlen, host, sizeof(host), port, sizeof(port),
                NI_NUMERICHOST | NI_NUMERICSERV);
    snprintf(out, len, addr->ss_family == AF_INET6 ? "[%s]:%s" : "%s:%s", host, port);
}

/* Full or out of descriptors: say so, but not once per connection attempt. */
static void warn_refused(ferry_rpc_server_t *server, uint64_t now, const char *why)
{
    unsigned long count = ferry_log_burst_due(&server->refused, now, RPC_WARN_INTERVAL_MS);
    if (count != 0)
        ferry_warn("RPC server: refusing connections (%s); %lu refused since the last warning",
                   why, count);
}

static int conn_is_idle(const rpc_conn_t *conn)
{
    return conn->frame_start_ms == 0 && conn->out_length == 0;
}

/* The connection idle longest, among those from source (NULL: all); -1: none. */
static ssize_t oldest_idle(const ferry_rpc_server_t *server, const ferry_net_source_t *source)
{
    ssize_t oldest = -1;
    for (size_t i = 0; i < server->n_conns; i++) {
        const rpc_conn_t *conn = server->conns[i];
        if (!conn_is_idle(conn) ||
            (source != NULL && memcmp(&conn->source, source, sizeof(*source)) != 0))
            continue;
        const rpc_conn_t *best = oldest < 0 ? NULL : server->conns[oldest];
        if (best == NULL || conn->active_ms < best->active_ms ||
            (conn->active_ms == best->active_ms && conn->serial < best->serial))
            oldest = (ssize_t)i;
    }
    return oldest;
}

static void conn_rearm(ferry_rpc_server_t *server, rpc_conn_t *conn);

/* Connections from source; only counted when they could reach the cap. */
static size_t open_from(const ferry_rpc_server_t *server, const ferry_net_source_t *source)
{
    if (server->n_conns < server->limits.max_conns_per_source)
        return server->n_conns; /* all of them are below the cap, whatever their source */
    size_t same = 0;
    for (size_t i = 0; i < server->n_conns; i++)
        same += memcmp(&server->conns[i]->source, source, sizeof(*source)) == 0;
    return same;
}

/* Make room for a connection from source.  Returns 0 when the caps are
 * reached and no connection in the way is idle: the newcomer is refused. */
static int make_room(ferry_rpc_server_t *server, const ferry_net_source_t *source,
                     const char *peer, uint64_t now)
{
    ferry_net_admit_t admit = ferry_net_admit(server->n_conns, open_from(server, source),
                                              server->limits.max_conns,
                                              server->limits.max_conns_per_source);
    if (admit == FERRY_NET_ADMIT)
        return 1;
    const ferry_net_source_t *from = admit == FERRY_NET_EVICT_SAME_SOURCE ? source : NULL;
    ssize_t victim = -1;
    for (int attempt = 0; attempt < RPC_EVICT_TRIES && victim < 0; attempt++) {
        victim = oldest_idle(server, from);
        if (victim >= 0 && ferry_net_has_input(server->conns[victim]->fd)) {
            /* Its request came in since the last wait: busy in all but name. */
            server->conns[victim]->active_ms = now;
            conn_rearm(server, server->conns[victim]);
            victim = -1;
        }
    }
    if (victim < 0) {
        warn_refused(server, now, from ? "too many connections from one source, none idle"
                                       : "all connections busy");
        return 0;
    }
    rpc_conn_t *conn = server->conns[victim];
    ferry_debug("RPC server: closing the connection from %s, idle for %llu ms, for one from %s",
                conn->peer, (unsigned long long)(now - conn->active_ms), peer);
    conn_close(server, conn);
    ferry_rpc_counter_add(FERRY_RPC_COUNT_EVICTED, 1);
    return 1;
}

/* Stop watching the listener for a moment: the pending connection stays
 * queued and the listener readable, and level-triggered epoll would spin. */
static void pause_accepting(ferry_rpc_server_t *server, uint64_t now)
{
    if (server->accept_paused_until_ms == 0 &&
        !watch(server, EPOLL_CTL_MOD, server->listen_fd, 0, RPC_TAG_LISTEN(server)))
        return;
    server->accept_paused_until_ms = now + RPC_ACCEPT_PAUSE_MS;
}

static void resume_accepting(ferry_rpc_server_t *server, uint64_t now)
{
    if (server->accept_paused_until_ms == 0 || now < server->accept_paused_until_ms)
        return;
    if (watch(server, EPOLL_CTL_MOD, server->listen_fd, EPOLLIN, RPC_TAG_LISTEN(server)))
        server->accept_paused_until_ms = 0;
}

static void accept_all(ferry_rpc_server_t *server, uint64_t now)
{
    for (int accepted = 0; accepted < RPC_ACCEPTS_PER_EVENT; accepted++) {
        struct sockaddr_storage addr;
        socklen_t addrlen = sizeof(addr);
        int fd = accept4(server->listen_fd, (struct sockaddr *)&addr, &addrlen,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            warn_refused(server, now, strerror(errno));
            pause_accepting(server, now);
            return;
        }
        ferry_net_source_t source;
        char peer[sizeof(((rpc_conn_t *)NULL)->peer)];
        ferry_net_source_of((const struct sockaddr *)&addr, &source);
        format_peer(&addr, addrlen, peer, sizeof(peer));
        if (!make_room(server, &source, peer, now)) {
            close(fd);
            ferry_rpc_counter_add(FERRY_RPC_COUNT_REFUSED, 1);
            continue;
        }
        rpc_conn_t *conn = calloc(1, sizeof(*conn));
        if (conn == NULL) {
            close(fd);
            warn_refused(server, now, "out of memory");
            ferry_rpc_counter_add(FERRY_RPC_COUNT_REFUSED, 1);
            continue;
        }
        /* Pipelined replies are small writes; Nagle would hold each one back
         * until the client's delayed ACK for the previous one. */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conn->fd = fd;
        conn->active_ms = now;
        conn->source = source;
        conn->serial = server->next_serial++;
        conn->watched = EPOLLIN;
        conn->deadline = (ferry_deadline_entry_t)FERRY_DEADLINE_ENTRY_INIT;
        memcpy(conn->peer, peer, sizeof(peer));
        if (!watch(server, EPOLL_CTL_ADD, fd, EPOLLIN, conn)) {
            close(fd);
            free(conn);
            ferry_rpc_counter_add(FERRY_RPC_COUNT_REFUSED, 1);
            continue;
        }
        conn->slot = server->n_conns;
        server->conns[server->n_conns++] = conn;
        ferry_rpc_counter_add(FERRY_RPC_COUNT_ACCEPTED, 1);
        ferry_trace("RPC connection from %s", conn->peer);
        conn_rearm(server, conn); /* queues its idle deadline (may close it: last) */
    }
}

/* Returns 0 when the connection broke. */
static int conn_flush(rpc_conn_t *conn, uint64_t now)
{
    while (conn->out_sent < conn->out_length) {
        ssize_t sent = send(conn->fd, conn->out + conn->out_sent,
                            conn->out_length - conn->out_sent, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        if (sent <= 0) {
            ferry_debug("RPC connection from %s: send: %s", conn->peer, strerror(errno));
            return 0;
        }
        conn->out_sent += (size_t)sent;
        conn->out_progress_ms = now;
        conn->active_ms = now;
    }
    conn->out_sent = conn->out_length = 0;
    /* A large reply should not pin its buffer for the connection's life. */
    if (conn->out_capacity > RPC_PAYLOAD_CHUNK) {
        free(conn->out);
        conn->out = NULL;
        conn->out_capacity = 0;
    }
    return 1;
}

/* Send header+reply now if the socket takes it; keep what it did not take.
 * Only called with nothing queued, as a connection is not read while a reply
 * is out.  Returns 0 when the connection broke or the copy could not be made. */
static int conn_queue_reply(rpc_conn_t *conn, uint8_t *header, void *reply, size_t reply_length,
                            uint64_t now)
{
    struct iovec iov[2] = {{header, FERRY_RPC_HEADER_SIZE}, {reply, reply_length}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = reply_length ? 2 : 1};
    ssize_t rc;
    do {
        rc = sendmsg(conn->fd, &msg, MSG_NOSIGNAL);
    } while (rc < 0 && errno == EINTR);
    if (rc < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
        ferry_debug("RPC connection from %s: send: %s", conn->peer, strerror(errno));
        return 0;
    }
    size_t sent = rc > 0 ? (size_t)rc : 0;
    size_t left = FERRY_RPC_HEADER_SIZE + reply_length - sent;
    conn->active_ms = conn->out_progress_ms = now;
    if (left == 0)
        return 1;
    if (conn->out_capacity < left) {
        uint8_t *out = realloc(conn->out, left);
        if (out == NULL) {
            ferry_error("RPC connection from %s: no memory for a %zu-byte reply", conn->peer,
                        left);
            return 0;
        }
        conn->out = out;
        conn->out_capacity = left;
    }
    for (int i = 0; i < 2; i++) {
        size_t skip = FERRY_MIN(sent, iov[i].iov_len);
        if (iov[i].iov_len > skip)
            memcpy(conn->out + conn->out_length, (uint8_t *)iov[i].iov_base + skip,
                   iov[i].iov_len - skip);
        conn->out_length += iov[i].iov_len - skip;
        sent -= skip;
    }
    return 1;
}

static int is_request_type(int type)
{
    return type == FERRY_RPC_FETCH || type == FERRY_RPC_NOTIFY || type == FERRY_RPC_PROBE ||
           type == FERRY_RPC_INVALIDATE;
}

static ferry_rpc_count_t served_counter(int type)
{
    switch (type) {
    case FERRY_RPC_FETCH: return FERRY_RPC_COUNT_SERVED_FETCH;
    case FERRY_RPC_NOTIFY: return FERRY_RPC_COUNT_SERVED_NOTIFY;
    case FERRY_RPC_PROBE: return FERRY_RPC_COUNT_SERVED_PROBE;
    case FERRY_RPC_INVALIDATE: return FERRY_RPC_COUNT_SERVED_INVALIDATE;
    default: return FERRY_RPC_COUNT_SERVED_OTHER;
    }
}

/* Run the handler on the complete frame and queue its reply. */
static int conn_dispatch(ferry_rpc_server_t *server, rpc_conn_t *conn, uint64_t now)
{
    static const uint8_t empty[1];
    int type = conn->header.type;
    int reply_type = 0;
    void *reply = NULL;
    size_t reply_length = 0;
    const void *payload = conn->header.length ? conn->payload : empty;
    ferry_rpc_counter_add(served_counter(type), 1);
    ferry_status_t status = server->handler(server->arg, type, payload, conn->header.length,
                                            &reply_type, &reply, &reply_length);
    if (reply == NULL)
        reply_length = 0;
    if (reply_type == 0)
        reply_type = status < 0 || !is_request_type(type) ? FERRY_RPC_ERROR_REPLY : type + 1;
    if (reply_type < FERRY_RPC_FETCH || reply_type > FERRY_RPC_ERROR_REPLY) {
        ferry_error("RPC handler gave reply type %d to request type %d", reply_type, type);
        reply_type = FERRY_RPC_ERROR_REPLY;
        status = FERRY_ERR_PROTOCOL;
    }
    /* The peer would drop a reply over its bound as garbage: say why instead. */
    if (reply_length > server->limits.max_frame) {
        ferry_error("RPC reply of %zu bytes to request type %d exceeds the %zu-byte frame "
                    "limit", reply_length, type, server->limits.max_frame);
        reply_type = FERRY_RPC_ERROR_REPLY;
        status = FERRY_ERR_NO_RESOURCE;
    }
    if (reply_type == FERRY_RPC_ERROR_REPLY)
        reply_length = 0;

    ferry_rpc_header_t header = {.magic = FERRY_RPC_MAGIC, .version = FERRY_RPC_VERSION,
                                 .type = (uint8_t)reply_type, .status = status,
                                 .length = (uint32_t)reply_length};
    uint8_t header_bytes[FERRY_RPC_HEADER_SIZE];
    ferry_rpc_header_pack(&header, header_bytes);
    int ok = conn_queue_reply(conn, header_bytes, reply, reply_length, now);
    free(reply);

    free(conn->payload);
    conn->payload = NULL;
    conn->payload_capacity = conn->payload_got = 0;
    conn->header_got = 0;
    conn->frame_start_ms = 0;
    return ok;
}

/* Make room for the next read of the payload.  Returns 0 on no memory. */
static int conn_grow_payload(rpc_conn_t *conn)
{
    size_t length = conn->header.length;
    if (conn->payload_got < conn->payload_capacity)
        return 1;
    size_t capacity = FERRY_MAX(conn->payload_capacity * 2, (size_t)RPC_PAYLOAD_CHUNK);
    capacity = FERRY_MIN(capacity, length);
    uint8_t *payload = realloc(conn->payload, capacity);
    if (payload == NULL) {
        ferry_error("RPC connection from %s: no memory for a %zu-byte frame", conn->peer,
                    length);
        return 0;
    }
    conn->payload = payload;
    conn->payload_capacity = capacity;
    return 1;
}

/* Read what the socket has and serve every request it completes.
 * Returns 0 when the connection must be closed. */
static int conn_read(ferry_rpc_server_t *server, rpc_conn_t *conn, uint64_t now)
{
    for (int reads = 0; reads < RPC_READS_PER_EVENT; reads++) {
        int in_header = conn->header_got < FERRY_RPC_HEADER_SIZE;
        uint8_t *dst;
        size_t want;
        if (in_header) {
            dst = conn->header_bytes + conn->header_got;
            want = FERRY_RPC_HEADER_SIZE - conn->header_got;
        } else {
            if (!conn_grow_payload(conn))
                return 0;
            dst = conn->payload + conn->payload_got;
            want = conn->payload_capacity - conn->payload_got;
        }
        ssize_t got = recv(conn->fd, dst, want, 0);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 1;
        int in_frame = conn->frame_start_ms != 0;
        if (got < 0) {
            if (in_frame)
                ferry_warn("RPC connection from %s failed inside a frame: %s", conn->peer,
                           strerror(errno));
            return 0;
        }
        if (got == 0) {
            /* Between frames this is a normal close (replies are out before we
             * read again, so a client may shut its side after its last request). */
            if (in_frame)
                ferry_warn("RPC connection from %s closed inside a frame (%zu of %zu header "
                           "bytes, %zu of %u payload bytes)", conn->peer, conn->header_got,
                           (size_t)FERRY_RPC_HEADER_SIZE, conn->payload_got,
                           in_header ? 0u : conn->header.length);
            return 0;
        }
        conn->active_ms = now;
        if (!in_frame)
            conn->frame_start_ms = now;
        if (in_header) {
            conn->header_got += (size_t)got;
            if (conn->header_got < FERRY_RPC_HEADER_SIZE)
                continue;
            if (ferry_rpc_header_unpack(conn->header_bytes, server->limits.max_frame,
                                        &conn->header) != FERRY_OK) {
                ferry_warn("RPC connection from %s sent a bad header (magic 0x%08x version %u "
                           "type %u reserved %u length %u, limit %zu); closing it", conn->peer,
                           conn->header.magic, conn->header.version, conn->header.type,
                           conn->header.reserved, conn->header.length, server->limits.max_frame);
                return 0;
            }
        } else {
            conn->payload_got += (size_t)got;
        }
        if (conn->header_got == FERRY_RPC_HEADER_SIZE &&
            conn->payload_got == conn->header.length) {
            if (!conn_dispatch(server, conn, now))
                return 0;
            if (conn->out_length > 0)
                return 1; /* wait for the reply to drain before reading more */
        }
    }
    return 1;
}

/* When this connection must next be looked at; UINT64_MAX: never. */
static uint64_t conn_deadline(const ferry_rpc_server_t *server, const rpc_conn_t *conn)
{
    uint64_t timeout = server->limits.timeout_ms;
    uint64_t idle = server->limits.idle_timeout_ms;
    uint64_t deadline = UINT64_MAX;
    if (idle != 0 && conn_is_idle(conn))
        deadline = conn->active_ms + idle;
    if (timeout == 0)
        return deadline;
    if (conn->frame_start_ms != 0)
        deadline = FERRY_MIN(deadline, conn->frame_start_ms + timeout);
    if (conn->out_length > 0)
        deadline = FERRY_MIN(deadline, conn->out_progress_ms + timeout);
    return deadline;
}

/* Returns 0 when the connection overstayed and must be closed. */
static int conn_check_deadline(const ferry_rpc_server_t *server, const rpc_conn_t *conn,
                               uint64_t now)
{
    if (now < conn_deadline(server, conn))
        return 1;
    unsigned timeout = server->limits.timeout_ms;
    if (conn->out_length > 0 && now >= conn->out_progress_ms + timeout)
        ferry_warn("RPC connection from %s took no reply bytes for %u ms; closing it",
                   conn->peer, timeout);
    else if (conn->frame_start_ms != 0 && now >= conn->frame_start_ms + timeout)
        ferry_warn("RPC connection from %s did not complete a frame within %u ms (%zu header, "
                   "%zu payload bytes); closing it", conn->peer, timeout, conn->header_got,
                   conn->payload_got);
    else
        ferry_debug("RPC connection from %s idle for %u ms; closing it", conn->peer,
                    server->limits.idle_timeout_ms);
    return 0;
}

/* After the connection's state changed: watch it for what it waits for
 * now, and queue its next deadline.  A failed epoll_ctl closes it: its
 * events would never come. */
static void conn_rearm(ferry_rpc_server_t *server, rpc_conn_t *conn)
{
    uint32_t want = conn->out_length > 0 ? EPOLLOUT : EPOLLIN;
    if (want != conn->watched) {
        if (!watch(server, EPOLL_CTL_MOD, conn->fd, want, conn)) {
            conn_close(server, conn);
            return;
        }
        conn->watched = want;
    }
    ferry_deadline_heap_set(&server->deadlines, &conn->deadline, conn_deadline(server, conn));
}

/* Close every connection whose deadline has passed: the heap's top ones. */
static void expire(ferry_rpc_server_t *server, uint64_t now)
{
    ferry_deadline_entry_t *top;
    while ((top = ferry_deadline_heap_top(&server->deadlines)) != NULL && top->deadline <= now) {
        rpc_conn_t *conn = conn_of_deadline(top);
        if (!conn_check_deadline(server, conn, now))
            conn_close(server, conn);
        else
            conn_rearm(server, conn); /* not reached: its deadline is its state's */
    }
}

static int wait_ms_until(const ferry_rpc_server_t *server, uint64_t now)
{
    uint64_t deadline = UINT64_MAX;
    ferry_deadline_entry_t *top = ferry_deadline_heap_top(&server->deadlines);
    if (top != NULL)
        deadline = top->deadline;
    if (server->accept_paused_until_ms != 0)
        deadline = FERRY_MIN(deadline, server->accept_paused_until_ms);
    if (deadline == UINT64_MAX)
        return -1;
    return deadline <= now ? 0 : (int)FERRY_MIN(deadline - now, (uint64_t)INT_MAX);
}

static void *server_main(void *arg)
{
    ferry_rpc_server_t *server = arg;
    struct epoll_event events[RPC_EVENTS_PER_WAIT];
    for (;;) {
        int ready = epoll_wait(server->epoll_fd, events, RPC_EVENTS_PER_WAIT,
                               wait_ms_until(server, ferry_time_ms()));
        if (ready < 0 && errno != EINTR) {
            ferry_error("RPC server: epoll_wait: %s", strerror(errno));
            break;
        }
        uint64_t now = ferry_time_ms();
        int stop = 0, listener_ready = 0;
        for (int i = 0; i < ready; i++) {
            void *tag = events[i].data.ptr;
            if (tag == RPC_TAG_WAKE(server)) {
                stop = 1;
                continue;
            }
            if (tag == RPC_TAG_LISTEN(server)) {
                listener_ready = 1;
                continue;
            }
            rpc_conn_t *conn = tag;
            int ok = conn->out_length > 0 ? conn_flush(conn, now) : conn_read(server, conn, now);
            if (ok)
                conn_rearm(server, conn);
            else
                conn_close(server, conn);
        }
        if (stop)
            break;
        expire(server, now);
        /* After closing, so freed slots are reusable right away. */
        resume_accepting(server, now);
        if (listener_ready)
            accept_all(server, now);
    }
    return NULL;
}

ferry_status_t ferry_rpc_server_start(const char *host, int port,
                                      const ferry_rpc_server_limits_t *limits,
                                      ferry_rpc_handler_fn handler, void *arg,
                                      ferry_rpc_server_t **server_p, int *port_p)
{
    if (host == NULL || limits == NULL || limits->max_conns == 0 || handler == NULL ||
        server_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_rpc_server_t *server = calloc(1, sizeof(*server));
    if (server == NULL)
        return FERRY_ERR_NO_MEMORY;
    server->limits = *limits;
    /* The length field is 32 bits: a larger bound means "whatever fits". */
    server->limits.max_frame = FERRY_MIN(limits->max_frame, (size_t)UINT32_MAX);
    if (limits->max_conns_per_source == 0 || limits->max_conns_per_source > limits->max_conns)
        server->limits.max_conns_per_source = limits->max_conns;
    server->handler = handler;
    server->arg = arg;

    ferry_status_t status = FERRY_ERR_NO_MEMORY;
    server->conns = calloc(limits->max_conns, sizeof(*server->conns));
    if (server->conns == NULL)
        goto err_free_server;
    if (ferry_deadline_heap_init(&server->deadlines, limits->max_conns) != FERRY_OK)
        goto err_free_conns;
    status = FERRY_ERR_IO;
    server->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (server->epoll_fd < 0) {
        ferry_error("RPC server: epoll_create1: %s", strerror(errno));
        goto err_free_heap;
    }
    server->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (server->wake_fd < 0) {
        ferry_error("RPC server: eventfd: %s", strerror(errno));
        goto err_close_epoll;
    }
    int actual_port;
    status = ferry_net_listen(host, port, RPC_BACKLOG, &server->listen_fd, &actual_port);
    if (status != FERRY_OK)
        goto err_close_wake;
    int flags = fcntl(server->listen_fd, F_GETFL);
    if (flags < 0 || fcntl(server->listen_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
        ferry_error("RPC server: fcntl: %s", strerror(errno));
        status = FERRY_ERR_IO;
        goto err_close_listen;
    }
    if (!watch(server, EPOLL_CTL_ADD, server->wake_fd, EPOLLIN, RPC_TAG_WAKE(server)) ||
        !watch(server, EPOLL_CTL_ADD, server->listen_fd, EPOLLIN, RPC_TAG_LISTEN(server))) {
        status = FERRY_ERR_IO;
        goto err_close_listen;
    }

    /* The application's signal handlers must not run on our thread. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&server->thread, NULL, server_main, server);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        ferry_error("RPC server: pthread_create: %s", strerror(rc));
        status = FERRY_ERR_NO_RESOURCE;
        goto err_close_listen;
    }
    ferry_debug("RPC server listening on %s:%d", host, actual_port);
    if (port_p != NULL)
        *port_p = actual_port;
    *server_p = server;
    return FERRY_OK;

err_close_listen:
    close(server->listen_fd);
err_close_wake:
    close(server->wake_fd);
err_close_epoll:
    close(server->epoll_fd);
err_free_heap:
    ferry_deadline_heap_fini(&server->deadlines);
err_free_conns:
    free(server->conns);
err_free_server:
    free(server);
    return status;
}

void ferry_rpc_server_stop(ferry_rpc_server_t *server)
{
    if (server == NULL)
        return;
    uint64_t one = 1;
    ssize_t rc;
    do {
        rc = write(server->wake_fd, &one, sizeof(one));
    } while (rc < 0 && errno == EINTR);
    pthread_join(server->thread, NULL);
    /* The reverse of start: connections, listener, wake-up, epoll set. */
    while (server->n_conns > 0)
        conn_close(server, server->conns[server->n_conns - 1]);
    close(server->listen_fd);
    close(server->wake_fd);
    close(server->epoll_fd);
    ferry_deadline_heap_fini(&server->deadlines);
    free(server->conns);
    free(server);
}
