/*
 * The native TCP transport: private objects and the wire protocol.
 *
 * Threads (tcp_worker.c): IO_THREADS I/O threads per transport instance,
 * each with its own epoll set, serve every socket of the instance: the
 * listener (on thread 0), accepted target connections and initiator
 * connections, spread round-robin.  Sockets are non-blocking; partial
 * reads and writes resume from per-connection state.  The thread count
 * does not depend on the number of peers or connections.  Device memory
 * (stage_in/stage_out) is the exception: its payload moves synchronously
 * on the I/O thread through the engine's staging buffers, each socket wait
 * bounded by TIMEOUT, so other sockets of that thread wait at most that
 * long (device memory over tcp is a fallback, not a fast path).  A storage
 * buffer in the page cache is not: its bytes are sent from and received
 * into the engine's shared mapping of it (or moved by sendfile and
 * splice), in steps on the non-blocking socket like memory
 * (tcp_storage.c); DIRECT or SHARED storage is staged like device memory.
 *
 * Target side (tcp_target.c): requests on a connection are served in
 * order, straight between the socket and registered memory.  At most
 * MAX_CONNS connections, at most MAX_CONNS_PER_SOURCE from one address: a
 * newcomer past either evicts the connection idle longest (of its own
 * address when that cap is the one reached) or is closed when none is
 * idle; a connection idle for IDLE_TIMEOUT closes.  Idle means between
 * requests, every response sent, or still waiting for the HELLO.
 *
 * Initiator side (tcp_peer.c, tcp_conn.c): a table of peers keyed by
 * (endpoint, generation).  A peer starts with one connection and opens
 * another (synchronously, on the submitting thread) when the bytes
 * outstanding to it exceed 2 slices per open connection, up to CONNECTIONS
 * (0: twice IO_THREADS); a connection idle for half the target's idle
 * timeout is closed by its I/O thread, so idle peers hold no sockets.
 * Responses come back in request order, so a connection's in-flight slices
 * form a FIFO.
 *
 * Teardown (tcp_plugin.c tcp_stop, in this order): the listener closes and
 * every target connection ends (its access released); every peer is shut
 * down and stop waits until each initiator connection has finished its
 * slices on its I/O thread; then the I/O threads leave and are joined.
 * After that no thread of this transport calls the engine.
 *
 * Wire protocol, every integer big-endian, every struct packed by hand:
 *   HELLO      initiator -> target, once per connection
 *              magic u32 "FTCP" | version u16 | flags u16 | expected_generation u64 |
 *              rpc_len u16 | rpc bytes (the initiator's RPC host:port, <= 255)
 *   HELLO_ACK  target -> initiator; status 0, FERRY_ERR_STALE (generation
 *              differs) or FERRY_ERR_UNSUPPORTED (version), then the target closes
 *              magic u32 | version u16 | flags u16 | status i32 | idle_timeout u32 |
 *              generation u64 | max_slice u64 (the largest request it accepts)
 *              idle_timeout: ms after which the target closes an idle connection
 *              (0: never; older targets sent 0 here).  The initiator stops using
 *              a connection idle for half of it, so the target never closes one
 *              that a request is on its way to; a connection the target closes
 *              with nothing in flight is reconnected, not a peer failure.
 *   REQUEST    op u8 (1 WRITE, 2 READ) | pad u8[3] | reserved u32 | id u64 |
 *              addr u64 | length u64; a WRITE is followed by length bytes
 *   RESPONSE   id u64 | status i32 | pad u32; a READ with status 0 is
 *              followed by length bytes
 * Any violation (bad magic, unknown op, length 0 or above max_slice, an id
 * that is not the oldest in flight) closes the connection.
 */
#ifndef FERRY_TCP_H
#define FERRY_TCP_H

#include "../../util/util.h"

#include <endian.h>
#include <string.h>
#include <sys/socket.h>

#define FERRY_TCP_MAGIC 0x46544350u /* "FTCP" */
#define FERRY_TCP_VERSION 1
#define FERRY_TCP_HELLO_SIZE 18 /* without the rpc bytes */
#define FERRY_TCP_HELLO_RPC_MAX 255
#define FERRY_TCP_ACK_SIZE 32
#define FERRY_TCP_REQUEST_SIZE 32
#define FERRY_TCP_RESPONSE_SIZE 16

enum {
    FERRY_TCP_OP_WRITE = 1,
    FERRY_TCP_OP_READ = 2,
};

/* I/O threads run the engine's slice_done and access services; no large
 * buffers live on their stacks. */
#define FERRY_TCP_WORKER_STACK (512u << 10)
#define FERRY_TCP_PEER_BUCKETS 256
/* Slices gathered into one sendmsg (2 iovecs each): fewer syscalls for small slices. */
#define FERRY_TCP_SEND_BATCH 32
/* The most connections to one peer (the slot array's size). */
#define FERRY_TCP_MAX_PEER_CONNS 64
/* The automatic IO_THREADS: half the CPUs the process may run on, 2..8. */
#define FERRY_TCP_AUTO_THREADS_MAX 8
/* Per I/O thread: responses are read through it, refused payloads drained into it. */
#define FERRY_TCP_SCRATCH (64u << 10)
/* Target: responses to small requests wait while the next header is already
 * here, then leave in one send.  A request above COALESCE_MAX flushes first. */
#define FERRY_TCP_COALESCE_COUNT 64
#define FERRY_TCP_COALESCE_MAX (256u << 10)
/* Target: a WRITE into storage collects this much payload in a pipe (or a
 * buffer), then writes it to the file. */
#define FERRY_TCP_STORAGE_CHUNK (256u << 10)

typedef struct ferry_tcp_settings {
    char *listen_host;
    size_t slice_size;
    unsigned connections; /* most sockets per peer; 0: 2 x io_threads */
    unsigned io_threads;  /* 0: automatic */
    unsigned timeout_ms;
    unsigned connect_timeout_ms;
    size_t max_slice;
    size_t sockbuf;
    unsigned idle_timeout_ms;
    unsigned max_conns; /* target connections: a hostile initiator gets no more */
    unsigned max_conns_per_source;
    int storage_staged; /* storage through stage_in/stage_out only */
} ferry_tcp_settings_t;

typedef struct ferry_tcp ferry_tcp_t;
typedef struct ferry_tcp_peer ferry_tcp_peer_t;
typedef struct ferry_tcp_worker ferry_tcp_worker_t;

/* What an epoll event points at: the first member of each kind of socket owner. */
typedef struct ferry_tcp_handler ferry_tcp_handler_t;
struct ferry_tcp_handler {
    void (*on_event)(ferry_tcp_handler_t *handler, uint32_t events);
};

/* Work handed to an I/O thread; run there in posting order. */
typedef struct ferry_tcp_task ferry_tcp_task_t;
struct ferry_tcp_task {
    void (*run)(void *arg);
    void *arg;
    ferry_tcp_task_t *next;
    int waited; /* by ferry_tcp_worker_call, which owns the task until done */
    int done;   /* worker->lock */
};

typedef struct ferry_tcp_conn ferry_tcp_conn_t;
typedef struct ferry_tcp_target_conn ferry_tcp_target_conn_t;

/*
 * One I/O thread.  `lock` protects tasks_* and done (the condition callers
 * of ferry_tcp_worker_call wait on); everything else is the thread's own.
 */
struct ferry_tcp_worker {
    ferry_tcp_t *tcp;
    unsigned index;
    int epfd;
    int wake_fd; /* eventfd: tasks were posted */
    ferry_tcp_handler_t wake_handler;
    pthread_t thread;
    int started;
    pthread_mutex_t lock;
    pthread_cond_t done;
    ferry_tcp_task_t *tasks_head, *tasks_tail;
    int exiting;
    /* the thread's own */
    ferry_tcp_conn_t *conns;           /* initiator connections it serves (for timers) */
    ferry_tcp_target_conn_t *targets;  /* target connections it serves (for timers) */
    unsigned char *scratch;            /* FERRY_TCP_SCRATCH bytes */
    uint64_t next_tick_ms;
};

/*
 * One initiator socket, served by one I/O thread.  peer->lock protects
 * queue_*, inflight_*, the *_seq counters, outstanding, dead, closed_idle,
 * fail_status, registered, out_armed and closed; the epoll interest is
 * changed only under it too, so a submit arming EPOLLOUT and the thread
 * disarming it never cross.  A slice sits in exactly one list (linked by
 * slice->next) or is rx_read, held by the thread while its READ data
 * arrive.  The tx_* and rx_* fields, wnext/wprev are the thread's alone.
 * A connection ends on its thread only: it finishes what it still holds
 * and sets closed, after which the thread never touches it again and a
 * submit may free it and reuse its slot.
 */
struct ferry_tcp_conn {
    ferry_tcp_handler_t handler;
    ferry_tcp_peer_t *peer;
    ferry_tcp_worker_t *worker;
    int fd;
    unsigned index; /* slot in peer->conns */
    ferry_tcp_task_t adopt;
    ferry_tcp_conn_t *wnext, *wprev;

    ferry_slice_t *queue_head, *queue_tail;
    ferry_slice_t *inflight_head, *inflight_tail;
    uint64_t send_seq; /* id of the next request written */
    uint64_t recv_seq; /* id the next response must carry */
    size_t outstanding; /* bytes queued or in flight */
    int dead;
    int closed_idle;
    ferry_status_t fail_status;
    int registered; /* in its thread's epoll set */
    int out_armed;  /* EPOLLOUT asked for */
    int closed;
    atomic_uint_fast64_t last_activity_ms; /* a byte moved either way */

    /* the sending half: one batch, maybe half sent */
    int tx_active;
    ferry_slice_t *tx_staged; /* a device WRITE whose payload follows the batch */
    struct msghdr tx_msg;
    struct iovec tx_iov[2 * FERRY_TCP_SEND_BATCH];
    unsigned char tx_headers[FERRY_TCP_SEND_BATCH][FERRY_TCP_REQUEST_SIZE];
    /* the receiving half */
    unsigned char rx_partial[FERRY_TCP_RESPONSE_SIZE];
    unsigned rx_partial_len;
    ferry_slice_t *rx_read; /* a READ whose data are arriving */
    size_t rx_read_got;
};

typedef enum ferry_tcp_peer_state {
    FERRY_TCP_PEER_CONNECTING, /* the creating submit is connecting; others wait */
    FERRY_TCP_PEER_READY,
    FERRY_TCP_PEER_FAILED, /* the next submit says so once and replaces it */
    FERRY_TCP_PEER_GONE,   /* out of the table (connect failed, forgotten, replaced) */
} ferry_tcp_peer_state_t;

/*
 * A remote engine incarnation.  tcp->lock protects state, connect_status
 * and next.  endpoint, generation, hash, max_slice and idle_timeout_ms are
 * immutable once the peer is READY.  `lock` protects conns, n_open,
 * opening, failing and every connection's shared fields (above); `changed`
 * is signalled when a connection closes or an opening ends.
 * Holders of `refs`: the table (until the peer leaves it), each submit or
 * forget in progress, and each connection not yet closed (taken when it
 * is installed, dropped by its I/O thread when it closes).  Memory,
 * connections included, is freed on the last unref.
 */
struct ferry_tcp_peer {
    ferry_tcp_t *tcp;
    char *endpoint;
    uint64_t generation;
    ferry_tcp_peer_state_t state;
    ferry_status_t connect_status;
    ferry_tcp_peer_t *next;
    atomic_uint refs;
    uint64_t max_slice;
    unsigned idle_timeout_ms; /* the target's, from its HELLO_ACK; 0: it never closes */

    pthread_mutex_t lock;
    pthread_cond_t changed;
    ferry_tcp_conn_t *conns[FERRY_TCP_MAX_PEER_CONNS];
    unsigned n_open;  /* connections installed and not closed */
    int opening;      /* a submit is connecting another one */
    int failing;      /* first failure logs and shuts down */
    size_t outstanding; /* bytes queued or in flight on all connections */
};

/* Where a target connection is.  The listener evicts one only by moving it
 * from HELLO or IDLE to EVICTED, and its thread leaves those states only by
 * moving it to BUSY: one compare-and-swap decides, so a connection is never
 * evicted with a request read. */
typedef enum ferry_tcp_target_state {
    FERRY_TCP_TARGET_HELLO, /* waiting for the HELLO */
    FERRY_TCP_TARGET_BUSY,  /* reading or serving a request, sending responses */
    FERRY_TCP_TARGET_IDLE,  /* between requests, every response sent */
    FERRY_TCP_TARGET_EVICTED,
} ferry_tcp_target_state_t;

/* What a target connection's thread is doing with the byte stream. */
typedef enum ferry_tcp_target_phase {
    FERRY_TCP_PHASE_HELLO,   /* reading the HELLO and its rpc bytes */
    FERRY_TCP_PHASE_HEADER,  /* reading a request header (got 0: between requests) */
    FERRY_TCP_PHASE_PAYLOAD, /* a granted WRITE's payload into memory */
    FERRY_TCP_PHASE_DRAIN,   /* a refused WRITE's payload, thrown away */
    FERRY_TCP_PHASE_SEND,    /* responses, maybe a READ's data after them */
} ferry_tcp_target_phase_t;

/*
 * One accepted connection, served by one I/O thread.  tcp->target_lock
 * protects next and linked (in tcp->target_conns); state and idle_ms are
 * atomics shared with the listener; the rest is the thread's.  The fd is
 * closed only by that thread, after it unlinked the connection, so the
 * listener's shutdown() of a linked one never hits a reused fd.
 */
struct ferry_tcp_target_conn {
    ferry_tcp_handler_t handler;
    ferry_tcp_t *tcp;
    ferry_tcp_worker_t *worker;
    int fd;
    atomic_int state;             /* ferry_tcp_target_state_t */
    atomic_uint_fast64_t idle_ms; /* since when HELLO or IDLE: eviction takes the oldest */
    ferry_net_source_t source;    /* immutable */
    ferry_tcp_target_conn_t *next;
    int linked;
    ferry_tcp_task_t adopt;
    ferry_tcp_target_conn_t *wnext, *wprev;

    ferry_tcp_target_phase_t phase;
    int want_out;         /* EPOLLOUT instead of EPOLLIN */
    uint64_t deadline_ms; /* HELLO: CONNECT_TIMEOUT; a started header: TIMEOUT; else 0 */
    uint64_t progress_ms; /* a byte moved while serving a request */
    uint64_t idle_since_ms;
    size_t got;           /* bytes of the HELLO or header in buf */
    unsigned char buf[FERRY_TCP_HELLO_SIZE + FERRY_TCP_HELLO_RPC_MAX + 1];
    /* the request being served */
    unsigned op;
    uint64_t id, addr, length, moved;
    ferry_status_t granted;
    void *token; /* access held until the payload moved */
    /* A storage request the kernel moves (services' storage_file): the
     * owner's descriptor (-1: none; borrowed while token is held), where
     * the next byte of the file is, and a WRITE's payload not yet written. */
    int file_fd;
    uint64_t file_offset;
    uint64_t file_left; /* a READ: bytes still to sendfile */
    int file_write_flags;
    const void *file_mapped;    /* a READ: the range mapped (storage_file) or NULL */
    void *file_mapped_writable; /* a WRITE: the same, where it may be written */
    /* A WRITE's payload waits in a pipe (splice, not durable) or in chunk
     * (pwritev2), each made on the first storage WRITE that needs it. */
    int pipe_fds[2];      /* -1 until made */
    unsigned char *chunk; /* FERRY_TCP_STORAGE_CHUNK bytes */
    size_t pending;       /* received, not yet written */
    size_t pending_max;   /* what the pipe or chunk holds */
    int into_pipe;
    /* responses not yet sent, out[out_pos, out_len) */
    size_t out_pos, out_len;
    unsigned char out[FERRY_TCP_COALESCE_COUNT * FERRY_TCP_RESPONSE_SIZE];
    struct msghdr tx_msg; /* PHASE_SEND */
    struct iovec tx_iov[2];
};

struct ferry_tcp {
    ferry_transport_services_t svc;
    ferry_tcp_settings_t settings;
    char *address; /* immutable after create */
    unsigned n_workers;
    unsigned max_peer_conns;
    ferry_tcp_worker_t *workers;
    atomic_uint next_worker; /* round-robin placement of new connections */

    /* target side */
    int listen_fd;
    ferry_tcp_handler_t listen_handler;
    uint64_t accept_resume_ms; /* thread 0's: accepting paused until then (out of fds) */
    ferry_log_burst_t refused; /* the listener's alone */
    pthread_mutex_t target_lock; /* target_conns, n_target_conns, stopping, conns' next/linked */
    ferry_tcp_target_conn_t *target_conns;
    size_t n_target_conns;
    int stopping;

    /* initiator side; `lock` is never held across a network call */
    pthread_mutex_t lock;   /* buckets, the peers' state fields, conns_open, stopped */
    pthread_cond_t settled; /* a CONNECTING peer became READY or GONE; conns_open fell */
    ferry_tcp_peer_t *buckets[FERRY_TCP_PEER_BUCKETS];
    size_t conns_open; /* initiator connections installed and not closed, all peers */
    int stopped;
};

/* ---- tcp_worker.c ---- */
ferry_status_t ferry_tcp_workers_start(ferry_tcp_t *tcp);
/* Ask every thread to leave once its tasks ran, and join it. */
void ferry_tcp_workers_stop(ferry_tcp_t *tcp);
void ferry_tcp_workers_free(ferry_tcp_t *tcp);
ferry_tcp_worker_t *ferry_tcp_worker_next(ferry_tcp_t *tcp);
/* The I/O thread the caller is, or NULL. */
ferry_tcp_worker_t *ferry_tcp_worker_self(void);
void ferry_tcp_worker_post(ferry_tcp_worker_t *worker, ferry_tcp_task_t *task);
/* Run fn(arg) on that thread and return when it ran (inline when called there). */
void ferry_tcp_worker_call(ferry_tcp_worker_t *worker, void (*fn)(void *), void *arg);
/* epoll_ctl on the thread's set. */
int ferry_tcp_worker_watch(ferry_tcp_worker_t *worker, int op, int fd, uint32_t events,
                           ferry_tcp_handler_t *handler);
/* Blocking-style I/O on a non-blocking socket, for device staging: fails
 * with FERRY_ERR_TIMEOUT after timeout_ms (0: never) without a byte moved. */
ferry_status_t ferry_tcp_sync_send(int fd, const void *buf, size_t len, unsigned timeout_ms);
ferry_status_t ferry_tcp_sync_recv(int fd, void *buf, size_t len, unsigned timeout_ms);
unsigned ferry_tcp_auto_threads(void);

/* ---- tcp_plugin.c ---- */
const ferry_plugin_t *ferry_tcp_plugin(void);
void ferry_tcp_tune_socket(const ferry_tcp_t *tcp, int fd);

/* ---- tcp_target.c ---- */
ferry_status_t ferry_tcp_target_start(ferry_tcp_t *tcp, const char *host, int *port_p);
/* Close the listener and end every target connection (access released). */
void ferry_tcp_target_stop(ferry_tcp_t *tcp);
/* The timers of a thread's target connections (that thread). */
void ferry_tcp_target_tick(ferry_tcp_worker_t *worker, uint64_t now);

/* ---- tcp_storage.c: a storage request the kernel moves (the target's thread) ---- */
/* Whether conn's granted storage range (conn->op, addr, length, token) goes
 * by the mapping, sendfile, splice or chunked pwrite; sets conn->file_*.
 * 0: the staged path. */
int ferry_tcp_storage_open(ferry_tcp_target_conn_t *conn);
/* Whether the file still holds the whole range (logged if not). */
ferry_status_t ferry_tcp_storage_check(const ferry_tcp_target_conn_t *conn);
/* A READ that is not mapped: sendfile of up to max bytes of what is left;
 * sendfile's result. */
ssize_t ferry_tcp_storage_send(ferry_tcp_target_conn_t *conn, size_t max);
/* A WRITE: up to want bytes of payload from the socket into the pipe or
 * chunk (no more than pending_max - pending); recv's result. */
ssize_t ferry_tcp_storage_recv(ferry_tcp_target_conn_t *conn, size_t want);
/* A WRITE: what is pending written at file_offset, which moves past it. */
ferry_status_t ferry_tcp_storage_flush(ferry_tcp_target_conn_t *conn);
/* The connection's pipe and chunk freed (it closes). */
void ferry_tcp_storage_free(ferry_tcp_target_conn_t *conn);

/* ---- tcp_wire.c: what a target reads, parsed (logs each violation once) ---- */
typedef struct ferry_tcp_hello {
    uint16_t version;
    uint64_t expected_generation;
    uint16_t rpc_len; /* <= FERRY_TCP_HELLO_RPC_MAX; that many rpc bytes follow */
} ferry_tcp_hello_t;

typedef struct ferry_tcp_request {
    unsigned op; /* FERRY_TCP_OP_WRITE or FERRY_TCP_OP_READ */
    uint64_t id;
    uint64_t addr;
    uint64_t length; /* 1..max_slice */
} ferry_tcp_request_t;

/* The FERRY_TCP_HELLO_SIZE bytes before the rpc bytes.  FERRY_ERR_PROTOCOL:
 * not a ferry HELLO or an rpc_len over the bound; FERRY_ERR_UNSUPPORTED:
 * another wire version (the target answers that before it closes). */
ferry_status_t ferry_tcp_hello_parse(const unsigned char *bytes, ferry_tcp_hello_t *hello);
/* The rpc bytes as received into rpc (room for rpc_len + 1): refused when
 * they hold a NUL, else NUL-terminated in place. */
ferry_status_t ferry_tcp_hello_rpc_parse(char *rpc, size_t rpc_len);
/* FERRY_TCP_REQUEST_SIZE bytes; FERRY_ERR_PROTOCOL on an unknown op, a
 * length of 0 or above max_slice.  The range itself is the engine's to judge. */
ferry_status_t ferry_tcp_request_parse(const unsigned char *bytes, size_t max_slice,
                                       ferry_tcp_request_t *request);

/* ---- tcp_peer.c ---- */
ferry_status_t ferry_tcp_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);
void ferry_tcp_peer_forget(void *ctx, const ferry_peer_t *peer);
/* tcp_cancel.c: the transport op; queued slices of those owners only. */
void ferry_tcp_cancel(void *ctx, const void *owner_lo, const void *owner_hi);
/* Shut every peer down and wait until every initiator connection closed. */
void ferry_tcp_peers_destroy(ferry_tcp_t *tcp);
void ferry_tcp_peer_ref(ferry_tcp_peer_t *peer);
void ferry_tcp_peer_unref(ferry_tcp_peer_t *peer);
/* The whole peer fails: every connection is shut down (first status wins). */
void ferry_tcp_peer_fail(ferry_tcp_peer_t *peer, ferry_status_t why, const char *what);

/* ---- tcp_conn.c: an initiator connection on its I/O thread ---- */
/* Connect, HELLO, HELLO_ACK on the calling thread (blocking, bounded by
 * CONNECT_TIMEOUT); then the socket is made non-blocking.  The ACK's
 * max_slice and idle timeout go to *max_slice_p and *idle_timeout_p. */
ferry_status_t ferry_tcp_conn_open(ferry_tcp_t *tcp, const ferry_tcp_peer_t *peer, int *fd_p,
                                   uint64_t *max_slice_p, unsigned *idle_timeout_p);
/* Hand an installed connection to its thread (task conn->adopt). */
void ferry_tcp_conn_adopt(ferry_tcp_conn_t *conn);
/* Ask for EPOLLOUT: slices were queued.  peer->lock held. */
void ferry_tcp_conn_arm_locked(ferry_tcp_conn_t *conn);
/* Timers of a thread's initiator connections (that thread). */
void ferry_tcp_conn_tick(ferry_tcp_worker_t *worker, uint64_t now);

/* ---- wire helpers ---- */

static inline void ferry_tcp_put16(unsigned char *p, uint16_t v)
{
    v = htobe16(v);
    memcpy(p, &v, sizeof(v));
}

static inline void ferry_tcp_put32(unsigned char *p, uint32_t v)
{
    v = htobe32(v);
    memcpy(p, &v, sizeof(v));
}

static inline void ferry_tcp_put64(unsigned char *p, uint64_t v)
{
    v = htobe64(v);
    memcpy(p, &v, sizeof(v));
}

static inline uint16_t ferry_tcp_get16(const unsigned char *p)
{
    uint16_t v;
    memcpy(&v, p, sizeof(v));
    return be16toh(v);
}

static inline uint32_t ferry_tcp_get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof(v));
    return be32toh(v);
}

static inline uint64_t ferry_tcp_get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return be64toh(v);
}

/* ---- the messages ---- */

static inline size_t ferry_tcp_encode_hello(unsigned char *p, uint64_t expected_generation,
                                            const char *rpc, size_t rpc_len)
{
    ferry_tcp_put32(p, FERRY_TCP_MAGIC);
    ferry_tcp_put16(p + 4, FERRY_TCP_VERSION);
    ferry_tcp_put16(p + 6, 0);
    ferry_tcp_put64(p + 8, expected_generation);
    ferry_tcp_put16(p + 16, (uint16_t)rpc_len);
    memcpy(p + FERRY_TCP_HELLO_SIZE, rpc, rpc_len);
    return FERRY_TCP_HELLO_SIZE + rpc_len;
}

static inline void ferry_tcp_encode_ack(unsigned char *p, ferry_status_t status,
                                        uint32_t idle_timeout_ms, uint64_t generation,
                                        uint64_t max_slice)
{
    ferry_tcp_put32(p, FERRY_TCP_MAGIC);
    ferry_tcp_put16(p + 4, FERRY_TCP_VERSION);
    ferry_tcp_put16(p + 6, 0);
    ferry_tcp_put32(p + 8, (uint32_t)(int32_t)status);
    ferry_tcp_put32(p + 12, idle_timeout_ms);
    ferry_tcp_put64(p + 16, generation);
    ferry_tcp_put64(p + 24, max_slice);
}

static inline void ferry_tcp_encode_request(unsigned char *p, unsigned op, uint64_t id,
                                            uint64_t addr, uint64_t length)
{
    memset(p, 0, 8);
    p[0] = (unsigned char)op;
    ferry_tcp_put64(p + 8, id);
    ferry_tcp_put64(p + 16, addr);
    ferry_tcp_put64(p + 24, length);
}

static inline void ferry_tcp_encode_response(unsigned char *p, uint64_t id, int32_t status)
{
    ferry_tcp_put64(p, id);
    ferry_tcp_put32(p + 8, (uint32_t)status);
    ferry_tcp_put32(p + 12, 0);
}

#endif
