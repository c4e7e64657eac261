/*
 * tcp initiator side: peers, their connections, and submit.
 *
 * submit() only queues: each slice goes to the connection with the fewest
 * outstanding bytes and that connection's sender thread writes it.  The
 * receiver thread matches responses against the in-flight FIFO and finishes
 * slices.  When any connection of a peer breaks, the whole peer fails: every
 * socket is shut down, both threads of each connection leave, and the last
 * to leave finishes what is still queued or in flight, so no buffer goes
 * back to the engine while a thread could still touch it.
 *
 * A connection that ends with nothing queued or in flight is no failure: the
 * target closed it idle (its IDLE_TIMEOUT, or an eviction), or submit retired
 * it at half the target's idle timeout so that no request can be on its way
 * when the target closes it.  Submit uses the peer's other connections and,
 * once nothing is outstanding, replaces the peer by a fresh connect.
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

static ferry_tcp_peer_t **table_slot(ferry_tcp_t *tcp, const char *endpoint, uint64_t generation)
{
    uint64_t hash = 1469598103934665603ull ^ generation; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)endpoint; *p; p++)
        hash = (hash ^ *p) * 1099511628211ull;
    ferry_tcp_peer_t **pp = &tcp->buckets[hash % FERRY_TCP_PEER_BUCKETS];
    while (*pp != NULL &&
           ((*pp)->generation != generation || strcmp((*pp)->endpoint, endpoint) != 0))
        pp = &(*pp)->next;
    return pp;
}

/* Out of the table (if still there) and into the graveyard, whose threads
 * are joined once they have left. */
static void peer_retire_locked(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer)
{
    ferry_tcp_peer_t **pp = table_slot(tcp, peer->endpoint, peer->generation);
    if (*pp != peer)
        return;
    *pp = peer->next;
    peer->state = FERRY_TCP_PEER_GONE;
    peer->next = tcp->graveyard;
    tcp->graveyard = peer;
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

/* No more queueing; the threads wake up (the sender from its condvar, both
 * from any socket call) and leave.  The first status set wins. */
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
        size_t outstanding = 0;
        for (unsigned i = 0; i < peer->n_conns; i++)
            outstanding += atomic_load(&peer->conns[i].outstanding);
        if (outstanding > 0)
            ferry_warn("tcp: peer %s (generation %016llx) failed while %s: %s; failing %zu "
                       "outstanding bytes",
                       peer->endpoint, (unsigned long long)peer->generation, what,
                       ferry_status_string(why), outstanding);
        else /* an idle peer that went away, e.g. its engine was destroyed */
            ferry_debug("tcp: idle peer %s (generation %016llx) closed: %s", peer->endpoint,
                        (unsigned long long)peer->generation, ferry_status_string(why));
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

/* ---------------- finishing slices ---------------- */

static void finish(ferry_tcp_conn_t *conn, ferry_slice_t *slice, ferry_status_t status)
{
    atomic_fetch_sub(&conn->outstanding, slice->length);
    conn->peer->tcp->svc.slice_done(slice, status);
}

/* WRITEs the target acknowledged while sendmsg still held their buffers.
 * The kernel no longer reads them, but sanitizers check the iovecs after
 * the call returns, so they are finished only then.  Lock held. */
static void finish_acked(ferry_tcp_conn_t *conn)
{
    while (conn->n_acked > 0) {
        ferry_tcp_acked_t acked[FERRY_TCP_SEND_BATCH];
        unsigned n = conn->n_acked;
        memcpy(acked, conn->acked, n * sizeof(acked[0]));
        conn->n_acked = 0;
        pthread_mutex_unlock(&conn->lock);
        for (unsigned i = 0; i < n; i++)
            finish(conn, acked[i].slice, acked[i].status);
        pthread_mutex_lock(&conn->lock);
    }
}

/* By a thread of a dead connection that will touch no slice again, lock
 * held; returns with it released. */
static void conn_leave(ferry_tcp_conn_t *conn)
{
    ferry_slice_t *left = NULL;
    finish_acked(conn);
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
    atomic_fetch_sub(&conn->peer->threads_running, 1);
}

/* ---------------- socket I/O with stall detection ---------------- */

/*
 * Socket calls wait one tick (TIMEOUT/8) at most.  After an empty one, give
 * up only when requests are outstanding and neither thread moved a byte for
 * TIMEOUT.  A call that made progress returns only when its tick ends, so
 * the failure comes at most two ticks late; with the kernel timeout set to
 * TIMEOUT itself it could come twice as late.
 */
static ferry_status_t conn_wait_result(ferry_tcp_conn_t *conn, ssize_t rc, int at_boundary)
{
    if (rc == 0)
        return FERRY_ERR_PEER_FAILED;
    if (errno == EINTR)
        return FERRY_OK;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        return FERRY_ERR_PEER_FAILED;
    if (at_boundary) {
        pthread_mutex_lock(&conn->lock);
        int idle = conn->inflight_head == NULL;
        pthread_mutex_unlock(&conn->lock);
        if (idle)
            return FERRY_OK; /* an idle connection waits for ever */
    }
    uint64_t quiet = ferry_time_ms() - atomic_load(&conn->last_activity_ms);
    return quiet >= conn->peer->tcp->settings.timeout_ms ? FERRY_ERR_TIMEOUT : FERRY_OK;
}

static ferry_status_t conn_send(ferry_tcp_conn_t *conn, struct iovec *iov, int iovcnt)
{
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)iovcnt};
    while (msg.msg_iovlen > 0) {
        ssize_t sent = sendmsg(conn->fd, &msg, MSG_NOSIGNAL);
        if (sent <= 0) {
            ferry_status_t status = conn_wait_result(conn, sent, 0);
            if (status != FERRY_OK)
                return status;
            continue;
        }
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
        ferry_net_iov_advance(&msg, (size_t)sent);
    }
    return FERRY_OK;
}

/* At least `min` bytes into buf (up to len).  MSG_WAITALL when exactly
 * len is wanted: one call for a whole READ payload. */
static ferry_status_t conn_recv(ferry_tcp_conn_t *conn, unsigned char *buf, size_t min, size_t len,
                                size_t *got_p, int at_boundary)
{
    size_t got = 0;
    while (got < min) {
        ssize_t rc = recv(conn->fd, buf + got, len - got, min == len ? MSG_WAITALL : 0);
        if (rc <= 0) {
            ferry_status_t status = conn_wait_result(conn, rc, at_boundary && got == 0);
            if (status != FERRY_OK)
                return status;
            continue;
        }
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
        got += (size_t)rc;
    }
    *got_p = got;
    return FERRY_OK;
}

/* ---------------- the connection threads ---------------- */

/* Device memory (a slice with local_device): the payload goes through the
 * engine's page-locked buffers, the device copy of one overlapping the
 * socket's work on the other. */
static ferry_status_t send_staged(void *arg, const void *buffer, size_t length)
{
    struct iovec iov = {(void *)buffer, length};
    return conn_send(arg, &iov, 1);
}

static ferry_status_t send_device(ferry_tcp_conn_t *conn, ferry_slice_t *slice)
{
    ferry_tcp_t *tcp = conn->peer->tcp;
    return tcp->svc.stage_out(tcp->svc.engine, NULL, slice->local, slice->length, send_staged,
                              conn);
}

typedef struct staged_read {
    ferry_tcp_conn_t *conn;
    struct rx_buffer *rx;
} staged_read_t;

static ferry_status_t recv_device(ferry_tcp_conn_t *conn, struct rx_buffer *rx,
                                  ferry_slice_t *slice);

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
        /* In flight before written: the response may beat our return.  The
         * quiet-time clock restarts under the lock the receiver's stall
         * check takes, so an old timestamp never meets a new slice. */
        atomic_store(&conn->last_activity_ms, ferry_time_ms());
        int n = 0, iovcnt = 0;
        size_t bytes = 0;
        ferry_slice_t *staged = NULL;
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

            int write = slice->opcode == FERRY_OP_WRITE;
            ferry_tcp_encode_request(headers[n], write ? FERRY_TCP_OP_WRITE : FERRY_TCP_OP_READ,
                                     conn->send_seq++, slice->remote_addr, slice->length);
            iov[iovcnt++] = (struct iovec){headers[n++], FERRY_TCP_REQUEST_SIZE};
            if (write && slice->local_device) {
                staged = slice; /* its payload follows this send, through host buffers */
                break;
            }
            if (write) {
                iov[iovcnt++] = (struct iovec){slice->local, slice->length};
                bytes += slice->length;
            }
        }
        pthread_mutex_unlock(&conn->lock);

        ferry_status_t status = conn_send(conn, iov, iovcnt);
        if (status == FERRY_OK && staged != NULL)
            status = send_device(conn, staged);
        staged = NULL;

        pthread_mutex_lock(&conn->lock);
        conn->sent_seq = conn->send_seq;
        finish_acked(conn);
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
    case FERRY_ERR_IO: return (ferry_status_t)status;
    default: return FERRY_ERR_REMOTE_REFUSED;
    }
}

struct rx_buffer {
    size_t pos, len;
    unsigned char data[RX_BUFFER];
};
typedef struct rx_buffer rx_buffer_t;

/* Until an error; *held_p: a READ slice taken off the FIFO whose data did
 * not all arrive (only this thread knows it). */
static ferry_status_t receive(ferry_tcp_conn_t *conn, rx_buffer_t *rx, ferry_slice_t **held_p)
{
    for (;;) {
        if (rx->len - rx->pos < FERRY_TCP_RESPONSE_SIZE) {
            size_t have = rx->len - rx->pos, got;
            memmove(rx->data, rx->data + rx->pos, have);
            rx->pos = 0;
            ferry_status_t status = conn_recv(conn, rx->data + have, FERRY_TCP_RESPONSE_SIZE - have,
                                              sizeof(rx->data) - have, &got, have == 0);
            rx->len = have + (status == FERRY_OK ? got : 0);
            if (status != FERRY_OK)
                return status;
        }
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
            return FERRY_ERR_PROTOCOL;
        }
        conn->inflight_head = slice->next;
        if (conn->inflight_head == NULL)
            conn->inflight_tail = NULL;
        conn->recv_seq++;
        slice->next = NULL;
        ferry_status_t status = map_remote_status(wire_status);
        if (slice->opcode == FERRY_OP_WRITE && id >= conn->sent_seq) {
            conn->acked[conn->n_acked++] = (ferry_tcp_acked_t){slice, status};
            pthread_mutex_unlock(&conn->lock);
            continue;
        }
        pthread_mutex_unlock(&conn->lock);

        if (slice->opcode == FERRY_OP_READ && status == FERRY_OK && slice->local_device) {
            ferry_status_t data_status = recv_device(conn, rx, slice);
            if (data_status != FERRY_OK) {
                *held_p = slice;
                return data_status;
            }
        } else if (slice->opcode == FERRY_OP_READ && status == FERRY_OK) {
            /* straight into the caller's buffer, but for what rx already holds */
            size_t copied = FERRY_MIN(rx->len - rx->pos, slice->length), got;
            memcpy(slice->local, rx->data + rx->pos, copied);
            rx->pos += copied;
            size_t rest = slice->length - copied;
            ferry_status_t data_status =
                rest ? conn_recv(conn, (unsigned char *)slice->local + copied, rest, rest, &got, 0)
                     : FERRY_OK;
            if (data_status != FERRY_OK) {
                *held_p = slice;
                return data_status;
            }
        }
        finish(conn, slice, status);
    }
}

/* A host buffer of a READ into device memory: first what rx already
 * holds, then the socket. */
static ferry_status_t recv_staged(void *arg, void *buffer, size_t length)
{
    staged_read_t *in = arg;
    struct rx_buffer *rx = in->rx;
    size_t copied = FERRY_MIN(rx->len - rx->pos, length), got;
    memcpy(buffer, rx->data + rx->pos, copied);
    rx->pos += copied;
    size_t rest = length - copied;
    return rest ? conn_recv(in->conn, (unsigned char *)buffer + copied, rest, rest, &got, 0)
                : FERRY_OK;
}

/* A failure here leaves the stream mid-payload: the connection fails. */
static ferry_status_t recv_device(ferry_tcp_conn_t *conn, struct rx_buffer *rx,
                                  ferry_slice_t *slice)
{
    ferry_tcp_t *tcp = conn->peer->tcp;
    staged_read_t in = {conn, rx};
    return tcp->svc.stage_in(tcp->svc.engine, NULL, slice->local, slice->length, recv_staged,
                             &in);
}

static void *receiver_main(void *arg)
{
    ferry_tcp_conn_t *conn = arg;
    ferry_slice_t *held = NULL;
    rx_buffer_t *rx = malloc(sizeof(*rx));
    ferry_status_t status = FERRY_ERR_NO_MEMORY;
    int between_responses = 0;
    if (rx != NULL) {
        rx->pos = rx->len = 0;
        status = receive(conn, rx, &held);
        between_responses = held == NULL && rx->pos == rx->len;
        free(rx);
    }
    pthread_mutex_lock(&conn->lock);
    int ours = !conn->dead; /* else peer_forget or another connection's failure */
    if (ours && status == FERRY_ERR_PEER_FAILED && between_responses && conn->queue_head == NULL &&
        conn->inflight_head == NULL) {
        /* The target closed a connection nothing was on: idle, not failed. */
        conn->dead = conn->closed_idle = 1;
        conn->fail_status = FERRY_ERR_PEER_FAILED;
        pthread_cond_broadcast(&conn->wakeup);
        ours = 0;
        ferry_debug("tcp: %s closed idle connection %u", conn->peer->endpoint, conn->index);
    }
    pthread_mutex_unlock(&conn->lock);
    if (ours)
        peer_fail(conn->peer, status, "receiving");
    pthread_mutex_lock(&conn->lock);
    if (held != NULL) {
        ferry_status_t fail_status = conn->fail_status;
        pthread_mutex_unlock(&conn->lock);
        finish(conn, held, fail_status);
        pthread_mutex_lock(&conn->lock);
    }
    conn_leave(conn);
    return NULL;
}

/* ---------------- connecting ---------------- */

/* Connect, HELLO, HELLO_ACK. */
static ferry_status_t conn_open(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer, ferry_tcp_conn_t *conn)
{
    ferry_status_t status =
        ferry_net_connect(peer->endpoint, tcp->settings.connect_timeout_ms, &conn->fd);
    if (status != FERRY_OK) {
        ferry_warn("tcp: cannot connect to %s: %s", peer->endpoint, ferry_status_string(status));
        return FERRY_ERR_CONNECT;
    }
    ferry_tcp_tune_socket(tcp, conn->fd);
    ferry_net_set_timeout(conn->fd, tcp->settings.connect_timeout_ms);
    const char *rpc = tcp->svc.rpc_endpoint ? tcp->svc.rpc_endpoint : "";
    size_t rpc_len = strlen(rpc);
    if (rpc_len > FERRY_TCP_HELLO_RPC_MAX)
        rpc_len = 0; /* a cut endpoint would be wrong; none only means no notifications */
    unsigned char hello[FERRY_TCP_HELLO_SIZE + FERRY_TCP_HELLO_RPC_MAX];
    unsigned char ack[FERRY_TCP_ACK_SIZE];
    size_t hello_len = ferry_tcp_encode_hello(hello, peer->generation, rpc, rpc_len);
    status = ferry_net_send_all(conn->fd, hello, hello_len);
    if (status == FERRY_OK)
        status = ferry_net_recv_all(conn->fd, ack, sizeof(ack));
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
    peer->idle_timeout_ms = ferry_tcp_get32(ack + 12);
    unsigned timeout = tcp->settings.timeout_ms;
    ferry_net_set_timeout(conn->fd, timeout ? FERRY_MAX(timeout / 8, 1u) : 0); /* one tick */
    return FERRY_OK;
}

static ferry_status_t conn_start(ferry_tcp_peer_t *peer, ferry_tcp_conn_t *conn)
{
    atomic_store(&conn->last_activity_ms, ferry_time_ms());
    /* counted before they run, so the first to leave never sees zero */
    conn->threads_left = 2;
    atomic_fetch_add(&peer->threads_running, 2);
    ferry_status_t status =
        ferry_tcp_thread_start(&conn->sender, FERRY_TCP_WORKER_STACK, sender_main, conn);
    if (status == FERRY_OK) {
        conn->threads_started = 1;
        status =
            ferry_tcp_thread_start(&conn->receiver, FERRY_TCP_WORKER_STACK, receiver_main, conn);
    }
    if (status == FERRY_OK) {
        conn->threads_started = 3;
        return FERRY_OK;
    }
    unsigned missing = conn->threads_started ? 1 : 2;
    pthread_mutex_lock(&conn->lock);
    conn->threads_left -= (int)missing;
    pthread_mutex_unlock(&conn->lock);
    atomic_fetch_sub(&peer->threads_running, missing);
    return status;
}

/* Open every connection of a CONNECTING peer; no lock held. */
static ferry_status_t peer_connect(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer)
{
    ferry_status_t status = FERRY_OK;
    for (unsigned i = 0; i < peer->n_conns && status == FERRY_OK; i++)
        status = conn_open(tcp, peer, &peer->conns[i]);
    for (unsigned i = 0; i < peer->n_conns && status == FERRY_OK; i++)
        status = conn_start(peer, &peer->conns[i]);
    if (status == FERRY_OK) {
        ferry_debug("tcp: connected to %s (generation %016llx) with %u sockets", peer->endpoint,
                    (unsigned long long)peer->generation, peer->n_conns);
        return FERRY_OK;
    }
    atomic_store(&peer->failing, 1); /* reported already */
    peer_shutdown(peer, FERRY_ERR_CANCELED);
    peer_join(peer);
    for (unsigned i = 0; i < peer->n_conns; i++) {
        if (peer->conns[i].fd >= 0)
            close(peer->conns[i].fd);
        peer->conns[i].fd = -1;
    }
    return status;
}

/* ---------------- the peer life cycle ---------------- */

/* Graveyard peers whose threads have all left: join (immediate) and free. */
static void reap_graveyard(ferry_tcp_t *tcp, int all)
{
    ferry_tcp_peer_t *done = NULL;
    pthread_mutex_lock(&tcp->lock);
    for (ferry_tcp_peer_t **pp = &tcp->graveyard; *pp != NULL;) {
        ferry_tcp_peer_t *peer = *pp;
        if (all || atomic_load(&peer->threads_running) == 0) {
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
    ferry_status_t status = FERRY_OK;
    int reap = tcp->graveyard != NULL;
    ferry_tcp_peer_t **slot = table_slot(tcp, desc->endpoint, desc->generation);
    ferry_tcp_peer_t *peer = *slot;
    if (peer != NULL && peer->state == FERRY_TCP_PEER_FAILED) {
        /* Said once, so the engine refreshes and retries; that retry (or
         * the next submit) connects afresh. */
        peer_retire_locked(tcp, peer);
        pthread_mutex_unlock(&tcp->lock);
        return FERRY_ERR_PEER_FAILED;
    }
    if (peer != NULL) {
        atomic_fetch_add(&peer->refs, 1);
        while (peer->state == FERRY_TCP_PEER_CONNECTING)
            pthread_cond_wait(&tcp->settled, &tcp->lock);
        if (peer->state == FERRY_TCP_PEER_FAILED)
            status = FERRY_ERR_PEER_FAILED;
        else if (peer->state == FERRY_TCP_PEER_GONE)
            status = peer->connect_status;
        pthread_mutex_unlock(&tcp->lock);
    } else {
        if ((peer = peer_new(tcp, desc)) == NULL) {
            pthread_mutex_unlock(&tcp->lock);
            return FERRY_ERR_NO_MEMORY;
        }
        atomic_store(&peer->refs, 2); /* the table's and ours */
        *slot = peer;
        pthread_mutex_unlock(&tcp->lock);

        status = peer_connect(tcp, peer);
        pthread_mutex_lock(&tcp->lock);
        if (status == FERRY_OK) {
            /* a connection may have broken already; peer_fail could not mark it */
            peer->state =
                atomic_load(&peer->failing) ? FERRY_TCP_PEER_FAILED : FERRY_TCP_PEER_READY;
        } else {
            *table_slot(tcp, peer->endpoint, peer->generation) = peer->next;
            peer->state = FERRY_TCP_PEER_GONE;
            peer->connect_status = status;
            atomic_fetch_sub(&peer->refs, 1); /* the table's; ours is still held */
        }
        pthread_cond_broadcast(&tcp->settled);
        pthread_mutex_unlock(&tcp->lock);
    }
    if (reap)
        reap_graveyard(tcp, 0);
    if (status != FERRY_OK) {
        peer_unref(peer);
        return status;
    }
    *peer_p = peer;
    return FERRY_OK;
}

/* An idle connection closed by us: its threads leave, no slice was on it.
 * The caller shuts its socket down once the lock is released. */
static void conn_retire_idle_locked(ferry_tcp_conn_t *conn, uint64_t *retired_p)
{
    conn->dead = conn->closed_idle = 1;
    conn->fail_status = FERRY_ERR_CANCELED;
    pthread_cond_broadcast(&conn->wakeup);
    *retired_p |= 1ull << conn->index;
}

/* Retire connections that the target may close any moment now: idle for
 * half its idle timeout.  Returns 1 when the peer should be replaced: some
 * connection closed idle and nothing is outstanding on any, so no slice is
 * lost by closing the rest.  Every connection's lock held. */
static int peer_check_idle_locked(ferry_tcp_peer_t *peer, uint64_t *retired_p)
{
    unsigned idle_timeout = peer->idle_timeout_ms;
    uint64_t now = 0; /* read once, when a connection could be past half the timeout */
    int closed = 0, busy = 0;
    for (unsigned i = 0; i < peer->n_conns; i++) {
        ferry_tcp_conn_t *conn = &peer->conns[i];
        int empty = conn->queue_head == NULL && conn->inflight_head == NULL;
        int idle = !conn->dead && empty && idle_timeout != 0;
        if (idle && now == 0)
            now = ferry_time_ms();
        uint64_t last = atomic_load(&conn->last_activity_ms);
        if (idle && now > last && now - last >= idle_timeout / 2)
            conn_retire_idle_locked(conn, retired_p);
        closed |= conn->closed_idle;
        busy |= !empty;
    }
    if (!closed || busy)
        return 0;
    for (unsigned i = 0; i < peer->n_conns; i++) {
        if (!peer->conns[i].dead)
            conn_retire_idle_locked(&peer->conns[i], retired_p);
    }
    return 1;
}

typedef enum queue_result {
    QUEUED,
    QUEUE_FAILED,   /* the peer failed: none queued */
    QUEUE_REPLACED, /* the peer was idle and is out of the table: none queued, connect afresh */
} queue_result_t;

/* Queue every slice on the peer's live connections, or none. */
static queue_result_t peer_queue(ferry_tcp_t *tcp, ferry_tcp_peer_t *peer, ferry_slice_t *slices)
{
    /* All connections locked at once: every slice is queued or, if the
     * peer died meanwhile, none is. */
    for (unsigned i = 0; i < peer->n_conns; i++)
        pthread_mutex_lock(&peer->conns[i].lock);
    uint64_t retired = 0; /* connections closed here (n_conns <= 64) */
    queue_result_t result = QUEUED;
    if (atomic_load(&peer->failing))
        result = QUEUE_FAILED;
    else if (peer_check_idle_locked(peer, &retired))
        result = QUEUE_REPLACED;
    ferry_tcp_conn_t *first_live = NULL;
    for (unsigned i = 0; i < peer->n_conns && first_live == NULL; i++)
        first_live = peer->conns[i].dead ? NULL : &peer->conns[i];
    if (first_live == NULL && result == QUEUED) /* dead without a failure: not seen */
        result = QUEUE_FAILED;
    uint64_t wake = 0; /* connections given work */
    for (ferry_slice_t *s = slices, *next; s != NULL && result == QUEUED; s = next) {
        next = s->next;
        s->next = NULL;
        ferry_tcp_conn_t *best = first_live;
        for (unsigned i = 0; i < peer->n_conns; i++) {
            ferry_tcp_conn_t *conn = &peer->conns[i];
            if (!conn->dead && atomic_load(&conn->outstanding) < atomic_load(&best->outstanding))
                best = conn;
        }
        atomic_fetch_add(&best->outstanding, s->length);
        if (best->queue_tail != NULL)
            best->queue_tail->next = s;
        else
            best->queue_head = s;
        best->queue_tail = s;
        wake |= 1ull << best->index;
    }
    for (unsigned i = 0; i < peer->n_conns; i++) {
        if (wake & (1ull << i))
            pthread_cond_signal(&peer->conns[i].wakeup);
        pthread_mutex_unlock(&peer->conns[i].lock);
    }
    for (unsigned i = 0; i < peer->n_conns; i++) {
        if (retired & (1ull << i)) /* the receiver wakes and leaves; no slice was on it */
            shutdown(peer->conns[i].fd, SHUT_RDWR);
    }
    if (result != QUEUED) {
        pthread_mutex_lock(&tcp->lock);
        peer_retire_locked(tcp, peer); /* this submit was told; the next connects afresh */
        pthread_mutex_unlock(&tcp->lock);
    }
    return result;
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
    /* A peer replaced for being idle is connected afresh once; a second
     * replacement in a row would be a target closing new connections. */
    for (int attempt = 0;; attempt++) {
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
        queue_result_t result = peer_queue(tcp, peer, slices);
        peer_unref(peer);
        if (result == QUEUED)
            return FERRY_OK;
        if (result == QUEUE_FAILED || attempt > 0)
            return FERRY_ERR_PEER_FAILED;
        ferry_debug("tcp: %s was idle; connecting afresh", desc->endpoint);
    }
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
    ferry_tcp_peer_t *peer;
    pthread_mutex_lock(&tcp->lock);
    for (;;) {
        ferry_tcp_peer_t **slot = table_slot(tcp, desc->endpoint, desc->generation);
        peer = *slot;
        if (peer == NULL || peer->state != FERRY_TCP_PEER_CONNECTING)
            break;
        pthread_cond_wait(&tcp->settled, &tcp->lock); /* then look again */
    }
    if (peer != NULL) {
        *table_slot(tcp, desc->endpoint, desc->generation) = peer->next;
        peer->state = FERRY_TCP_PEER_GONE;
    }
    pthread_mutex_unlock(&tcp->lock);
    if (peer != NULL) {
        ferry_debug("tcp: forgetting %s (generation %016llx)", peer->endpoint,
                    (unsigned long long)peer->generation);
        peer_stop(peer);
    }
    reap_graveyard(tcp, 0);
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
    pthread_mutex_unlock(&tcp->lock);
    while (all != NULL) {
        ferry_tcp_peer_t *next = all->next;
        peer_stop(all);
        all = next;
    }
    reap_graveyard(tcp, 1);
}
