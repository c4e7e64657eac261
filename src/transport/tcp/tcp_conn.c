/*
 * tcp initiator connection: opened on the submitting thread, then served by
 * one I/O thread as two state machines over a non-blocking socket.
 *
 * Sending: a batch of queued slices (headers and WRITE payloads, straight
 * from the caller's memory) moves to the in-flight FIFO and goes out in one
 * sendmsg, resumed where the socket took less.  Receiving: responses are
 * read 4 KiB at a time through the thread's scratch buffer, a READ's data
 * go straight into the caller's buffer but for what the scratch already
 * holds.  A response can only come after the target read the whole slice,
 * so finishing it while the rest of its batch is still being sent is safe.
 *
 * A connection ends on its thread (conn_close): every slice it still holds
 * is finished with its fail_status, and once closed is set under
 * peer->lock the thread never touches it again.
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

/* Bytes gathered into one sendmsg beyond the first slice. */
#define SEND_BATCH_BYTES (4u << 20)
/* What one connection may move per event before the others of its thread get a turn. */
#define BUDGET_BYTES (4u << 20)
/* Responses are read this much at a time: 256 per recv, while a READ's data
 * past them (but for what came in the same recv) goes straight into the
 * caller's buffer, not through the scratch. */
#define RX_READ_AHEAD 4096u

/* ---------------- connecting ---------------- */

ferry_status_t ferry_tcp_conn_open(ferry_tcp_t *tcp, const ferry_tcp_peer_t *peer, int *fd_p,
                                   uint64_t *max_slice_p, unsigned *idle_timeout_p)
{
    int fd;
    ferry_status_t status = ferry_net_connect(peer->endpoint, tcp->settings.connect_timeout_ms, &fd);
    if (status != FERRY_OK) {
        ferry_warn("tcp: cannot connect to %s: %s", peer->endpoint, ferry_status_string(status));
        return FERRY_ERR_CONNECT;
    }
    ferry_tcp_tune_socket(tcp, fd);
    ferry_net_set_timeout(fd, tcp->settings.connect_timeout_ms);
    const char *rpc = tcp->svc.rpc_endpoint ? tcp->svc.rpc_endpoint : "";
    size_t rpc_len = strlen(rpc);
    if (rpc_len > FERRY_TCP_HELLO_RPC_MAX)
        rpc_len = 0; /* a cut endpoint would be wrong; none only means no notifications */
    unsigned char hello[FERRY_TCP_HELLO_SIZE + FERRY_TCP_HELLO_RPC_MAX];
    unsigned char ack[FERRY_TCP_ACK_SIZE];
    size_t hello_len = ferry_tcp_encode_hello(hello, peer->generation, rpc, rpc_len);
    status = ferry_net_send_all(fd, hello, hello_len);
    if (status == FERRY_OK)
        status = ferry_net_recv_all(fd, ack, sizeof(ack));
    if (status != FERRY_OK) {
        ferry_warn("tcp: HELLO exchange with %s failed: %s", peer->endpoint,
                   ferry_status_string(status));
        close(fd);
        return FERRY_ERR_CONNECT;
    }
    int32_t ack_status = (int32_t)ferry_tcp_get32(ack + 8);
    if (ferry_tcp_get32(ack) != FERRY_TCP_MAGIC || ferry_tcp_get16(ack + 4) != FERRY_TCP_VERSION) {
        ferry_warn("tcp: %s is not a ferry tcp endpoint of wire version %d", peer->endpoint,
                   FERRY_TCP_VERSION);
        status = FERRY_ERR_CONNECT;
    } else if (ack_status == FERRY_ERR_STALE) {
        ferry_debug("tcp: %s is generation %016llx, not %016llx", peer->endpoint,
                    (unsigned long long)ferry_tcp_get64(ack + 16),
                    (unsigned long long)peer->generation);
        status = FERRY_ERR_STALE;
    } else if (ack_status != FERRY_OK) {
        ferry_warn("tcp: %s refused the connection: %s", peer->endpoint,
                   ferry_status_string((ferry_status_t)ack_status));
        status = FERRY_ERR_CONNECT;
    }
    if (status != FERRY_OK) {
        close(fd);
        return status;
    }
    *max_slice_p = ferry_tcp_get64(ack + 24);
    *idle_timeout_p = ferry_tcp_get32(ack + 12);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    *fd_p = fd;
    return FERRY_OK;
}

/* ---------------- finishing and closing ---------------- */

static void finish_all(ferry_tcp_t *tcp, ferry_slice_t *list, ferry_status_t status)
{
    while (list != NULL) {
        ferry_slice_t *next = list->next;
        list->next = NULL;
        tcp->svc.slice_done(list, status);
        list = next;
    }
}

/* On the connection's thread, at most once. */
static void conn_close(ferry_tcp_conn_t *conn)
{
    ferry_tcp_peer_t *peer = conn->peer;
    ferry_tcp_t *tcp = peer->tcp;
    ferry_tcp_worker_t *worker = conn->worker;
    pthread_mutex_lock(&peer->lock);
    /* queued slices were never sent; in-flight ones are lost with the socket */
    ferry_slice_t *left = conn->rx_read;
    ferry_slice_t **tail = &left;
    if (left != NULL)
        tail = &left->next;
    *tail = conn->inflight_head;
    if (conn->inflight_tail != NULL)
        tail = &conn->inflight_tail->next;
    *tail = conn->queue_head;
    conn->rx_read = NULL;
    conn->inflight_head = conn->inflight_tail = conn->queue_head = conn->queue_tail = NULL;
    peer->outstanding -= conn->outstanding;
    conn->outstanding = 0;
    ferry_status_t status = conn->fail_status != FERRY_OK ? conn->fail_status : FERRY_ERR_PEER_FAILED;
    if (conn->registered) {
        epoll_ctl(worker->epfd, EPOLL_CTL_DEL, conn->fd, NULL);
        if (conn->wprev != NULL)
            conn->wprev->wnext = conn->wnext;
        else
            worker->conns = conn->wnext;
        if (conn->wnext != NULL)
            conn->wnext->wprev = conn->wprev;
        conn->registered = 0;
    }
    close(conn->fd);
    conn->fd = -1;
    conn->dead = conn->closed = 1;
    peer->n_open--;
    pthread_cond_broadcast(&peer->changed);
    pthread_mutex_unlock(&peer->lock);
    /* conn may be freed from here on */

    pthread_mutex_lock(&tcp->lock);
    tcp->conns_open--;
    pthread_cond_broadcast(&tcp->settled);
    pthread_mutex_unlock(&tcp->lock);
    finish_all(tcp, left, status);
    ferry_tcp_peer_unref(peer);
}

/* ---------------- sending ---------------- */

typedef struct staged_send {
    int fd;
    unsigned timeout_ms;
} staged_send_t;

/* Device memory (a slice with local_device): the payload goes through the
 * engine's page-locked buffers, synchronously on this thread (tcp.h). */
static ferry_status_t send_staged(void *arg, const void *buffer, size_t length)
{
    staged_send_t *out = arg;
    return ferry_tcp_sync_send(out->fd, buffer, length, out->timeout_ms);
}

/* The next batch off the queue into the in-flight FIFO; 0 when the queue is
 * empty (EPOLLOUT is then disarmed).  peer->lock held. */
static int batch_start_locked(ferry_tcp_conn_t *conn)
{
    if (conn->queue_head == NULL) {
        if (conn->out_armed) {
            conn->out_armed = 0;
            ferry_tcp_worker_watch(conn->worker, EPOLL_CTL_MOD, conn->fd, EPOLLIN,
                                   &conn->handler);
        }
        return 0;
    }
    /* The quiet-time clock restarts under the lock the stall check takes,
     * so an old timestamp never meets a new slice. */
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

        int write = slice->opcode == FERRY_OP_WRITE;
        ferry_tcp_encode_request(conn->tx_headers[n], write ? FERRY_TCP_OP_WRITE : FERRY_TCP_OP_READ,
                                 conn->send_seq++, slice->remote_addr, slice->length);
        conn->tx_iov[iovcnt++] = (struct iovec){conn->tx_headers[n++], FERRY_TCP_REQUEST_SIZE};
        if (write && slice->local_device) {
            conn->tx_staged = slice; /* its payload follows this send, through host buffers */
            break;
        }
        if (write) {
            conn->tx_iov[iovcnt++] = (struct iovec){slice->local, slice->length};
            bytes += slice->length;
        }
    }
    conn->tx_msg = (struct msghdr){.msg_iov = conn->tx_iov, .msg_iovlen = (size_t)iovcnt};
    conn->tx_active = 1;
    return 1;
}

static ferry_status_t conn_send(ferry_tcp_conn_t *conn)
{
    ferry_tcp_peer_t *peer = conn->peer;
    size_t budget = BUDGET_BYTES;
    while (budget > 0) {
        if (!conn->tx_active) {
            pthread_mutex_lock(&peer->lock);
            int started = batch_start_locked(conn);
            pthread_mutex_unlock(&peer->lock);
            if (!started)
                return FERRY_OK;
        }
        ssize_t sent = sendmsg(conn->fd, &conn->tx_msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN || errno == EWOULDBLOCK ? FERRY_OK : FERRY_ERR_PEER_FAILED;
        }
        atomic_store_explicit(&conn->last_activity_ms, ferry_time_ms(), memory_order_relaxed);
        budget -= FERRY_MIN(budget, (size_t)sent);
        ferry_net_iov_advance(&conn->tx_msg, (size_t)sent);
        if (conn->tx_msg.msg_iovlen > 0)
            continue;
        conn->tx_active = 0;
        if (conn->tx_staged != NULL) {
            ferry_slice_t *slice = conn->tx_staged;
            ferry_tcp_t *tcp = peer->tcp;
            staged_send_t out = {conn->fd, tcp->settings.timeout_ms};
            conn->tx_staged = NULL;
            ferry_status_t status = tcp->svc.stage_out(tcp->svc.engine, NULL, slice->local,
                                                       slice->length, send_staged, &out);
            if (status != FERRY_OK)
                return status;
            atomic_store(&conn->last_activity_ms, ferry_time_ms());
        }
    }
    return FERRY_OK;
}

/* ---------------- receiving ---------------- */

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

/* The scratch bytes not yet parsed: a READ's data may be among them. */
typedef struct rx_view {
    ferry_tcp_conn_t *conn;
    const unsigned char *data;
    size_t pos, len;
} rx_view_t;

/* A host buffer of a READ into device memory: first what the scratch
 * already holds, then the socket. */
static ferry_status_t recv_staged(void *arg, void *buffer, size_t length)
{
    rx_view_t *rx = arg;
    size_t copied = FERRY_MIN(rx->len - rx->pos, length);
    memcpy(buffer, rx->data + rx->pos, copied);
    rx->pos += copied;
    size_t rest = length - copied;
    if (rest == 0)
        return FERRY_OK;
    ferry_status_t status = ferry_tcp_sync_recv(rx->conn->fd, (unsigned char *)buffer + copied,
                                                rest, rx->conn->peer->tcp->settings.timeout_ms);
    atomic_store(&rx->conn->last_activity_ms, ferry_time_ms());
    return status;
}

/* One response off the FIFO; its slice, or NULL after a protocol error. */
static ferry_slice_t *pop_answered(ferry_tcp_conn_t *conn, uint64_t id, int32_t wire_status)
{
    ferry_tcp_peer_t *peer = conn->peer;
    pthread_mutex_lock(&peer->lock);
    ferry_slice_t *slice = conn->inflight_head;
    if (slice == NULL || id != conn->recv_seq || wire_status > 0) {
        uint64_t expected = conn->recv_seq;
        pthread_mutex_unlock(&peer->lock);
        ferry_warn("tcp: peer %s answered request %llu with status %d, expected %s%llu",
                   peer->endpoint, (unsigned long long)id, (int)wire_status,
                   slice ? "request " : "nothing; ", (unsigned long long)expected);
        return NULL;
    }
    conn->inflight_head = slice->next;
    if (conn->inflight_head == NULL)
        conn->inflight_tail = NULL;
    conn->recv_seq++;
    conn->outstanding -= slice->length;
    peer->outstanding -= slice->length;
    slice->next = NULL;
    pthread_mutex_unlock(&peer->lock);
    return slice;
}

/* Responses in rx->data: finish what they answer.  A READ whose data go on
 * past the scratch becomes conn->rx_read. */
static ferry_status_t parse_responses(ferry_tcp_conn_t *conn, rx_view_t *rx)
{
    ferry_tcp_t *tcp = conn->peer->tcp;
    while (rx->len - rx->pos >= FERRY_TCP_RESPONSE_SIZE) {
        const unsigned char *r = rx->data + rx->pos;
        uint64_t id = ferry_tcp_get64(r);
        int32_t wire_status = (int32_t)ferry_tcp_get32(r + 8);
        rx->pos += FERRY_TCP_RESPONSE_SIZE;
        ferry_slice_t *slice = pop_answered(conn, id, wire_status);
        if (slice == NULL)
            return FERRY_ERR_PROTOCOL;
        ferry_status_t status = map_remote_status(wire_status);
        if (slice->opcode == FERRY_OP_READ && status == FERRY_OK && slice->local_device) {
            ferry_status_t data_status =
                tcp->svc.stage_in(tcp->svc.engine, NULL, slice->local, slice->length, recv_staged, rx);
            if (data_status != FERRY_OK) {
                conn->rx_read = slice; /* the stream is mid-payload: the connection fails */
                return data_status;
            }
        } else if (slice->opcode == FERRY_OP_READ && status == FERRY_OK) {
            /* straight into the caller's buffer, but for what the scratch holds */
            size_t copied = FERRY_MIN(rx->len - rx->pos, slice->length);
            memcpy(slice->local, rx->data + rx->pos, copied);
            rx->pos += copied;
            if (copied < slice->length) {
                conn->rx_read = slice;
                conn->rx_read_got = copied;
                return FERRY_OK;
            }
        }
        tcp->svc.slice_done(slice, status);
    }
    return FERRY_OK;
}

/* Until the socket would block or the budget is spent.  FERRY_ERR_PEER_FAILED
 * on EOF, with *clean_end_p set when it came between responses. */
static ferry_status_t conn_receive(ferry_tcp_conn_t *conn, int *clean_end_p)
{
    ferry_tcp_t *tcp = conn->peer->tcp;
    unsigned char *scratch = conn->worker->scratch;
    size_t budget = BUDGET_BYTES;
    while (budget > 0) {
        ferry_slice_t *reading = conn->rx_read;
        unsigned char *dst = scratch + conn->rx_partial_len;
        size_t want = RX_READ_AHEAD - conn->rx_partial_len;
        if (reading != NULL) {
            dst = (unsigned char *)reading->local + conn->rx_read_got;
            want = FERRY_MIN(reading->length - conn->rx_read_got, budget);
        }
        ssize_t got = recv(conn->fd, dst, want, MSG_DONTWAIT);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return FERRY_OK;
        if (got <= 0) {
            *clean_end_p = got == 0 && reading == NULL && conn->rx_partial_len == 0;
            return FERRY_ERR_PEER_FAILED;
        }
        atomic_store_explicit(&conn->last_activity_ms, ferry_time_ms(), memory_order_relaxed);
        budget -= FERRY_MIN(budget, (size_t)got);
        if (reading != NULL) {
            conn->rx_read_got += (size_t)got;
            if (conn->rx_read_got == reading->length) {
                conn->rx_read = NULL;
                tcp->svc.slice_done(reading, FERRY_OK);
            }
            continue;
        }
        memcpy(scratch, conn->rx_partial, conn->rx_partial_len);
        rx_view_t rx = {conn, scratch, 0, conn->rx_partial_len + (size_t)got};
        conn->rx_partial_len = 0;
        ferry_status_t status = parse_responses(conn, &rx);
        if (status != FERRY_OK)
            return status;
        conn->rx_partial_len = (unsigned)(rx.len - rx.pos); /* < a response; 0 after a READ */
        memcpy(conn->rx_partial, rx.data + rx.pos, conn->rx_partial_len);
    }
    return FERRY_OK;
}

/* ---------------- events, adoption, timers ---------------- */

/* A failure seen on this connection: the target closing it with nothing on
 * it is an idle close, anything else fails the whole peer.  Then it closes. */
static void conn_end(ferry_tcp_conn_t *conn, ferry_status_t status, int clean_end,
                     const char *what)
{
    ferry_tcp_peer_t *peer = conn->peer;
    pthread_mutex_lock(&peer->lock);
    int ours = !conn->dead; /* else a forget, a stop or another connection's failure */
    if (ours && clean_end && !conn->tx_active && conn->queue_head == NULL &&
        conn->inflight_head == NULL) {
        conn->dead = conn->closed_idle = 1;
        conn->fail_status = FERRY_ERR_PEER_FAILED;
        ours = 0;
        ferry_debug("tcp: %s closed idle connection %u", peer->endpoint, conn->index);
    }
    pthread_mutex_unlock(&peer->lock);
    if (ours)
        ferry_tcp_peer_fail(peer, status, what);
    conn_close(conn);
}

static void conn_event(ferry_tcp_handler_t *handler, uint32_t events)
{
    ferry_tcp_conn_t *conn = (ferry_tcp_conn_t *)handler;
    ferry_tcp_peer_t *peer = conn->peer;
    pthread_mutex_lock(&peer->lock);
    int dead = conn->dead;
    pthread_mutex_unlock(&peer->lock);
    if (dead) {
        conn_close(conn);
        return;
    }
    ferry_status_t status = FERRY_OK;
    int clean_end = 0;
    if (events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP))
        status = conn_receive(conn, &clean_end);
    if (status != FERRY_OK) {
        conn_end(conn, status, clean_end, "receiving");
        return;
    }
    if (events & EPOLLOUT)
        status = conn_send(conn);
    if (status != FERRY_OK)
        conn_end(conn, status, 0, "sending");
}

static void conn_adopt_run(void *arg)
{
    ferry_tcp_conn_t *conn = arg;
    ferry_tcp_peer_t *peer = conn->peer;
    ferry_tcp_worker_t *worker = conn->worker;
    pthread_mutex_lock(&peer->lock);
    int ok = !conn->dead;
    if (ok) {
        conn->out_armed = conn->queue_head != NULL;
        ok = ferry_tcp_worker_watch(worker, EPOLL_CTL_ADD, conn->fd,
                                    EPOLLIN | (conn->out_armed ? EPOLLOUT : 0),
                                    &conn->handler) == 0;
    }
    if (ok) {
        conn->registered = 1;
        conn->wprev = NULL;
        conn->wnext = worker->conns;
        if (worker->conns != NULL)
            worker->conns->wprev = conn;
        worker->conns = conn;
    }
    pthread_mutex_unlock(&peer->lock);
    if (!ok)
        conn_end(conn, FERRY_ERR_NO_RESOURCE, 0, "starting");
}

void ferry_tcp_conn_adopt(ferry_tcp_conn_t *conn)
{
    conn->handler.on_event = conn_event;
    conn->adopt = (ferry_tcp_task_t){.run = conn_adopt_run, .arg = conn};
    ferry_tcp_worker_post(conn->worker, &conn->adopt);
}

void ferry_tcp_conn_arm_locked(ferry_tcp_conn_t *conn)
{
    if (!conn->registered || conn->out_armed)
        return;
    conn->out_armed = 1;
    ferry_tcp_worker_watch(conn->worker, EPOLL_CTL_MOD, conn->fd, EPOLLIN | EPOLLOUT,
                           &conn->handler);
}

/*
 * Stall detection: with requests outstanding, a connection that moved no
 * byte either way for TIMEOUT fails its peer.  An idle one is closed at half
 * the target's idle timeout, before the target could close it under a
 * request on its way.  A dead one is closed here too, whatever its events.
 */
void ferry_tcp_conn_tick(ferry_tcp_worker_t *worker, uint64_t now)
{
    unsigned timeout = worker->tcp->settings.timeout_ms;
    for (ferry_tcp_conn_t *conn = worker->conns, *next; conn != NULL; conn = next) {
        next = conn->wnext;
        ferry_tcp_peer_t *peer = conn->peer;
        pthread_mutex_lock(&peer->lock);
        int dead = conn->dead;
        int busy = conn->queue_head != NULL || conn->inflight_head != NULL || conn->tx_active ||
                   conn->rx_read != NULL;
        uint64_t last = atomic_load(&conn->last_activity_ms);
        uint64_t quiet = now > last ? now - last : 0;
        int stalled = !dead && busy && timeout != 0 && quiet >= timeout;
        unsigned idle_timeout = peer->idle_timeout_ms;
        if (!dead && !busy && idle_timeout != 0 && quiet >= idle_timeout / 2) {
            conn->dead = conn->closed_idle = 1;
            conn->fail_status = FERRY_ERR_CANCELED;
            dead = 1;
        }
        pthread_mutex_unlock(&peer->lock);
        if (stalled)
            ferry_tcp_peer_fail(peer, FERRY_ERR_TIMEOUT, "waiting for it");
        else if (dead)
            conn_close(conn);
    }
}
