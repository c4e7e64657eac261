/*
 * tcp initiator side: peers, their connections, and submit.
 *
 * submit() only queues: each slice goes to the connection with the fewest
 * outstanding bytes and that connection's sender thread writes it.  The
 * receiver thread matches responses against the in-flight FIFO and finishes
 * slices.  When any connection of a peer breaks, the whole peer fails: every
 * socket is shut down, both threads of each connection leave, and the last
 * to leave finishes what is still queued or in flight, so no buffer is
 * handed back to the engine while a thread could still touch it.
 */
#include "tcp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Bytes gathered into one sendmsg beyond the first slice. */
#define SEND_BATCH_BYTES (4u << 20)
/* Responses are read through a small buffer: many 16-byte responses per recv. */
#define RX_BUFFER 4096

/* ---------------- the peer table (tcp->lock) ---------------- */

static size_t bucket_of(const char *endpoint, uint64_t generation)
{
    uint64_t hash = 1469598103934665603ull ^ generation;
    for (const unsigned char *p = (const unsigned char *)endpoint; *p; p++)
        hash = (hash ^ *p) * 1099511628211ull;
    return (size_t)(hash % FERRY_TCP_PEER_BUCKETS);
}

static ferry_tcp_peer_t **table_slot(ferry_tcp_t *tcp, const char *endpoint, uint64_t generation)
{
    ferry_tcp_peer_t **pp = &tcp->buckets[bucket_of(endpoint, generation)];
    while (*pp != NULL &&
           ((*pp)->generation != generation || strcmp((*pp)->endpoint, endpoint) != 0))
        pp = &(*pp)->next;
    return pp;
}

static void table_remove(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer)
{
    ferry_tcp_peer_t **pp = table_slot(tcp, peer->endpoint, peer->generation);
    if (*pp == peer)
        *pp = peer->next;
    peer->next = NULL;
}

static ferry_tcp_peer_t *peer_new(ferry_tcp_t *tcp, const ferry_peer_t *desc)
{
    ferry_tcp_peer_t *peer = calloc(1, sizeof(*peer));
    if (peer == NULL)
        return NULL;
    peer->tcp = tcp;
    peer->endpoint = strdup(desc->endpoint);
    peer->generation = desc->generation;
    peer->state = FERRY_TCP_PEER_CONNECTING;
    peer->n_conns = tcp->settings.connections;
    peer->conns = calloc(peer->n_conns, sizeof(*peer->conns));
    if (peer->endpoint == NULL || peer->conns == NULL) {
        free(peer->endpoint);
        free(peer->conns);
        free(peer);
        return NULL;
    }
    atomic_init(&peer->refs, 1);
    for (unsigned i = 0; i < peer->n_conns; i++) {
        ferry_tcp_conn_t *conn = &peer->conns[i];
        conn->peer = peer;
        conn->fd = -1;
        conn->index = i;
        pthread_mutex_init(&conn->lock, NULL);
        pthread_cond_init(&conn->wakeup, NULL);
    }
    return peer;
}

static void peer_unref(ferry_tcp_peer_t *peer)
{
    if (atomic_fetch_sub(&peer->refs, 1) != 1)
        return;
    for (unsigned i = 0; i < peer->n_conns; i++) {
        ferry_tcp_conn_t *conn = &peer->conns[i];
        if (conn->fd >= 0)
            close(conn->fd);
        pthread_cond_destroy(&conn->wakeup);
        pthread_mutex_destroy(&conn->lock);
    }
    free(peer->conns);
    free(peer->endpoint);
    free(peer);
}

/* Stop every connection of the peer: no more queueing, threads wake up
 * (the sender from its condvar, both from any socket call) and leave. */
static void peer_shutdown(ferry_tcp_peer_t *peer, ferry_status_t status)
{
    for (unsigned i = 0; i < peer->n_conns; i++) {
        ferry_tcp_conn_t *conn = &peer->conns[i];
        pthread_mutex_lock(&conn->lock);
        if (!conn->dead) {
            conn->dead = 1;
            conn->fail_status = status;
        }
        pthread_cond_broadcast(&conn->wakeup);
        pthread_mutex_unlock(&conn->lock);
        if (conn->fd >= 0)
            shutdown(conn->fd, SHUT_RDWR);
    }
}

static void peer_fail(ferry_tcp_peer_t *peer, ferry_status_t why, const char *what)
{
    ferry_tcp_t *tcp = peer->tcp;
    if (atomic_exchange(&peer->failing, 1) == 0) {
        ferry_warn("tcp: peer %s (generation %016llx) failed while %s: %s; failing its "
                   "outstanding slices",
                   peer->endpoint, (unsigned long long)peer->generation, what,
                   ferry_status_string(why));
        pthread_mutex_lock(&tcp->lock);
        if (peer->state == FERRY_TCP_PEER_READY)
            peer->state = FERRY_TCP_PEER_FAILED;
        pthread_mutex_unlock(&tcp->lock);
    }
    peer_shutdown(peer, FERRY_ERR_PEER_FAILED);
}

static void peer_join(ferry_tcp_peer_t *peer)
{
    for (unsigned i = 0; i < peer->n_conns; i++) {
        ferry_tcp_conn_t *conn = &peer->conns[i];
        if (conn->threads_started & 1)
            pthread_join(conn->sender, NULL);
        if (conn->threads_started & 2)
            pthread_join(conn->receiver, NULL);
        conn->threads_started = 0;
    }
}

/* ---------------- connection threads ---------------- */

static void finish(ferry_tcp_conn_t *conn, ferry_slice_t *slice, ferry_status_t status)
{
    atomic_fetch_sub(&conn->outstanding, slice->length);
    conn->peer->tcp->svc.slice_done(slice, status);
}

/* Called with conn->lock held, by a thread that will touch no slice again;
 * returns with the lock released. */
static void conn_leave(ferry_tcp_conn_t *conn)
{
    ferry_tcp_peer_t *peer = conn->peer;
    ferry_slice_t *left = NULL;
    if (--conn->threads_left == 0) {
        /* queued slices were never sent; in-flight ones are lost with the socket */
        if (conn->inflight_tail != NULL) {
            conn->inflight_tail->next = conn->queue_head;
            left = conn->inflight_head;
        } else {
            left = conn->queue_head;
        }
        conn->inflight_head = conn->inflight_tail = NULL;
        conn->queue_head = conn->queue_tail = NULL;
    }
    ferry_status_t status = conn->fail_status;
    pthread_mutex_unlock(&conn->lock);
    while (left != NULL) {
        ferry_slice_t *next = left->next;
        left->next = NULL;
        finish(conn, left, status);
        left = next;
    }
    atomic_fetch_sub(&peer->threads_running, 1);
}

/* A socket call came back empty after one tick (TIMEOUT/4): give up only
 * when requests are outstanding and neither thread moved a byte for
 * TIMEOUT.  Ticks keep the bound near TIMEOUT; a kernel timeout alone
 * restarts with every partial transfer and could stretch it to twice that. */
static int conn_stalled(ferry_tcp_conn_t *conn, int at_boundary)
{
    if (at_boundary) {
        pthread_mutex_lock(&conn->lock);
        int idle = conn->inflight_head == NULL;
        pthread_mutex_unlock(&conn->lock);
        if (idle)
            return 0;
    }
    uint64_t quiet = ferry_time_ms() - atomic_load(&conn->last_activity_ms);
    return quiet >= conn->peer->tcp->settings.timeout_ms;
}

static ferry_status_t conn_io_error(ferry_tcp_conn_t *conn, ssize_t rc, int at_boundary)
{
    if (rc == 0)
        return FERRY_ERR_PEER_FAILED;
    if (errno == EINTR)
        return FERRY_OK;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
        return conn_stalled(conn, at_boundary) ? FERRY_ERR_TIMEOUT : FERRY_OK;
    return FERRY_ERR_PEER_FAILED;
}

static ferry_status_t conn_send(ferry_tcp_conn_t *conn, struct iovec *iov, int iovcnt)
{
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    while (msg.msg_iovlen > 0) {
        ssize_t sent = sendmsg(conn->fd, &msg, MSG_NOSIGNAL);
        if (sent <= 0) {
            ferry_status_t status = conn_io_error(conn, sent, 0);
            if (status != FERRY_OK)
                return status;
            continue;
        }
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
        size_t left = (size_t)sent;
        while (msg.msg_iovlen > 0 && left >= msg.msg_iov->iov_len) {
            left -= msg.msg_iov->iov_len;
            msg.msg_iov++;
            msg.msg_iovlen--;
        }
        if (msg.msg_iovlen > 0) {
            msg.msg_iov->iov_base = (char *)msg.msg_iov->iov_base + left;
            msg.msg_iov->iov_len -= left;
        }
    }
    return FERRY_OK;
}

static ferry_status_t conn_recv(ferry_tcp_conn_t *conn, void *buf, size_t len)
{
    char *p = buf;
    while (len > 0) {
        ssize_t got = recv(conn->fd, p, len, MSG_WAITALL);
        if (got <= 0) {
            ferry_status_t status = conn_io_error(conn, got, 0);
            if (status != FERRY_OK)
                return status;
            continue;
        }
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
        p += got;
        len -= (size_t)got;
    }
    return FERRY_OK;
}

typedef struct rx_buffer {
    size_t pos, len;
    unsigned char data[RX_BUFFER];
} rx_buffer_t;

/* At least `need` bytes in rx; an idle connection waits for ever. */
static ferry_status_t rx_fill(ferry_tcp_conn_t *conn, rx_buffer_t *rx, size_t need)
{
    if (rx->len - rx->pos >= need)
        return FERRY_OK;
    memmove(rx->data, rx->data + rx->pos, rx->len - rx->pos);
    rx->len -= rx->pos;
    rx->pos = 0;
    while (rx->len < need) {
        ssize_t got = recv(conn->fd, rx->data + rx->len, sizeof(rx->data) - rx->len, 0);
        if (got <= 0) {
            ferry_status_t status = conn_io_error(conn, got, rx->len == 0);
            if (status != FERRY_OK)
                return status;
            continue;
        }
        rx->len += (size_t)got;
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
    }
    return FERRY_OK;
}

static void *sender_main(void *arg)
{
    ferry_tcp_conn_t *conn = arg;
    unsigned char headers[FERRY_TCP_SEND_BATCH][FERRY_TCP_REQUEST_SIZE];
    struct iovec iov[2 * FERRY_TCP_SEND_BATCH];

    pthread_mutex_lock(&conn->lock);
    for (;;) {
        while (!conn->dead && conn->queue_head == NULL)
            pthread_cond_wait(&conn->wakeup, &conn->lock);
        if (conn->dead)
            break;
        /* In flight before written: the response may beat the sender's return.
         * The quiet-time clock starts now, under the lock the receiver's
         * stall check takes, so an old timestamp never meets a new slice. */
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
        int n = 0, iovcnt = 0;
        size_t bytes = 0;
        while (conn->queue_head != NULL && n < FERRY_TCP_SEND_BATCH &&
               (n == 0 || bytes < SEND_BATCH_BYTES)) {
            ferry_slice_t *slice = conn->queue_head;
            conn->queue_head = slice->next;
            if (conn->queue_head == NULL)
                conn->queue_tail = NULL;
            slice->next = NULL;
            if (conn->inflight_tail != NULL)
                conn->inflight_tail->next = slice;
            else
                conn->inflight_head = slice;
            conn->inflight_tail = slice;

            unsigned char *h = headers[n++];
            int write = slice->opcode == FERRY_OP_WRITE;
            memset(h, 0, FERRY_TCP_REQUEST_SIZE);
            h[0] = write ? FERRY_TCP_OP_WRITE : FERRY_TCP_OP_READ;
            ferry_tcp_put64(h + 8, conn->send_seq++);
            ferry_tcp_put64(h + 16, slice->remote_addr);
            ferry_tcp_put64(h + 24, slice->length);
            iov[iovcnt++] = (struct iovec){h, FERRY_TCP_REQUEST_SIZE};
            if (write) {
                iov[iovcnt++] = (struct iovec){slice->local, slice->length};
                bytes += slice->length;
            }
        }
        pthread_mutex_unlock(&conn->lock);

        ferry_status_t status = conn_send(conn, iov, iovcnt);

        pthread_mutex_lock(&conn->lock);
        if (status != FERRY_OK) {
            int ours = !conn->dead; /* else our own shutdown() broke the send */
            pthread_mutex_unlock(&conn->lock);
            if (ours)
                peer_fail(conn->peer, status, "sending");
            pthread_mutex_lock(&conn->lock);
            break;
        }
    }
    conn_leave(conn);
    return NULL;
}

/* What the engine hears about a target's answer.  Argument-class errors
 * mean the target refused the range; unknown codes from a confused or
 * hostile target are refusals too, never passed on raw. */
static ferry_status_t map_remote_status(int32_t status)
{
    switch (status) {
    case FERRY_OK:
    case FERRY_ERR_STALE:
    case FERRY_ERR_NO_MEMORY:
    case FERRY_ERR_NO_RESOURCE:
    case FERRY_ERR_IO:
        return (ferry_status_t)status;
    default:
        return FERRY_ERR_REMOTE_REFUSED;
    }
}

static void *receiver_main(void *arg)
{
    ferry_tcp_conn_t *conn = arg;
    rx_buffer_t *rx = malloc(sizeof(*rx));
    ferry_status_t status = rx ? FERRY_OK : FERRY_ERR_NO_MEMORY;
    const char *what = "receiving";
    if (rx != NULL)
        rx->pos = rx->len = 0;

    while (status == FERRY_OK) {
        status = rx_fill(conn, rx, FERRY_TCP_RESPONSE_SIZE);
        if (status != FERRY_OK)
            break;
        const unsigned char *r = rx->data + rx->pos;
        uint64_t id = ferry_tcp_get64(r);
        int32_t wire_status = (int32_t)ferry_tcp_get32(r + 8);
        rx->pos += FERRY_TCP_RESPONSE_SIZE;

        pthread_mutex_lock(&conn->lock);
        ferry_slice_t *slice = conn->inflight_head;
        if (slice == NULL || id != conn->recv_seq || wire_status > 0) {
            pthread_mutex_unlock(&conn->lock);
            ferry_warn("tcp: peer %s answered request %llu with status %d, expected %s%llu",
                       conn->peer->endpoint, (unsigned long long)id, (int)wire_status,
                       slice ? "request " : "nothing; ", (unsigned long long)conn->recv_seq);
            status = FERRY_ERR_PROTOCOL;
            what = "matching a response";
            break;
        }
        conn->inflight_head = slice->next;
        if (conn->inflight_head == NULL)
            conn->inflight_tail = NULL;
        conn->recv_seq++;
        pthread_mutex_unlock(&conn->lock);
        slice->next = NULL;

        if (slice->opcode == FERRY_OP_READ && wire_status == FERRY_OK) {
            /* Straight into the caller's buffer, but for what the last
             * recv already brought into rx. */
            size_t copied = FERRY_MIN(rx->len - rx->pos, slice->length);
            memcpy(slice->local, rx->data + rx->pos, copied);
            rx->pos += copied;
            if (copied < slice->length)
                status = conn_recv(conn, (char *)slice->local + copied, slice->length - copied);
            if (status != FERRY_OK) {
                /* This slice is ours alone now: fail it after the peer. */
                peer_fail(conn->peer, status, "receiving READ data");
                pthread_mutex_lock(&conn->lock);
                ferry_status_t fail_status = conn->fail_status;
                pthread_mutex_unlock(&conn->lock);
                finish(conn, slice, fail_status);
                what = NULL;
                break;
            }
        }
        finish(conn, slice, map_remote_status(wire_status));
    }
    free(rx);

    pthread_mutex_lock(&conn->lock);
    int ours = !conn->dead; /* else peer_forget or another connection's failure */
    pthread_mutex_unlock(&conn->lock);
    if (ours && what != NULL)
        peer_fail(conn->peer, status, what);
    pthread_mutex_lock(&conn->lock);
    conn_leave(conn);
    return NULL;
}

/* ---------------- connecting ---------------- */

static ferry_status_t hello(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer, int fd)
{
    const char *rpc = tcp->svc.rpc_endpoint ? tcp->svc.rpc_endpoint : "";
    size_t rpc_len = strlen(rpc);
    if (rpc_len > FERRY_TCP_HELLO_RPC_MAX)
        rpc_len = 0; /* a cut endpoint would be wrong; none just means no notifications */
    unsigned char msg[FERRY_TCP_HELLO_SIZE + FERRY_TCP_HELLO_RPC_MAX];
    ferry_tcp_put32(msg, FERRY_TCP_MAGIC);
    ferry_tcp_put16(msg + 4, FERRY_TCP_VERSION);
    ferry_tcp_put16(msg + 6, 0);
    ferry_tcp_put64(msg + 8, peer->generation);
    ferry_tcp_put16(msg + 16, (uint16_t)rpc_len);
    memcpy(msg + FERRY_TCP_HELLO_SIZE, rpc, rpc_len);
    ferry_status_t status = ferry_net_send_all(fd, msg, FERRY_TCP_HELLO_SIZE + rpc_len);
    unsigned char ack[FERRY_TCP_ACK_SIZE];
    if (status == FERRY_OK)
        status = ferry_net_recv_all(fd, ack, sizeof(ack));
    if (status != FERRY_OK) {
        ferry_warn("tcp: HELLO exchange with %s failed: %s", peer->endpoint,
                   ferry_status_string(status));
        return FERRY_ERR_CONNECT;
    }
    int32_t ack_status = (int32_t)ferry_tcp_get32(ack + 8);
    if (ferry_tcp_get32(ack) != FERRY_TCP_MAGIC || ferry_tcp_get16(ack + 4) != FERRY_TCP_VERSION) {
        ferry_warn("tcp: %s is not a ferry tcp endpoint of wire version %d", peer->endpoint,
                   FERRY_TCP_VERSION);
        return FERRY_ERR_CONNECT;
    }
    if (ack_status == FERRY_ERR_STALE) {
        ferry_debug("tcp: %s is generation %016llx, not %016llx", peer->endpoint,
                    (unsigned long long)ferry_tcp_get64(ack + 16),
                    (unsigned long long)peer->generation);
        return FERRY_ERR_STALE;
    }
    if (ack_status != FERRY_OK) {
        ferry_warn("tcp: %s refused the connection: %s", peer->endpoint,
                   ferry_status_string((ferry_status_t)ack_status));
        return FERRY_ERR_CONNECT;
    }
    uint64_t max_slice = ferry_tcp_get64(ack + 24);
    if (peer->max_slice == 0 || max_slice < peer->max_slice)
        peer->max_slice = max_slice;
    return FERRY_OK;
}

static ferry_status_t start_threads(ferry_tcp_peer_t *peer)
{
    for (unsigned i = 0; i < peer->n_conns; i++) {
        ferry_tcp_conn_t *conn = &peer->conns[i];
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
        conn->threads_left = 2;
        atomic_fetch_add(&peer->threads_running, 2);
        if (ferry_tcp_thread_start(&conn->sender, FERRY_TCP_WORKER_STACK, sender_main, conn) ==
            FERRY_OK)
            conn->threads_started |= 1;
        if (ferry_tcp_thread_start(&conn->receiver, FERRY_TCP_WORKER_STACK, receiver_main,
                                   conn) == FERRY_OK)
            conn->threads_started |= 2;
        if (conn->threads_started != 3) {
            int missing = 2 - (conn->threads_started & 1) - (conn->threads_started >> 1);
            pthread_mutex_lock(&conn->lock);
            conn->threads_left -= missing;
            pthread_mutex_unlock(&conn->lock);
            atomic_fetch_sub(&peer->threads_running, (unsigned)missing);
            atomic_store(&peer->failing, 1);
            peer_shutdown(peer, FERRY_ERR_CANCELED);
            peer_join(peer);
            return FERRY_ERR_NO_RESOURCE;
        }
    }
    return FERRY_OK;
}

/* Open every connection of a CONNECTING peer; no lock held. */
static ferry_status_t peer_connect(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer)
{
    ferry_status_t status = FERRY_OK;
    for (unsigned i = 0; i < peer->n_conns && status == FERRY_OK; i++) {
        int fd;
        status = ferry_net_connect(peer->endpoint, tcp->settings.connect_timeout_ms, &fd);
        if (status != FERRY_OK) {
            ferry_warn("tcp: cannot connect to %s: %s", peer->endpoint,
                       ferry_status_string(status));
            status = FERRY_ERR_CONNECT;
            break;
        }
        peer->conns[i].fd = fd;
        ferry_tcp_tune_socket(tcp, fd);
        ferry_net_set_timeout(fd, tcp->settings.connect_timeout_ms);
        status = hello(tcp, peer, fd);
        unsigned timeout = tcp->settings.timeout_ms;
        ferry_net_set_timeout(fd, timeout ? FERRY_MAX(timeout / 4, 1u) : 0); /* a tick */
    }
    if (status == FERRY_OK)
        status = start_threads(peer);
    if (status != FERRY_OK) {
        for (unsigned i = 0; i < peer->n_conns; i++) {
            if (peer->conns[i].fd >= 0)
                close(peer->conns[i].fd);
            peer->conns[i].fd = -1;
        }
        return status;
    }
    ferry_debug("tcp: connected to %s (generation %016llx) with %u sockets", peer->endpoint,
                (unsigned long long)peer->generation, peer->n_conns);
    return FERRY_OK;
}

/* ---------------- the peer life cycle ---------------- */

/* Graveyard peers whose threads have all left: join (immediate) and free. */
static void reap_graveyard(ferry_tcp_t *tcp)
{
    ferry_tcp_peer_t *done = NULL;
    pthread_mutex_lock(&tcp->lock);
    for (ferry_tcp_peer_t **pp = &tcp->graveyard; *pp != NULL;) {
        ferry_tcp_peer_t *peer = *pp;
        if (atomic_load(&peer->threads_running) == 0) {
            *pp = peer->next;
            peer->next = done;
            done = peer;
        } else {
            pp = &peer->next;
        }
    }
    pthread_mutex_unlock(&tcp->lock);
    while (done != NULL) {
        ferry_tcp_peer_t *next = done->next;
        peer_join(done);
        peer_unref(done);
        done = next;
    }
}

/* A READY peer for desc, referenced; connects it first if needed. */
static ferry_status_t peer_get(ferry_tcp_t *tcp, const ferry_peer_t *desc,
                               ferry_tcp_peer_t **peer_p)
{
    pthread_mutex_lock(&tcp->lock);
    int reap = tcp->graveyard != NULL;
    ferry_tcp_peer_t **slot = table_slot(tcp, desc->endpoint, desc->generation);
    ferry_tcp_peer_t *peer = *slot;
    if (peer != NULL && peer->state == FERRY_TCP_PEER_FAILED) {
        /* Say so once, so the engine refreshes and retries; that retry
         * (or the next submit) connects afresh. */
        *slot = peer->next;
        peer->state = FERRY_TCP_PEER_GONE;
        peer->next = tcp->graveyard;
        tcp->graveyard = peer;
        pthread_mutex_unlock(&tcp->lock);
        return FERRY_ERR_PEER_FAILED;
    }
    if (peer != NULL) {
        atomic_fetch_add(&peer->refs, 1);
        while (peer->state == FERRY_TCP_PEER_CONNECTING)
            pthread_cond_wait(&tcp->settled, &tcp->lock);
        ferry_status_t status = peer->state == FERRY_TCP_PEER_READY ? FERRY_OK
                                : peer->state == FERRY_TCP_PEER_FAILED
                                    ? FERRY_ERR_PEER_FAILED
                                    : peer->connect_status;
        pthread_mutex_unlock(&tcp->lock);
        if (reap)
            reap_graveyard(tcp);
        if (status != FERRY_OK) {
            peer_unref(peer);
            return status;
        }
        *peer_p = peer;
        return FERRY_OK;
    }

    peer = peer_new(tcp, desc);
    if (peer == NULL) {
        pthread_mutex_unlock(&tcp->lock);
        return FERRY_ERR_NO_MEMORY;
    }
    atomic_store(&peer->refs, 2); /* the table's and ours */
    *slot = peer;
    pthread_mutex_unlock(&tcp->lock);
    if (reap)
        reap_graveyard(tcp);

    ferry_status_t status = peer_connect(tcp, peer);
    pthread_mutex_lock(&tcp->lock);
    if (status == FERRY_OK) {
        /* a connection may already have broken; peer_fail could not mark it then */
        peer->state = atomic_load(&peer->failing) ? FERRY_TCP_PEER_FAILED : FERRY_TCP_PEER_READY;
    } else {
        table_remove(tcp, peer);
        peer->state = FERRY_TCP_PEER_GONE;
        peer->connect_status = status;
    }
    pthread_cond_broadcast(&tcp->settled);
    pthread_mutex_unlock(&tcp->lock);
    if (status != FERRY_OK) {
        peer_unref(peer); /* the table's */
        peer_unref(peer);
        return status;
    }
    *peer_p = peer;
    return FERRY_OK;
}

ferry_status_t ferry_tcp_submit(void *ctx, const ferry_peer_t *desc, ferry_slice_t *slices)
{
    ferry_tcp_t *tcp = ctx;
    if (desc == NULL || desc->endpoint == NULL || *desc->endpoint == '\0' || slices == NULL)
        return FERRY_ERR_INVALID_PARAM;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next) {
        if (s->length == 0 || s->local == NULL ||
            (s->opcode != FERRY_OP_READ && s->opcode != FERRY_OP_WRITE))
            return FERRY_ERR_INVALID_PARAM;
    }
    ferry_tcp_peer_t *peer;
    ferry_status_t status = peer_get(tcp, desc, &peer);
    if (status != FERRY_OK)
        return status;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next) {
        if (s->length > peer->max_slice) {
            ferry_error("tcp: a %zu-byte slice exceeds the %llu bytes %s accepts "
                        "(FERRY_TCP_MAX_SLICE there, FERRY_TCP_SLICE_SIZE here)",
                        s->length, (unsigned long long)peer->max_slice, peer->endpoint);
            peer_unref(peer);
            return FERRY_ERR_INVALID_PARAM;
        }
    }

    /* All connections locked at once: either every slice is queued or, if
     * the peer died meanwhile, none is. */
    for (unsigned i = 0; i < peer->n_conns; i++)
        pthread_mutex_lock(&peer->conns[i].lock);
    int dead = 0;
    for (unsigned i = 0; i < peer->n_conns; i++)
        dead |= peer->conns[i].dead;
    uint64_t touched_mask = 0; /* connections to wake (n_conns <= 64) */
    if (!dead) {
        ferry_slice_t *next;
        for (ferry_slice_t *s = slices; s != NULL; s = next) {
            next = s->next;
            s->next = NULL;
            ferry_tcp_conn_t *best = &peer->conns[0];
            size_t best_bytes = atomic_load(&best->outstanding);
            for (unsigned i = 1; i < peer->n_conns; i++) {
                size_t bytes = atomic_load(&peer->conns[i].outstanding);
                if (bytes < best_bytes) {
                    best = &peer->conns[i];
                    best_bytes = bytes;
                }
            }
            atomic_fetch_add(&best->outstanding, s->length);
            if (best->queue_tail != NULL)
                best->queue_tail->next = s;
            else
                best->queue_head = s;
            best->queue_tail = s;
            touched_mask |= 1ull << best->index;
        }
    }
    for (unsigned i = 0; i < peer->n_conns; i++) {
        if (touched_mask & (1ull << i))
            pthread_cond_signal(&peer->conns[i].wakeup);
        pthread_mutex_unlock(&peer->conns[i].lock);
    }
    peer_unref(peer);
    return dead ? FERRY_ERR_PEER_FAILED : FERRY_OK;
}

/* ---------------- forgetting ---------------- */

static void peer_stop(ferry_tcp_peer_t *peer)
{
    atomic_store(&peer->failing, 1); /* our own shutdown is no failure to report */
    peer_shutdown(peer, FERRY_ERR_CANCELED);
    peer_join(peer);
    peer_unref(peer);
}

void ferry_tcp_peer_forget(void *ctx, const ferry_peer_t *desc)
{
    ferry_tcp_t *tcp = ctx;
    if (desc == NULL || desc->endpoint == NULL)
        return;
    ferry_tcp_peer_t *peer = NULL;
    pthread_mutex_lock(&tcp->lock);
    for (;;) {
        ferry_tcp_peer_t **slot = table_slot(tcp, desc->endpoint, desc->generation);
        peer = *slot;
        if (peer == NULL || peer->state != FERRY_TCP_PEER_CONNECTING)
            break;
        pthread_cond_wait(&tcp->settled, &tcp->lock); /* then look again */
    }
    if (peer != NULL) {
        table_remove(tcp, peer);
        peer->state = FERRY_TCP_PEER_GONE;
    }
    pthread_mutex_unlock(&tcp->lock);
    if (peer != NULL) {
        ferry_debug("tcp: forgetting %s (generation %016llx)", peer->endpoint,
                    (unsigned long long)peer->generation);
        peer_stop(peer);
    }
    reap_graveyard(tcp);
}

void ferry_tcp_peers_destroy(ferry_tcp_t *tcp)
{
    ferry_tcp_peer_t *all = NULL;
    pthread_mutex_lock(&tcp->lock);
    for (size_t b = 0; b < FERRY_TCP_PEER_BUCKETS; b++) {
        while (tcp->buckets[b] != NULL) {
            ferry_tcp_peer_t *peer = tcp->buckets[b];
            if (peer->state == FERRY_TCP_PEER_CONNECTING) {
                /* a submit still connecting would be the engine's bug; wait it out */
                pthread_cond_wait(&tcp->settled, &tcp->lock);
                continue;
            }
            tcp->buckets[b] = peer->next;
            peer->state = FERRY_TCP_PEER_GONE;
            peer->next = all;
            all = peer;
        }
    }
    ferry_tcp_peer_t *graveyard = tcp->graveyard;
    tcp->graveyard = NULL;
    pthread_mutex_unlock(&tcp->lock);
    while (all != NULL) {
        ferry_tcp_peer_t *next = all->next;
        peer_stop(all);
        all = next;
    }
    while (graveyard != NULL) {
        ferry_tcp_peer_t *next = graveyard->next;
        peer_join(graveyard);
        peer_unref(graveyard);
        graveyard = next;
    }
}
