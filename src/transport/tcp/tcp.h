/*
 * The native TCP transport: private objects and the wire protocol.
 *
 * Target side (tcp_target.c): one listener thread, one thread per accepted
 * connection; requests on a connection are served in order, straight between
 * the socket and registered memory.  At most MAX_CONNS connections, at most
 * MAX_CONNS_PER_SOURCE from one address: a newcomer past either evicts the
 * connection idle longest (of its own address when that cap is the one
 * reached) or is closed when none is idle; a connection idle for
 * IDLE_TIMEOUT closes.  Idle means between requests, every response sent,
 * or still waiting for the HELLO.  Initiator side (tcp_peer.c): a table of
 * peers keyed by (endpoint, generation); each peer has CONNECTIONS sockets,
 * each socket a sender thread and a receiver thread.  Responses come back in
 * request order, so a connection's in-flight slices form a FIFO.
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

/* Threads never need much stack: no large buffers live there.  The receiver
 * runs the engine's slice_done (which may submit and so resolve names). */
#define FERRY_TCP_WORKER_STACK (512u << 10)
#define FERRY_TCP_TARGET_STACK (256u << 10)
#define FERRY_TCP_PEER_BUCKETS 256
/* Slices gathered into one sendmsg (2 iovecs each): fewer syscalls for small slices. */
#define FERRY_TCP_SEND_BATCH 32

typedef struct ferry_tcp_settings {
    char *listen_host;
    size_t slice_size;
    unsigned connections;
    unsigned timeout_ms;
    unsigned connect_timeout_ms;
    size_t max_slice;
    size_t sockbuf;
    unsigned idle_timeout_ms;
    unsigned max_conns; /* target connections, so threads: a hostile initiator gets no more */
    unsigned max_conns_per_source;
} ferry_tcp_settings_t;

typedef struct ferry_tcp ferry_tcp_t;
typedef struct ferry_tcp_peer ferry_tcp_peer_t;

typedef struct ferry_tcp_acked {
    ferry_slice_t *slice;
    ferry_status_t status;
} ferry_tcp_acked_t;

/*
 * One initiator socket.  `lock` protects queue_*, inflight_*, the *_seq
 * counters, acked, dead, fail_status and threads_left; the sender sleeps on
 * `wakeup`.  A slice sits in exactly one list (linked by slice->next) or is
 * held by the receiver while its READ data arrive.  A connection that ends
 * with both lists empty -- the target closed it idle, or submit retired it
 * before the target's idle timeout could -- is dead with closed_idle set:
 * no failure, the peer is reconnected once nothing is outstanding.  No slice of a dead
 * connection is finished while a thread could still touch its buffer: the
 * last of the two threads to leave finishes what the lists still hold.
 */
typedef struct ferry_tcp_conn {
    ferry_tcp_peer_t *peer;
    int fd;
    unsigned index;
    pthread_t sender, receiver;
    int threads_started; /* bits: 1 sender, 2 receiver; set before READY, cleared by the join */

    pthread_mutex_t lock;
    pthread_cond_t wakeup;
    ferry_slice_t *queue_head, *queue_tail;
    ferry_slice_t *inflight_head, *inflight_tail;
    uint64_t send_seq; /* id of the next request written */
    uint64_t recv_seq; /* id the next response must carry */
    uint64_t sent_seq; /* ids below it have left sendmsg */
    /* WRITEs answered before their sendmsg returned (ids >= sent_seq, so
     * all from the batch being sent); the sender finishes them. */
    unsigned n_acked;
    ferry_tcp_acked_t acked[FERRY_TCP_SEND_BATCH];
    int dead;
    int closed_idle;
    ferry_status_t fail_status;
    int threads_left;

    /* lock-free: load balancing and stall detection */
    atomic_size_t outstanding;             /* bytes queued or in flight */
    atomic_uint_fast64_t last_activity_ms; /* a byte moved either way */
} ferry_tcp_conn_t;

typedef enum ferry_tcp_peer_state {
    FERRY_TCP_PEER_CONNECTING, /* the creating submit is connecting; others wait */
    FERRY_TCP_PEER_READY,
    FERRY_TCP_PEER_FAILED, /* the next submit says so once and replaces it */
    FERRY_TCP_PEER_GONE,   /* out of the table (connect failed, forgotten, replaced) */
} ferry_tcp_peer_state_t;

/*
 * A remote engine incarnation.  tcp->lock protects state, connect_status
 * and next.  endpoint, generation, max_slice, idle_timeout_ms, n_conns and
 * conns are immutable once the peer is READY.  Memory is freed on the last unref;
 * the table (or the graveyard) holds one reference, a submit in progress
 * another.
 */
struct ferry_tcp_peer {
    ferry_tcp_t *tcp;
    char *endpoint;
    uint64_t generation;
    ferry_tcp_peer_state_t state;
    ferry_status_t connect_status;
    ferry_tcp_peer_t *next;
    atomic_uint refs;
    atomic_uint threads_running; /* 0: every thread has left, join is immediate */
    atomic_int failing;          /* first failure logs and shuts down */
    uint64_t max_slice;
    unsigned idle_timeout_ms; /* the target's, from its HELLO_ACK; 0: it never closes */
    unsigned n_conns;
    ferry_tcp_conn_t *conns;
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

/* One accepted connection on the target side.  tcp->target_lock protects next. */
typedef struct ferry_tcp_target_conn {
    ferry_tcp_t *tcp;
    int fd; /* closed only by whoever joins the thread, so shutdown() never hits a reused fd */
    pthread_t thread;
    atomic_int finished;
    atomic_int state;             /* ferry_tcp_target_state_t */
    atomic_uint_fast64_t idle_ms; /* since when HELLO or IDLE: eviction takes the oldest */
    ferry_net_source_t source;    /* immutable */
    struct ferry_tcp_target_conn *next;
} ferry_tcp_target_conn_t;

struct ferry_tcp {
    ferry_transport_services_t svc;
    ferry_tcp_settings_t settings;
    char *address; /* immutable after create */

    /* target side */
    int listen_fd;
    int wake_pipe[2];
    pthread_t listener;
    int listener_started;
    ferry_log_burst_t refused; /* the listener's alone */
    pthread_mutex_t target_lock; /* target_conns, n_target_conns, stopping */
    ferry_tcp_target_conn_t *target_conns;
    size_t n_target_conns;
    int stopping;

    /* initiator side; `lock` is never held across a network call */
    pthread_mutex_t lock;   /* buckets, graveyard, the peers' state fields */
    pthread_cond_t settled; /* a CONNECTING peer became READY or GONE */
    ferry_tcp_peer_t *buckets[FERRY_TCP_PEER_BUCKETS];
    ferry_tcp_peer_t *graveyard; /* out of the table, threads not yet joined */
};

/* ---- tcp_plugin.c ---- */
const ferry_plugin_t *ferry_tcp_plugin(void);
ferry_status_t ferry_tcp_thread_start(pthread_t *thread, size_t stack, void *(*fn)(void *),
                                      void *arg);
void ferry_tcp_tune_socket(const ferry_tcp_t *tcp, int fd);

/* ---- tcp_target.c ---- */
ferry_status_t ferry_tcp_target_start(ferry_tcp_t *tcp, const char *host, int *port_p);
void ferry_tcp_target_stop(ferry_tcp_t *tcp);

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
void ferry_tcp_peers_destroy(ferry_tcp_t *tcp);

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
