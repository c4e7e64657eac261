/*
 * tcp target side: the listener and the accepted connections, served by
 * the I/O threads (tcp_worker.c) as state machines over non-blocking
 * sockets.
 *
 * Requests on a connection are served in order, straight between the socket
 * and the engine's registered memory, and only inside a range that
 * access_acquire granted.  Whatever an initiator sends, the worst it gets is
 * an error status or a closed connection.
 *
 * What one client can hold is bounded: the HELLO must arrive within
 * CONNECT_TIMEOUT and a request header within TIMEOUT of its first byte
 * (deadlines, so trickling bytes does not stretch them), a request whose
 * payload stops moving for TIMEOUT closes (its access released), an idle
 * connection closes after IDLE_TIMEOUT, and the caps on connections evict
 * the idle ones (tcp.h), so idle connections, however many, never lock out
 * an initiator.
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define REFUSED_WARN_INTERVAL_MS 10000
/* What one connection may move or serve per event before the others of its
 * thread get a turn (level-triggered epoll calls it again). */
#define BUDGET_BYTES (4u << 20)
#define BUDGET_REQUESTS 64
#define ACCEPTS_PER_EVENT 64
#define ACCEPT_PAUSE_MS 100

typedef enum step {
    STEP_AGAIN, /* go on */
    STEP_WAIT,  /* the socket would block: wait for the next event */
    STEP_CLOSE,
} step_t;

/* ---------------- closing ---------------- */

/* On the connection's thread: access released, out of every list, closed, freed. */
static void target_close(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_t *tcp = conn->tcp;
    if (conn->token != NULL)
        tcp->svc.access_release(tcp->svc.engine, conn->token);
    pthread_mutex_lock(&tcp->target_lock);
    if (conn->linked) {
        for (ferry_tcp_target_conn_t **pp = &tcp->target_conns; *pp != NULL; pp = &(*pp)->next) {
            if (*pp == conn) {
                *pp = conn->next;
                break;
            }
        }
        conn->linked = 0;
        tcp->n_target_conns--;
    }
    pthread_mutex_unlock(&tcp->target_lock);
    ferry_tcp_worker_t *worker = conn->worker;
    if (conn->wprev != NULL)
        conn->wprev->wnext = conn->wnext;
    else
        worker->targets = conn->wnext;
    if (conn->wnext != NULL)
        conn->wnext->wprev = conn->wprev;
    epoll_ctl(worker->epfd, EPOLL_CTL_DEL, conn->fd, NULL);
    close(conn->fd); /* the peer sees EOF now */
    ferry_tcp_storage_free(conn);
    free(conn);
}

static void set_interest(ferry_tcp_target_conn_t *conn, int want_out)
{
    if (conn->want_out == want_out)
        return;
    conn->want_out = want_out;
    ferry_tcp_worker_watch(conn->worker, EPOLL_CTL_MOD, conn->fd, want_out ? EPOLLOUT : EPOLLIN,
                           &conn->handler);
}

/* The connection's thread takes it out of HELLO or IDLE; 0: the listener
 * evicted it first. */
static int claim(ferry_tcp_target_conn_t *conn, int from)
{
    int expected = from;
    return atomic_compare_exchange_strong(&conn->state, &expected, FERRY_TCP_TARGET_BUSY);
}

static step_t io_step(ssize_t rc)
{
    if (rc == 0)
        return STEP_CLOSE;
    if (errno == EINTR)
        return STEP_AGAIN;
    return errno == EAGAIN || errno == EWOULDBLOCK ? STEP_WAIT : STEP_CLOSE;
}

/* ---------------- responses ---------------- */

/* The pending responses (and data after them, if any) are sent next. */
static void start_send(ferry_tcp_target_conn_t *conn, const void *data, size_t length)
{
    int n = 0;
    if (conn->out_len > conn->out_pos)
        conn->tx_iov[n++] =
            (struct iovec){conn->out + conn->out_pos, conn->out_len - conn->out_pos};
    if (length > 0)
        conn->tx_iov[n++] = (struct iovec){(void *)data, length};
    conn->tx_msg = (struct msghdr){.msg_iov = conn->tx_iov, .msg_iovlen = (size_t)n};
    conn->phase = FERRY_TCP_PHASE_SEND;
}

static void append_response(ferry_tcp_target_conn_t *conn, ferry_status_t status)
{
    ferry_tcp_encode_response(conn->out + conn->out_len, conn->id, status);
    conn->out_len += FERRY_TCP_RESPONSE_SIZE;
}

/* Responses to small requests wait for the next header; a full buffer or a
 * large request sends them now. */
static void respond(ferry_tcp_target_conn_t *conn, ferry_status_t status, uint64_t length)
{
    append_response(conn, status);
    conn->phase = FERRY_TCP_PHASE_HEADER;
    if (conn->out_len == sizeof(conn->out) || length > FERRY_TCP_COALESCE_MAX)
        start_send(conn, NULL, 0);
}

/* What can leave without waiting: no response waits while a large payload arrives. */
static void try_flush(ferry_tcp_target_conn_t *conn)
{
    if (conn->out_len == conn->out_pos)
        return;
    ssize_t sent = send(conn->fd, conn->out + conn->out_pos, conn->out_len - conn->out_pos,
                        MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0)
        conn->out_pos += (size_t)sent;
    if (conn->out_pos == conn->out_len)
        conn->out_pos = conn->out_len = 0;
}

/* Blocking-style, for a device READ whose answer must go first. */
static ferry_status_t flush_sync(ferry_tcp_target_conn_t *conn)
{
    ferry_status_t status = ferry_tcp_sync_send(conn->fd, conn->out + conn->out_pos,
                                                conn->out_len - conn->out_pos,
                                                conn->tcp->settings.timeout_ms);
    conn->out_pos = conn->out_len = 0;
    return status;
}

/* A storage READ's bytes, from the file to the socket (tcp_storage.c). */
static step_t sendfile_step(ferry_tcp_target_conn_t *conn, size_t *budget_p)
{
    ssize_t sent = ferry_tcp_storage_send(conn, FERRY_MAX(*budget_p, (size_t)1));
    if (sent < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            set_interest(conn, 1);
            return STEP_WAIT;
        }
        if (errno == EINTR)
            return STEP_AGAIN;
        ferry_info("tcp: a served %llu-byte storage READ: sendfile: %s; closing",
                   (unsigned long long)conn->length, strerror(errno));
        return STEP_CLOSE;
    }
    if (sent == 0) {
        /* Its answer left already: only closing fails the READ at the peer. */
        ferry_error("tcp: the file ended during a served %llu-byte storage READ; closing",
                    (unsigned long long)conn->length);
        return STEP_CLOSE;
    }
    conn->progress_ms = ferry_time_ms();
    *budget_p -= FERRY_MIN(*budget_p, (size_t)sent);
    return STEP_AGAIN;
}

static step_t send_step(ferry_tcp_target_conn_t *conn, size_t *budget_p)
{
    if (conn->tx_msg.msg_iovlen > 0) {
        /* a storage READ's bytes follow in the same segments */
        int more = conn->file_left > 0 ? MSG_MORE : 0;
        ssize_t sent = sendmsg(conn->fd, &conn->tx_msg, MSG_NOSIGNAL | MSG_DONTWAIT | more);
        if (sent < 0) {
            if (errno == EFAULT && conn->file_mapped != NULL) /* its answer left already */
                ferry_error("tcp: the file ended during a served %llu-byte storage READ; "
                            "closing", (unsigned long long)conn->length);
            step_t step = io_step(sent);
            if (step == STEP_WAIT)
                set_interest(conn, 1);
            return step;
        }
        conn->progress_ms = ferry_time_ms();
        *budget_p -= FERRY_MIN(*budget_p, (size_t)sent);
        ferry_net_iov_advance(&conn->tx_msg, (size_t)sent);
        if (conn->tx_msg.msg_iovlen > 0)
            return STEP_AGAIN;
    }
    if (conn->file_left > 0) {
        step_t step = sendfile_step(conn, budget_p);
        if (step != STEP_AGAIN || conn->file_left > 0)
            return step;
    }
    conn->out_pos = conn->out_len = 0;
    conn->file_fd = -1;
    conn->file_mapped = NULL;
    if (conn->token != NULL) { /* a READ's data left */
        conn->tcp->svc.access_release(conn->tcp->svc.engine, conn->token);
        conn->token = NULL;
    }
    conn->phase = FERRY_TCP_PHASE_HEADER;
    set_interest(conn, 0);
    return STEP_AGAIN;
}

/* ---------------- the HELLO ---------------- */

static void send_ack(ferry_tcp_target_conn_t *conn, ferry_status_t status)
{
    unsigned char ack[FERRY_TCP_ACK_SIZE];
    const ferry_tcp_settings_t *settings = &conn->tcp->settings;
    ferry_tcp_encode_ack(ack, status, settings->idle_timeout_ms, conn->tcp->svc.generation,
                         settings->max_slice);
    /* 32 bytes into a fresh socket's buffer: never short */
    (void)ferry_tcp_sync_send(conn->fd, ack, sizeof(ack), settings->connect_timeout_ms);
}

/* The whole HELLO is in buf: generation check, HELLO_ACK. */
static step_t greet(ferry_tcp_target_conn_t *conn, const ferry_tcp_hello_t *parsed)
{
    ferry_tcp_t *tcp = conn->tcp;
    uint64_t expected = parsed->expected_generation;
    uint16_t rpc_len = parsed->rpc_len;
    char *rpc = (char *)conn->buf + FERRY_TCP_HELLO_SIZE;
    if (!claim(conn, FERRY_TCP_TARGET_HELLO))
        return STEP_CLOSE;
    if (ferry_tcp_hello_rpc_parse(rpc, rpc_len) != FERRY_OK)
        return STEP_CLOSE;
    if (expected != tcp->svc.generation) {
        ferry_debug("tcp: peer %s expects generation %016llx, this is %016llx", rpc,
                    (unsigned long long)expected, (unsigned long long)tcp->svc.generation);
        send_ack(conn, FERRY_ERR_STALE);
        return STEP_CLOSE;
    }
    /* Before the ACK: the engine must know whom to tell about an unregister
     * before that peer can touch any memory. */
    if (rpc_len > 0 && tcp->svc.peer_seen != NULL)
        tcp->svc.peer_seen(tcp->svc.engine, rpc);
    send_ack(conn, FERRY_OK);
    ferry_debug("tcp: connection from %s accepted", rpc_len ? rpc : "(no rpc endpoint)");
    conn->phase = FERRY_TCP_PHASE_HEADER;
    conn->got = 0;
    conn->deadline_ms = 0;
    return STEP_AGAIN;
}

static step_t hello_step(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_hello_t parsed = {0};
    size_t need = FERRY_TCP_HELLO_SIZE;
    if (conn->got >= FERRY_TCP_HELLO_SIZE) {
        (void)ferry_tcp_hello_parse(conn->buf, &parsed); /* passed once already */
        need += parsed.rpc_len;
    }
    if (conn->got < need) {
        ssize_t got = recv(conn->fd, conn->buf + conn->got, need - conn->got, MSG_DONTWAIT);
        if (got <= 0) {
            step_t step = io_step(got);
            if (step == STEP_CLOSE)
                ferry_debug("tcp: connection closed before its HELLO");
            return step;
        }
        conn->got += (size_t)got;
        if (conn->got < need)
            return STEP_AGAIN;
    }
    if (need == FERRY_TCP_HELLO_SIZE) {
        ferry_status_t status = ferry_tcp_hello_parse(conn->buf, &parsed);
        if (status == FERRY_ERR_UNSUPPORTED)
            send_ack(conn, FERRY_ERR_UNSUPPORTED);
        if (status != FERRY_OK)
            return STEP_CLOSE;
        if (parsed.rpc_len > 0)
            return STEP_AGAIN; /* now the rpc bytes */
    }
    return greet(conn, &parsed);
}

/* ---------------- requests ---------------- */

/* Device memory (a registered GPU buffer): the payload goes through the
 * engine's page-locked buffers, synchronously on this thread (tcp.h). */
typedef struct staged_recv {
    int fd;
    unsigned timeout_ms;
    size_t received;
    int socket_failed;
} staged_recv_t;

static ferry_status_t recv_staged(void *arg, void *buffer, size_t length)
{
    staged_recv_t *in = arg;
    ferry_status_t status = ferry_tcp_sync_recv(in->fd, buffer, length, in->timeout_ms);
    in->received += status == FERRY_OK ? length : 0;
    in->socket_failed = status != FERRY_OK;
    return status;
}

static ferry_status_t send_staged(void *arg, const void *buffer, size_t length)
{
    ferry_tcp_target_conn_t *conn = arg;
    return ferry_tcp_sync_send(conn->fd, buffer, length, conn->tcp->settings.timeout_ms);
}

/* A WRITE into device memory.  A failed device copy leaves the socket
 * where it was: the rest of the payload is drained (conn->moved says how
 * far) and conn->granted says what the initiator hears. */
static step_t write_device(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_t *tcp = conn->tcp;
    staged_recv_t in = {.fd = conn->fd, .timeout_ms = tcp->settings.timeout_ms};
    ferry_status_t status =
        tcp->svc.stage_in(tcp->svc.engine, conn->token, (void *)(uintptr_t)conn->addr,
                          (size_t)conn->length, recv_staged, &in);
    tcp->svc.access_release(tcp->svc.engine, conn->token);
    conn->token = NULL;
    if (status == FERRY_OK) {
        respond(conn, FERRY_OK, conn->length);
        return STEP_AGAIN;
    }
    if (in.socket_failed)
        return STEP_CLOSE;
    ferry_error("tcp: a %llu-byte WRITE into device memory at 0x%llx failed: %s",
                (unsigned long long)conn->length, (unsigned long long)conn->addr,
                ferry_status_string(status));
    conn->granted = status < 0 ? status : FERRY_ERR_IO;
    conn->moved = in.received;
    conn->phase = FERRY_TCP_PHASE_DRAIN;
    return STEP_AGAIN;
}

/* A READ of device memory.  The answer goes first: a device copy that
 * fails later in the stream can only close the connection (the peer fails
 * the READ). */
static step_t read_device(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_t *tcp = conn->tcp;
    append_response(conn, FERRY_OK);
    ferry_status_t status = flush_sync(conn);
    if (status == FERRY_OK)
        status = tcp->svc.stage_out(tcp->svc.engine, conn->token,
                                    (const void *)(uintptr_t)conn->addr, (size_t)conn->length,
                                    send_staged, conn);
    tcp->svc.access_release(tcp->svc.engine, conn->token);
    conn->token = NULL;
    conn->phase = FERRY_TCP_PHASE_HEADER;
    return status == FERRY_OK ? STEP_AGAIN : STEP_CLOSE;
}

/* A READ of storage the kernel sends (tcp_storage.c): a file cut short
 * since its registration fails the READ before its answer goes. */
static step_t read_file(ferry_tcp_target_conn_t *conn)
{
    ferry_status_t status = ferry_tcp_storage_check(conn);
    if (status != FERRY_OK) {
        conn->tcp->svc.access_release(conn->tcp->svc.engine, conn->token);
        conn->token = NULL;
        conn->file_fd = -1;
        conn->file_left = 0;
        respond(conn, status, 0);
        return STEP_AGAIN;
    }
    /* pending responses, this one and, when mapped, the bytes in one
     * sendmsg; else sendfile after it */
    append_response(conn, FERRY_OK);
    start_send(conn, conn->file_mapped, conn->file_mapped != NULL ? (size_t)conn->length : 0);
    return STEP_AGAIN;
}

/* A WRITE into storage the kernel writes (tcp_storage.c): received into
 * its mapping like memory, or spliced (or received) into the file.  A file
 * cut short since its registration fails it before a byte lands (a write
 * must not grow the file back, whichever path it takes). */
static step_t write_file(ferry_tcp_target_conn_t *conn)
{
    ferry_status_t status = ferry_tcp_storage_check(conn);
    conn->phase = FERRY_TCP_PHASE_PAYLOAD;
    if (conn->file_mapped_writable != NULL)
        conn->file_fd = -1; /* the payload goes to the mapping */
    if (status != FERRY_OK) {
        conn->tcp->svc.access_release(conn->tcp->svc.engine, conn->token);
        conn->token = NULL;
        conn->file_fd = -1;
        conn->file_mapped_writable = NULL;
        conn->granted = status;
        conn->phase = FERRY_TCP_PHASE_DRAIN;
    }
    return STEP_AGAIN;
}

/* A whole header is in buf. */
static step_t serve_start(ferry_tcp_target_conn_t *conn)
{
    ferry_tcp_t *tcp = conn->tcp;
    ferry_tcp_request_t request;
    if (ferry_tcp_request_parse(conn->buf, tcp->settings.max_slice, &request) != FERRY_OK)
        return STEP_CLOSE;
    unsigned op = request.op;
    uint64_t addr = request.addr, length = request.length;
    conn->op = op;
    conn->id = request.id;
    conn->addr = addr;
    conn->length = length;
    conn->moved = 0;
    conn->file_fd = -1;
    conn->file_left = 0;
    conn->file_mapped = NULL;
    conn->file_mapped_writable = NULL;
    conn->progress_ms = ferry_time_ms();

    if (op == FERRY_TCP_OP_WRITE && length > FERRY_TCP_COALESCE_MAX)
        try_flush(conn); /* not held while a large payload arrives */

    void *token = NULL;
    /* a storage buffer comes as "device" memory: staged through its file */
    ferry_access_t access = (op == FERRY_TCP_OP_WRITE ? FERRY_ACCESS_WRITE : FERRY_ACCESS_READ) |
                            FERRY_ACCESS_STORAGE;
    ferry_status_t granted = FERRY_ERR_OUT_OF_RANGE;
    if (addr + length > addr) /* no wrap-around: a range the engine can judge */
        granted = tcp->svc.access_acquire(tcp->svc.engine, addr, length, access, &token);
    if (granted > 0) /* only errors travel back; anything else is a refusal */
        granted = FERRY_ERR_REMOTE_REFUSED;
    if (granted != FERRY_OK)
        ferry_debug("tcp: refused %s of %llu bytes at 0x%llx: %s",
                    op == FERRY_TCP_OP_WRITE ? "WRITE" : "READ", (unsigned long long)length,
                    (unsigned long long)addr, ferry_status_string(granted));
    conn->granted = granted;
    conn->token = granted == FERRY_OK ? token : NULL;

    int device = granted == FERRY_OK && tcp->svc.access_is_device(tcp->svc.engine, token);
    if (device && ferry_tcp_storage_open(conn))
        return op == FERRY_TCP_OP_READ ? read_file(conn) : write_file(conn);
    if (op == FERRY_TCP_OP_WRITE) {
        if (device)
            return write_device(conn);
        conn->phase = granted == FERRY_OK ? FERRY_TCP_PHASE_PAYLOAD : FERRY_TCP_PHASE_DRAIN;
    } else if (device) {
        return read_device(conn);
    } else if (granted == FERRY_OK) {
        /* pending responses, this one and the data: one sendmsg */
        append_response(conn, FERRY_OK);
        start_send(conn, (const void *)(uintptr_t)addr, (size_t)length);
    } else {
        respond(conn, granted, 0);
    }
    return STEP_AGAIN;
}

/* A storage WRITE's pending bytes to the file.  A failure ends the
 * access: the rest of the payload is drained and the initiator hears the
 * error. */
static void flush_file(ferry_tcp_target_conn_t *conn)
{
    ferry_status_t status = ferry_tcp_storage_flush(conn);
    if (status == FERRY_OK)
        return;
    conn->granted = status;
    conn->tcp->svc.access_release(conn->tcp->svc.engine, conn->token);
    conn->token = NULL;
    conn->file_fd = -1;
    conn->phase = FERRY_TCP_PHASE_DRAIN;
}

/* A WRITE's payload: into memory (granted), through a pipe or chunk into
 * a storage file (tcp_storage.c), or into the thread's scratch (refused,
 * so the stream stays in step). */
static step_t payload_step(ferry_tcp_target_conn_t *conn, size_t *budget_p)
{
    int into_file = conn->phase == FERRY_TCP_PHASE_PAYLOAD && conn->file_fd >= 0;
    int into_memory = conn->phase == FERRY_TCP_PHASE_PAYLOAD && !into_file;
    size_t want = (size_t)(conn->length - conn->moved);
    want = FERRY_MIN(want, FERRY_MAX(*budget_p, (size_t)1));
    /* storage's mapping, or the memory itself */
    char *base = conn->file_mapped_writable ? conn->file_mapped_writable
                                            : (char *)(uintptr_t)conn->addr;
    void *dst = base + conn->moved;
    if (!into_memory && !into_file) {
        want = FERRY_MIN(want, (size_t)FERRY_TCP_SCRATCH);
        dst = conn->worker->scratch;
    }
    ssize_t got = into_file ? ferry_tcp_storage_recv(conn, want)
                            : recv(conn->fd, dst, want, MSG_DONTWAIT);
    if (got <= 0) {
        if (got < 0 && errno == EFAULT && conn->file_mapped_writable != NULL)
            ferry_error("tcp: the file ended during a served %llu-byte storage WRITE; "
                        "closing", (unsigned long long)conn->length);
        step_t step = io_step(got);
        /* nothing more for now: the file gets what came while the sender
         * refills the socket (a full pipe says EAGAIN too: emptied here) */
        if (step == STEP_WAIT && into_file && conn->pending > 0) {
            flush_file(conn);
            step = STEP_AGAIN;
        }
        if (step == STEP_CLOSE)
            ferry_info("tcp: a peer closed its connection during a %llu-byte WRITE",
                       (unsigned long long)conn->length);
        return step;
    }
    conn->moved += (uint64_t)got;
    conn->progress_ms = ferry_time_ms();
    *budget_p -= FERRY_MIN(*budget_p, (size_t)got);
    if (into_file && (conn->pending == conn->pending_max || conn->moved == conn->length))
        flush_file(conn);
    if (conn->moved < conn->length)
        return STEP_AGAIN;
    conn->file_fd = -1;
    conn->file_mapped_writable = NULL;
    if (conn->token != NULL) {
        conn->tcp->svc.access_release(conn->tcp->svc.engine, conn->token);
        conn->token = NULL;
    }
    respond(conn, conn->granted, conn->length);
    return STEP_AGAIN;
}

/* Wait for the next request header; pending responses leave as soon as we
 * would wait. */
static step_t header_step(ferry_tcp_target_conn_t *conn, unsigned *requests_p)
{
    if (conn->got == 0 && atomic_load(&conn->state) != FERRY_TCP_TARGET_BUSY &&
        !claim(conn, FERRY_TCP_TARGET_IDLE))
        return STEP_CLOSE; /* evicted */
    ssize_t got = recv(conn->fd, conn->buf + conn->got, FERRY_TCP_REQUEST_SIZE - conn->got,
                       MSG_DONTWAIT);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) && conn->got == 0) {
        if (conn->out_len > conn->out_pos) {
            start_send(conn, NULL, 0);
            return STEP_AGAIN;
        }
        uint64_t now = ferry_time_ms();
        conn->idle_since_ms = now;
        atomic_store(&conn->idle_ms, now);
        atomic_store(&conn->state, FERRY_TCP_TARGET_IDLE);
        return STEP_WAIT;
    }
    if (got <= 0) {
        step_t step = io_step(got);
        if (step == STEP_CLOSE)
            ferry_debug("tcp: connection ended between requests");
        return step;
    }
    if (conn->got == 0 && conn->tcp->settings.timeout_ms != 0)
        conn->deadline_ms = ferry_time_ms() + conn->tcp->settings.timeout_ms;
    conn->got += (size_t)got;
    if (conn->got < FERRY_TCP_REQUEST_SIZE)
        return STEP_AGAIN;
    conn->got = 0;
    conn->deadline_ms = 0;
    ++*requests_p;
    return serve_start(conn);
}

static void target_event(ferry_tcp_handler_t *handler, uint32_t events)
{
    (void)events;
    ferry_tcp_target_conn_t *conn = (ferry_tcp_target_conn_t *)handler;
    size_t budget = BUDGET_BYTES;
    unsigned requests = 0;
    step_t step = STEP_AGAIN;
    while (step == STEP_AGAIN && budget > 0 && requests < BUDGET_REQUESTS) {
        switch (conn->phase) {
        case FERRY_TCP_PHASE_HELLO: step = hello_step(conn); break;
        case FERRY_TCP_PHASE_HEADER: step = header_step(conn, &requests); break;
        case FERRY_TCP_PHASE_PAYLOAD:
        case FERRY_TCP_PHASE_DRAIN: step = payload_step(conn, &budget); break;
        case FERRY_TCP_PHASE_SEND: step = send_step(conn, &budget); break;
        }
    }
    if (step == STEP_CLOSE) {
        target_close(conn);
        return;
    }
    /* The budget spent: EPOLLOUT (a writable socket reports it at once)
     * brings us back even when nothing more arrives, e.g. with responses
     * to send.  Waiting for input: EPOLLIN (a SEND waits on EPOLLOUT). */
    if (step == STEP_AGAIN)
        set_interest(conn, 1);
    else if (conn->phase != FERRY_TCP_PHASE_SEND)
        set_interest(conn, 0);
}

/* ---------------- timers ---------------- */

void ferry_tcp_target_tick(ferry_tcp_worker_t *worker, uint64_t now)
{
    ferry_tcp_t *tcp = worker->tcp;
    const ferry_tcp_settings_t *settings = &tcp->settings;
    if (worker->index == 0 && tcp->accept_resume_ms != 0 && now >= tcp->accept_resume_ms) {
        tcp->accept_resume_ms = 0;
        ferry_tcp_worker_watch(worker, EPOLL_CTL_MOD, tcp->listen_fd, EPOLLIN,
                               &tcp->listen_handler);
    }
    for (ferry_tcp_target_conn_t *conn = worker->targets, *next; conn != NULL; conn = next) {
        next = conn->wnext;
        int close_it = 0;
        switch (conn->phase) {
        case FERRY_TCP_PHASE_HELLO:
            if ((close_it = conn->deadline_ms != 0 && now >= conn->deadline_ms))
                ferry_debug("tcp: connection closed before its HELLO: %s",
                            ferry_status_string(FERRY_ERR_TIMEOUT));
            break;
        case FERRY_TCP_PHASE_HEADER:
            if (conn->got > 0) {
                if ((close_it = conn->deadline_ms != 0 && now >= conn->deadline_ms))
                    ferry_warn("tcp: a peer did not complete a request header within %u ms; "
                               "closing", settings->timeout_ms);
            } else if (atomic_load(&conn->state) == FERRY_TCP_TARGET_IDLE &&
                       settings->idle_timeout_ms != 0 &&
                       now - conn->idle_since_ms >= settings->idle_timeout_ms) {
                ferry_debug("tcp: closing a connection idle for %u ms", settings->idle_timeout_ms);
                close_it = 1;
            }
            break;
        default:
            if ((close_it = settings->timeout_ms != 0 &&
                            now - conn->progress_ms >= settings->timeout_ms))
                ferry_warn("tcp: a peer stopped moving data during a %llu-byte %s; closing",
                           (unsigned long long)conn->length,
                           conn->op == FERRY_TCP_OP_WRITE ? "WRITE" : "READ");
            break;
        }
        if (close_it)
            target_close(conn);
    }
}

/* ---------------- accepting ---------------- */

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

/* Room for a connection from source; an evicted one is out of the list and
 * shut down, for its thread to close.  0: the caps are reached and nothing
 * in the way is idle.  target_lock held. */
static int make_room_locked(ferry_tcp_t *tcp, const ferry_net_source_t *source)
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
            /* A request (or HELLO) is in, its thread not yet at it: busy in
             * all but name, so last in the eviction order. */
            atomic_store(&conn->idle_ms, ferry_time_ms());
            continue;
        }
        int state = atomic_load(&conn->state);
        if (is_evictable(state) &&
            atomic_compare_exchange_strong(&conn->state, &state, FERRY_TCP_TARGET_EVICTED)) {
            *pp = conn->next;
            conn->linked = 0;
            tcp->n_target_conns--;
            /* Still under the lock its thread takes before closing the fd. */
            ferry_debug("tcp: evicting the connection idle longest for a new one");
            shutdown(conn->fd, SHUT_RDWR);
            return 1;
        }
    }
    warn_refused(tcp, from ? "too many connections from one address, none idle"
                           : "all connections busy");
    return 0;
}

/* On the connection's thread: it joins that thread's epoll set. */
static void target_adopt(void *arg)
{
    ferry_tcp_target_conn_t *conn = arg;
    ferry_tcp_worker_t *worker = conn->worker;
    conn->wnext = worker->targets;
    if (worker->targets != NULL)
        worker->targets->wprev = conn;
    worker->targets = conn;
    unsigned connect_timeout = conn->tcp->settings.connect_timeout_ms;
    conn->deadline_ms = connect_timeout ? ferry_time_ms() + connect_timeout : 0;
    if (ferry_tcp_worker_watch(worker, EPOLL_CTL_ADD, conn->fd, EPOLLIN, &conn->handler) != 0)
        target_close(conn);
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
    conn->handler.on_event = target_event;
    conn->tcp = tcp;
    conn->fd = fd;
    conn->file_fd = -1;
    conn->pipe_fds[0] = conn->pipe_fds[1] = -1;
    conn->phase = FERRY_TCP_PHASE_HELLO;
    atomic_init(&conn->state, FERRY_TCP_TARGET_HELLO);
    atomic_init(&conn->idle_ms, ferry_time_ms());
    ferry_net_source_of(addr, &conn->source);
    conn->worker = ferry_tcp_worker_next(tcp);

    pthread_mutex_lock(&tcp->target_lock);
    int room = !tcp->stopping && make_room_locked(tcp, &conn->source);
    if (room) {
        conn->next = tcp->target_conns;
        tcp->target_conns = conn;
        conn->linked = 1;
        tcp->n_target_conns++;
    }
    pthread_mutex_unlock(&tcp->target_lock);
    if (!room) {
        close(fd);
        free(conn);
        return;
    }
    conn->adopt = (ferry_tcp_task_t){.run = target_adopt, .arg = conn};
    ferry_tcp_worker_post(conn->worker, &conn->adopt);
}

static void listen_event(ferry_tcp_handler_t *handler, uint32_t events)
{
    (void)events;
    ferry_tcp_t *tcp = (ferry_tcp_t *)((char *)handler - offsetof(ferry_tcp_t, listen_handler));
    for (int i = 0; i < ACCEPTS_PER_EVENT; i++) {
        struct sockaddr_storage addr;
        socklen_t addrlen = sizeof(addr);
        int fd = accept4(tcp->listen_fd, (struct sockaddr *)&addr, &addrlen,
                         SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
            accept_one(tcp, fd, (const struct sockaddr *)&addr);
            continue;
        }
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* out of descriptors: pause instead of spinning on a readable socket */
            ferry_error("tcp: accept: %s; pausing accepts for %d ms", strerror(errno),
                        ACCEPT_PAUSE_MS);
            tcp->accept_resume_ms = ferry_time_ms() + ACCEPT_PAUSE_MS;
            ferry_tcp_worker_watch(&tcp->workers[0], EPOLL_CTL_MOD, tcp->listen_fd, 0,
                                   &tcp->listen_handler);
        } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                   errno != ECONNABORTED) {
            ferry_warn("tcp: accept: %s", strerror(errno));
        }
        if (errno != EINTR && errno != ECONNABORTED)
            break;
    }
}

ferry_status_t ferry_tcp_target_start(ferry_tcp_t *tcp, const char *host, int *port_p)
{
    ferry_status_t status = ferry_net_listen(host, 0, 128, &tcp->listen_fd, port_p);
    if (status != FERRY_OK)
        return status;
    fcntl(tcp->listen_fd, F_SETFL, fcntl(tcp->listen_fd, F_GETFL) | O_NONBLOCK);
    tcp->listen_handler.on_event = listen_event;
    if (ferry_tcp_worker_watch(&tcp->workers[0], EPOLL_CTL_ADD, tcp->listen_fd, EPOLLIN,
                               &tcp->listen_handler) != 0)
        return FERRY_ERR_NO_RESOURCE; /* ferry_tcp_target_stop closes the listener */
    return FERRY_OK;
}

static void listener_close(void *arg)
{
    ferry_tcp_t *tcp = arg;
    if (tcp->listen_fd < 0)
        return;
    epoll_ctl(tcp->workers[0].epfd, EPOLL_CTL_DEL, tcp->listen_fd, NULL);
    close(tcp->listen_fd);
    tcp->listen_fd = -1;
}

static void targets_close(void *arg)
{
    ferry_tcp_worker_t *worker = arg;
    while (worker->targets != NULL)
        target_close(worker->targets);
}

void ferry_tcp_target_stop(ferry_tcp_t *tcp)
{
    pthread_mutex_lock(&tcp->target_lock);
    tcp->stopping = 1;
    pthread_mutex_unlock(&tcp->target_lock);
    if (tcp->workers == NULL) {
        if (tcp->listen_fd >= 0)
            close(tcp->listen_fd);
        tcp->listen_fd = -1;
        return;
    }
    /* No accepts any more; then each thread ends its connections (the
     * adoptions the listener posted ran before: tasks run in order). */
    ferry_tcp_worker_call(&tcp->workers[0], listener_close, tcp);
    for (unsigned i = 0; i < tcp->n_workers; i++)
        ferry_tcp_worker_call(&tcp->workers[i], targets_close, &tcp->workers[i]);
}
