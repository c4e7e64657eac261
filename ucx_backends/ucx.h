/*
 * The ucx transport plugin: private objects.
 *
 * One ucp context per transport instance, FERRY_UCX_WORKERS workers, each
 * created in UCS_THREAD_MODE_MULTI and driven by its own progress thread
 * (ucx_context.c).  Callers post puts and gets straight from submit(); the
 * progress thread completes what UCX could not finish inline.
 *
 * Endpoint string (the descriptor's "transports":{"ucx":...}):
 *   ucx1:<boot id>:<pid namespace>:<pid>:<start time>:<worker address>[,...]
 * each worker address the base64 of its ucp address.  The process identity
 * (kernel boot id, pid namespace, pid, start time) lets an initiator on the
 * same kernel see at once that the peer is gone: UCX's own keepalive over
 * shared memory runs every 20 s.  Buffer key: the base64 of the
 * packed rkey.  An initiator's worker i talks to the peer's worker
 * (i mod number of peer workers).
 *
 * Objects and locks (never held across a blocking wait; order: ucx->lock,
 * then ep->lock; worker->lock is a leaf):
 *   ferry_ucx_t.lock       the endpoint table and each endpoint's state/next
 *   ferry_ucx_ep_t.lock    posting on ep->ep, closing it, the rkey cache
 *   ferry_ucx_worker_t.lock the worker's endpoint list (deadline sweeps) and
 *                          the queue of endpoints its thread must close
 * Completion callbacks run inside ucp_worker_progress (any thread that
 * progresses) and take none of these locks but worker->lock.
 */
#ifndef FERRY_UCX_H
#define FERRY_UCX_H

#include <ferry/lock.h>
#include <ferry/plugin.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <ucp/api/ucp.h>

#define FERRY_UCX_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define FERRY_UCX_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FERRY_UCX_MAX(a, b) ((a) > (b) ? (a) : (b))

#define FERRY_UCX_EP_BUCKETS 256
#define FERRY_UCX_MAX_WORKERS 64
#define FERRY_UCX_THREAD_STACK (512u << 10)
/* Active message ids of this plugin. */
enum {
    /* header: the acknowledgement's id, then the sender's segment name; data: the message */
    FERRY_UCX_AM_NOTIFY = 0x4652,
    FERRY_UCX_AM_HELLO = 0x4653,  /* header: the initiator's RPC host:port */
    FERRY_UCX_AM_WRITE = 0x4657,  /* header: address and id; data: the bytes (ucx_eager.c) */
    FERRY_UCX_AM_WRITE_ACK = 0x4658, /* header: id and the target's status */
};
#define FERRY_UCX_NAME_MAX 255
#define FERRY_UCX_ENDPOINT_PREFIX "ucx1:"
/* A same-host peer is looked up in /proc before a request when it was last
 * checked this long ago (and every progress tick while requests are out). */
#define FERRY_UCX_LIVENESS_MS 20
/* Copies into attached memory up to this many bytes per submit run under
 * the endpoint's lock (no outstanding count, no clock, no copy list):
 * latency-bound ones.  32 KiB holds a window of 64 requests of 512 bytes
 * (OSU's), whose second half copied after the lock cost 0.1-0.2x of its
 * rate (doc/performance.md); a thread writing to the same peer waits for
 * at most that much copying. */
#define FERRY_UCX_LOCKED_COPY_MAX (32u * 1024u)
/* A caller's ferry_ucx_progress polls a worker with nothing in flight and
 * only shared-memory endpoints every this many calls (see there). */
#define FERRY_UCX_IDLE_POLL_EVERY 64u
/* A worker's thread parked while a caller posts (ferry_ucx_posting_begin)
 * looks at the worker at least this often: another caller's completions
 * may wait on it. */
#define FERRY_UCX_PARK_MAX_MS 1u
/* While callers poll a worker its thread naps, SPIN microseconds first and
 * twice as long each time it finds them still polling, up to this: a
 * caller that stops polling without going to sleep in ferry_batch_wait
 * (which wakes the thread) leaves its requests to the thread this late. */
#define FERRY_UCX_NAP_MAX_US 1000u
/* A target remembers this many refused eager writes whose run's
 * acknowledgement has not come yet (ucx_eager.c). */
#define FERRY_UCX_REFUSALS_MAX 64u

typedef enum ferry_ucx_progress_mode {
    FERRY_UCX_PROGRESS_WAIT,   /* block on the worker's event fd, wake on events */
    FERRY_UCX_PROGRESS_HYBRID, /* poll while busy (SPIN after the last activity), then wait */
    FERRY_UCX_PROGRESS_POLL,   /* always poll: one core per worker, lowest latency */
} ferry_ucx_progress_mode_t;

typedef enum ferry_ucx_shm_policy {
    FERRY_UCX_SHM_IGNORE,
    FERRY_UCX_SHM_WARN,
    FERRY_UCX_SHM_REQUIRE,
} ferry_ucx_shm_policy_t;

typedef struct ferry_ucx_settings {
    unsigned workers;
    char *progress;
    unsigned spin_us;
    unsigned timeout_ms;
    size_t slice_size;
    char *same_host_shm;
    unsigned rkey_cache;
    int same_host_emulated;
    size_t eager_write;
    size_t eager_piece;
} ferry_ucx_settings_t;

typedef struct ferry_ucx ferry_ucx_t;
typedef struct ferry_ucx_worker ferry_ucx_worker_t;
typedef struct ferry_ucx_ep ferry_ucx_ep_t;
typedef struct ferry_ucx_eager ferry_ucx_eager_t;

/* One cached unpacked rkey; ep->lock. */
typedef struct ferry_ucx_rkey {
    char *key;
    uint64_t hash;
    ucp_rkey_h rkey;
    int direct; /* the remote memory is mapped here (ucp_rkey_ptr): plain stores */
    uintptr_t map_lo, map_hi; /* direct: our mapping of it, found at the first use */
    uintptr_t delta;          /* direct: local address - remote address */
    struct ferry_ucx_rkey *next;
} ferry_ucx_rkey_t;

typedef enum ferry_ucx_ep_state {
    FERRY_UCX_EP_CONNECTING,  /* being created by one thread; others wait on ucx->settled */
    FERRY_UCX_EP_READY,
    FERRY_UCX_EP_FAILED,      /* the next submit says so once and drops it */
    FERRY_UCX_EP_UNREACHABLE, /* no usable lane: reaches() says no, kept as a negative entry */
    FERRY_UCX_EP_GONE,        /* out of the table */
} ferry_ucx_ep_state_t;

/*
 * A remote engine incarnation reached from one of our workers.
 * Immutable once READY: worker, endpoint, generation, name, lanes, same_host.
 * refs: the table's, one per submit or notify in progress, one per op group
 * in flight; the last unref destroys the rkeys and frees it.
 */
struct ferry_ucx_ep {
    ferry_ucx_t *ucx;
    ferry_ucx_worker_t *worker;
    char *endpoint;
    uint64_t generation;
    char *name;
    char lanes[256];            /* "sysv/memory(am) cma/memory(rma_bw)" */
    int same_host;
    int am_on_shm;              /* active messages (and emulated RMA) use a shared-memory FIFO */
    int rma_emulated;           /* no lane does RMA: small writes go eager (ucx_eager.c) */
    int am_ordered;             /* one lane carries every active message: they arrive
                                   in posting order (eager writes share acknowledgements) */
    long pid;                   /* the peer process if it runs on our kernel and pid
                                   namespace, else 0 (from the endpoint string) */
    unsigned long long start_time;
    const char *addresses;      /* inside endpoint: the worker addresses */
    ferry_ucx_ep_state_t state; /* ucx->lock */
    ferry_status_t connect_status;
    ferry_ucx_ep_t *next;       /* ucx->lock: bucket chain */
    ferry_ucx_ep_t *worker_next;/* worker->lock: the worker's list */
    ferry_ucx_ep_t *close_next; /* worker->lock: the worker's close queue */
    ferry_ucx_ep_t *flush_queue_next; /* worker->lock: the worker's flush queue */
    int on_worker_list;         /* worker->lock */
    int close_queued;           /* worker->lock */
    int flush_queued;           /* worker->lock */

    ferry_lock_t lock;          /* posting on ep, closed, rkeys, n_rkeys */
    _Atomic(ucp_ep_h) ep;       /* NULL once closed; flush callbacks read it unlocked */
    int closed;
    ferry_ucx_rkey_t **rkeys;   /* settings.rkey_cache buckets */
    size_t n_rkeys;
    uint64_t rkeys_flushes;     /* ferry_ucx_rkeys_flush calls: entries seen before a
                                   flush are gone */

    /* Flush coalescing: while one flush is in flight, groups posted after it
     * wait here for the next one (a flush covers everything posted before
     * it), so a batch of n requests costs two or three flushes, not n.  A
     * flush that completes with groups waiting has the worker's thread post
     * the next one (never from inside a UCX callback).  flush_lock is a
     * leaf, never held across a UCX call. */
    pthread_mutex_t flush_lock;
    int flush_inflight;
    struct ferry_ucx_group *flush_waiting, *flush_waiting_tail;

    atomic_uint refs;
    atomic_int failed;          /* ferry status that failed it, 0 while healthy */
    atomic_uint outstanding;    /* op groups in flight */
    atomic_uint_fast64_t last_activity_ms;
    atomic_uint_fast64_t checked_ms;  /* last liveness check of a same-host peer */
    atomic_int keys_stale;            /* the peer unregistered memory: drop rkeys when idle */
};

/* Operations posted together by one submit (or one notify), finished together
 * once UCX completed every one of them and the flush behind them. */
typedef struct ferry_ucx_group {
    ferry_ucx_ep_t *ep;
    ferry_slice_t *slices;      /* transfers: finished with slice_done */
    atomic_uint pending;        /* ops and flush not completed, + 1 while posting */
    atomic_int status;          /* first ucs_status_t error, UCS_OK if none */
    struct ferry_ucx_waiter *waiter; /* notify: woken when done */
    void *payload;              /* notify: the header and message, freed when done */
    struct ferry_ucx_group *flush_next; /* in ep->flush_waiting or a flush's list */
} ferry_ucx_group_t;

typedef struct ferry_ucx_waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done;
    ucs_status_t status;
    atomic_uint refs; /* the waiting thread and the group */
} ferry_ucx_waiter_t;

struct ferry_ucx_worker {
    ferry_ucx_t *ucx;
    unsigned index;
    ucp_worker_h worker;
    int efd;
    pthread_t thread;
    int thread_started;
    atomic_int stop;
    atomic_uint_fast64_t last_activity_us; /* hybrid mode polls SPIN past this */
    atomic_uint_fast64_t caller_polls;     /* bumped by every caller's progress call */
    atomic_uint posting;                   /* callers posting to the worker (submit) */
    atomic_int caller_left;                /* a polling caller went to sleep since the
                                              thread last looked (ferry_ucx_progress_leave) */
    atomic_int parked;                     /* the thread waits on park_cond: why
                                              (ucx_context.c), 0 if it does not */
    pthread_mutex_t park_lock;
    pthread_cond_t park_cond; /* CLOCK_MONOTONIC; signalled when posting drops to 0
                                 and when a polling caller leaves */
    atomic_uint busy;                      /* groups in flight: sweep deadlines */
    atomic_uint net_eps;                   /* listed endpoints whose messages go by network */
    atomic_uint closing;                   /* ucp_ep_close_nbx not completed */
    atomic_int close_pending;              /* close_queue or flush_queue is not empty */
    atomic_int sleeping;                   /* the thread waits on efd */

    pthread_mutex_t lock;
    ferry_ucx_ep_t *eps;
    ferry_ucx_ep_t *close_queue;
    ferry_ucx_ep_t *flush_queue; /* endpoints whose waiting groups need a flush */
    ferry_ucx_eager_t *eager;    /* acknowledgements eager writes wait for, oldest first */
    ferry_ucx_eager_t **eager_tail; /* where the next one goes (&eager when empty) */
    uint64_t eager_ids;          /* the last acknowledgement's id (random start) */
    /* Target: refusals of writes whose acknowledgement is still to come
     * (ucx_eager.c); a ring, the oldest overwritten. */
    struct ferry_ucx_refusal {
        ucp_ep_h reply_ep;
        uint64_t id;
        int32_t status;
    } refusals[FERRY_UCX_REFUSALS_MAX];
    unsigned refusals_next;
    atomic_uint refusals_kept; /* slots in use */
};

struct ferry_ucx {
    ferry_transport_services_t svc;
    ferry_ucx_settings_t settings;
    ferry_ucx_progress_mode_t progress_mode;
    ferry_ucx_shm_policy_t shm_policy;
    ucp_context_h context;
    ucp_datatype_t eager_dt; /* bytes packed by us: eager writes never go zero-copy (ucx_eager.c) */
    int eager_dt_made;
    unsigned n_workers;
    ferry_ucx_worker_t *workers;
    char *address; /* our endpoint string; immutable after create */

    pthread_mutex_t lock;   /* buckets, ep->state, ep->next, memo_* */
    pthread_cond_t settled; /* a CONNECTING endpoint changed state */
    ferry_ucx_ep_t *buckets[FERRY_UCX_EP_BUCKETS];
    /* The endpoint the last submit found, and the endpoint string (the
     * descriptor's, by address) it was found by: a submit to the same peer
     * skips the hash and the string compare.  Cleared when that endpoint
     * leaves the table. */
    ferry_ucx_ep_t *memo_ep;
    const char *memo_endpoint;
};

/* ---- ucx_plugin.c ---- */
extern const ferry_setting_t ferry_ucx_settings_table[];
extern const size_t ferry_ucx_settings_count;
uint64_t ferry_ucx_time_ms(void);
uint64_t ferry_ucx_time_us(void);
/* now - then, or 0 when another thread stored a later time than our now. */
static inline uint64_t ferry_ucx_since(uint64_t then, uint64_t now)
{
    return now > then ? now - then : 0;
}
uint64_t ferry_ucx_hash(const char *text, uint64_t seed);
ferry_status_t ferry_ucx_status(ucs_status_t status);

/* ---- ucx_context.c ---- */
/* ucp_config_read plus our defaults (shared memory with peer error handling). */
ferry_status_t ferry_ucx_config_read(ucp_config_t **config_p);
ferry_status_t ferry_ucx_context_start(ferry_ucx_t *ucx);
/* The transport's stop op: threads joined, endpoints closed, requests in
 * flight failed; memory registrations stay until stop (which quiesces
 * first if nobody did). */
void ferry_ucx_context_quiesce(ferry_ucx_t *ucx);
void ferry_ucx_context_stop(ferry_ucx_t *ucx);
/* The transport's progress op: the caller's thread progresses every worker
 * that has requests of ours in flight. */
unsigned ferry_ucx_progress(void *ctx);
/* The transport's progress_leave op: a caller that polled is going to
 * sleep; napping threads take over now. */
void ferry_ucx_progress_leave(void *ctx);
/* Around a caller's posts to a worker: its thread stays off the worker
 * meanwhile and is back on it when the last poster is done. */
void ferry_ucx_posting_begin(ferry_ucx_worker_t *w);
void ferry_ucx_posting_end(ferry_ucx_worker_t *w);
/* What ferry_info prints: version and the transports this host offers. */
void ferry_ucx_print_info(FILE *out);

/* ---- ucx_mem.c ---- */
int ferry_ucx_local_memory(void *ctx, const char *location);
ferry_status_t ferry_ucx_mem_register(void *ctx, void *addr, size_t length, const char *location,
                                      char **key_p, void **memh_p);
/* The transport's mem_alloc op: ucp_mem_map(UCP_MEM_MAP_ALLOCATE). */
ferry_status_t ferry_ucx_mem_alloc(void *ctx, size_t length, const char *location, void **addr_p,
                                   char **key_p, void **memh_p);
void ferry_ucx_mem_deregister(void *ctx, void *memh);
ucp_mem_h ferry_ucx_memh(const void *memh);
char *ferry_ucx_base64_encode(const void *data, size_t length);
/* NULL on bad input; *length_p gets the decoded size. */
void *ferry_ucx_base64_decode(const char *text, size_t text_length, size_t *length_p);
/* The cached entry (unpacked rkey) for key on ep; caller holds ep->lock. */
ferry_status_t ferry_ucx_rkey_get(ferry_ucx_ep_t *ep, const char *key,
                                  ferry_ucx_rkey_t **entry_p);
/* For a direct rkey, our address of the remote [remote_addr, +length), or
 * NULL when that range is not inside what UCX attached (a descriptor that
 * claims more than the key maps); caller holds ep->lock. */
void *ferry_ucx_direct_map(ferry_ucx_rkey_t *entry, uint64_t remote_addr, size_t length);
static inline void *ferry_ucx_direct_ptr(ferry_ucx_rkey_t *entry, uint64_t remote_addr,
                                         size_t length)
{
    if (entry->map_hi == 0) /* first use: find the mapping */
        return ferry_ucx_direct_map(entry, remote_addr, length);
    uintptr_t local = (uintptr_t)remote_addr + entry->delta;
    if (local < entry->map_lo || local >= entry->map_hi || length > entry->map_hi - local)
        return NULL;
    return (void *)local;
}
/* 16 bytes, moved as one (memcpy of a constant size is a move). */
typedef struct ferry_ucx_bytes16 {
    uint64_t w[2];
} ferry_ucx_bytes16_t;

/* A copy of a slice into or out of attached memory.  Up to 64 bytes (a
 * flag, a counter, OSU's small windows) in moves of fixed size that may
 * overlap, all loads before the stores: the calls into ferry_copy_to_peer
 * and memcpy cost more than such a copy (which ferry_copy_to_peer makes
 * with plain stores too below 64 bytes). */
static inline void ferry_ucx_direct_copy(const ferry_slice_t *slice, void *remote)
{
    unsigned char *dst = slice->opcode == FERRY_OP_WRITE ? remote : slice->local;
    const unsigned char *src = slice->opcode == FERRY_OP_WRITE ? slice->local : remote;
    size_t length = slice->length;
    if (length > 64) {
        if (slice->opcode == FERRY_OP_WRITE)
            ferry_copy_to_peer(dst, src, length);
        else
            memcpy(dst, src, length);
    } else if (length > 32) { /* 32 from each end */
        ferry_ucx_bytes16_t a, b, c, d;
        memcpy(&a, src, 16);
        memcpy(&b, src + 16, 16);
        memcpy(&c, src + length - 32, 16);
        memcpy(&d, src + length - 16, 16);
        memcpy(dst, &a, 16);
        memcpy(dst + 16, &b, 16);
        memcpy(dst + length - 32, &c, 16);
        memcpy(dst + length - 16, &d, 16);
    } else if (length > 16) {
        ferry_ucx_bytes16_t head, tail;
        memcpy(&head, src, 16);
        memcpy(&tail, src + length - 16, 16);
        memcpy(dst, &head, 16);
        memcpy(dst + length - 16, &tail, 16);
    } else if (length >= 8) {
        uint64_t head, tail;
        memcpy(&head, src, 8);
        memcpy(&tail, src + length - 8, 8);
        memcpy(dst, &head, 8);
        memcpy(dst + length - 8, &tail, 8);
    } else if (length >= 4) {
        uint32_t head, tail;
        memcpy(&head, src, 4);
        memcpy(&tail, src + length - 4, 4);
        memcpy(dst, &head, 4);
        memcpy(dst + length - 4, &tail, 4);
    } else if (length > 0) {
        unsigned char first = src[0], middle = src[length / 2], last = src[length - 1];
        dst[0] = first;
        dst[length / 2] = middle;
        dst[length - 1] = last;
    }
}
/* Drop every cached rkey; caller holds ep->lock or is the last user. */
void ferry_ucx_rkeys_flush(ferry_ucx_ep_t *ep);

/* ---- ucx_eager.c ---- */
/* Does this slice go as an eager write (settings.eager_write, ep->rma_emulated)? */
int ferry_ucx_eager_fits(const ferry_ucx_ep_t *ep, const ferry_slice_t *slice);
/* The eager writes of one submit.  On an endpoint that keeps its active
 * messages in order (ep->am_ordered) they share one acknowledgement, which
 * the last asks for; elsewhere each asks for its own. */
typedef struct ferry_ucx_eager_run {
    void *slots;      /* a header slot per eager message and one spare, made at the
                         first post (a submit of copies into attached memory
                         needs none): the group's payload */
    size_t used;      /* slots used */
    size_t left;      /* eager messages of the submit not posted yet (counted
                         at the first post; a slice goes in
                         settings.eager_piece pieces) */
    uint64_t open_id; /* the acknowledgement the writes posted so far wait for; 0: none */
} ferry_ucx_eager_run_t;
#define FERRY_UCX_EAGER_RUN_INIT ((ferry_ucx_eager_run_t){0})
/* Send the slice as eager writes of the group, one per piece; caller holds
 * ep->lock. */
ucs_status_t ferry_ucx_eager_post(ferry_ucx_eager_run_t *run, ferry_ucx_group_t *group,
                                  const ferry_slice_t *slice);
/* After the last post (group: the submit's, or NULL): a run that stopped
 * before its last eager write asks for its acknowledgement now.  Caller
 * holds ep->lock. */
void ferry_ucx_eager_run_end(ferry_ucx_eager_run_t *run, ferry_ucx_group_t *group);
/* Acknowledgements (eager writes, notifies): a new entry in the worker's
 * table that counts once in the group until the answer with its id comes,
 * or the endpoint closes (0: out of memory, nothing counted); forget: the
 * message asking for it was never sent, so its count is finished here
 * unless the endpoint's close did so already; send: the target's answer,
 * status the refusal (FERRY_OK: done). */
uint64_t ferry_ucx_ack_expect(ferry_ucx_group_t *group);
void ferry_ucx_ack_forget(ferry_ucx_group_t *group, uint64_t id, ucs_status_t status);
void ferry_ucx_ack_send(ucp_ep_h reply_ep, uint64_t id, ferry_status_t status);
/* The endpoint closed: its eager writes still waiting fail. */
void ferry_ucx_eager_fail_ep(ferry_ucx_ep_t *ep);
ferry_status_t ferry_ucx_eager_register(ferry_ucx_worker_t *w);
/* The datatype eager writes send their bytes as (ucx->eager_dt). */
ferry_status_t ferry_ucx_eager_datatype_create(ferry_ucx_t *ucx);
void ferry_ucx_eager_datatype_destroy(ferry_ucx_t *ucx);
/* The worker is gone: free what is left in its table. */
void ferry_ucx_eager_fini(ferry_ucx_worker_t *w);

/* ---- ucx_ep.c ---- */
/* A referenced endpoint for the peer, created if needed.  FERRY_ERR_PEER_FAILED
 * (once) for a failed one, FERRY_ERR_UNSUPPORTED for an unreachable one. */
ferry_status_t ferry_ucx_ep_get(ferry_ucx_t *ucx, const ferry_peer_t *peer,
                                ferry_ucx_ep_t **ep_p);
void ferry_ucx_ep_unref(ferry_ucx_ep_t *ep);
/* What a batch keeps in its cache slot (ferry_peer_t.cache): the endpoint
 * its last submit went to, with a reference, and the endpoint string (the
 * descriptor's, by address) it was found by; the last key it looked up
 * there, by descriptor serial and address, with its entry and the
 * endpoint's flush count then (a flush frees the entry). */
typedef struct ferry_ucx_peer_cache {
    ferry_ucx_ep_t *ep;
    const char *endpoint;
    uint64_t key_serial; /* 0: no key kept */
    const char *key;
    ferry_ucx_rkey_t *key_entry;
    uint64_t key_flushes;
    /* With that key, the short path's last copy (ucx_xfer.c): length bytes
     * at remote_addr are at direct_ptr here (direct_length 0: none). */
    uint64_t direct_addr;
    size_t direct_length;
    void *direct_ptr;
} ferry_ucx_peer_cache_t;

/* The submitting batch's cache slot (peer->cache), if its endpoint is the
 * peer's: the same string (by address) with the same generation is the
 * same incarnation's endpoint, generations being random per incarnation.
 * Not locked, the endpoint maybe failed; the cache's reference keeps it
 * alive through the submit (the slot is the caller's alone meanwhile). */
static inline ferry_ucx_peer_cache_t *ferry_ucx_peer_cache_of(const ferry_peer_t *peer)
{
    ferry_ucx_peer_cache_t *cache = peer->cache ? *peer->cache : NULL;
    if (cache == NULL || cache->endpoint != peer->endpoint ||
        cache->ep->generation != peer->generation)
        return NULL;
    return cache;
}
/* Whether the slot's kept key is key (by address) from the same descriptor,
 * still in ep's table: a serial names one descriptor for the life of the
 * process, and a descriptor's strings never change. */
static inline int ferry_ucx_peer_cache_holds_key(const ferry_ucx_peer_cache_t *cache,
                                                 const ferry_peer_t *peer,
                                                 const ferry_ucx_ep_t *ep, const char *key)
{
    return cache->ep == ep && cache->key_serial != 0 &&
           cache->key_serial == peer->descriptor_serial && cache->key == key &&
           cache->key_flushes == ep->rkeys_flushes;
}
/* The same, if it is not failed or closed and was checked for liveness
 * lately: returned with ep->lock held.  NULL: use ferry_ucx_ep_get, then
 * ferry_ucx_ep_cache. */
ferry_ucx_ep_t *ferry_ucx_ep_lock_cached(const ferry_peer_t *peer);
/* A same-host peer not looked up in /proc for FERRY_UCX_LIVENESS_MS. */
int ferry_ucx_ep_liveness_due(ferry_ucx_ep_t *ep);
/* Look it up now: FERRY_ERR_PEER_FAILED (and the endpoint failed) when its
 * process is gone.  Caller holds a reference, not ep->lock. */
ferry_status_t ferry_ucx_ep_liveness_look(ferry_ucx_ep_t *ep);
/* Keep ep (referenced) in peer->cache, if there is a slot. */
void ferry_ucx_ep_cache(const ferry_peer_t *peer, ferry_ucx_ep_t *ep);
/* ferry_ucx_rkey_get through the batch's memo of its last key (peer->cache):
 * a submit with the previous one's key, from the same descriptor, reads
 * neither the key nor the table.  Caller holds ep->lock. */
ferry_status_t ferry_ucx_rkey_find(const ferry_peer_t *peer, ferry_ucx_ep_t *ep, const char *key,
                                   ferry_ucx_rkey_t **entry_p);
/* The transport's peer_cache_release op. */
void ferry_ucx_peer_cache_release(void *ctx, void *cached);
/* Mark failed (first status wins) and have the worker's thread close it. */
void ferry_ucx_ep_fail(ferry_ucx_ep_t *ep, ferry_status_t why, const char *what);
/* Close the ucp endpoint now, cancelling what is in flight. */
void ferry_ucx_ep_close(ferry_ucx_ep_t *ep);
int ferry_ucx_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key);
void ferry_ucx_peer_forget(void *ctx, const ferry_peer_t *peer);
void ferry_ucx_peer_changed(void *ctx, const ferry_peer_t *peer);
/* A same-host peer whose process is gone (or replaced) fails its endpoint. */
int ferry_ucx_ep_check_alive(ferry_ucx_ep_t *ep);
/* Progress thread: close queued endpoints, fail those past their deadline. */
void ferry_ucx_worker_housekeeping(ferry_ucx_worker_t *worker, int sweep);
void ferry_ucx_eps_destroy(ferry_ucx_t *ucx);

/* ---- ucx_xfer.c ---- */
ferry_status_t ferry_ucx_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);
ferry_ucx_group_t *ferry_ucx_group_new(ferry_ucx_ep_t *ep);
/* slice_done for every slice of the list. */
void ferry_ucx_slices_finish(const ferry_transport_services_t *svc, ferry_slice_t *slices,
                             ferry_status_t status);
/* Have a flush cover what the group posted (one now, or the next one);
 * caller holds ep->lock with the endpoint open. */
void ferry_ucx_group_post_flush(ferry_ucx_group_t *group);
/* Worker thread: post the flush the endpoint's waiting groups need. */
void ferry_ucx_flush_waiting(ferry_ucx_ep_t *ep);
/* Completion callback for any op of a group (user_data = group). */
void ferry_ucx_op_done(void *request, ucs_status_t status, void *user_data);
void ferry_ucx_group_unref_op(ferry_ucx_group_t *group, ucs_status_t status);
/* Record a failure for the group's slices (the first one wins). */
void ferry_ucx_group_fail(ferry_ucx_group_t *group, ucs_status_t status);

/* ---- ucx_am.c ---- */
ferry_status_t ferry_ucx_am_register(ferry_ucx_worker_t *worker);
/* Send an eager active message of just a (malloc-ed) header, freed once
 * sent or failed. */
void ferry_ucx_am_send_header(ucp_ep_h ep, unsigned id, void *header, size_t header_length);
/* Deliver active messages with that id to cb (arg: the worker), whole. */
ferry_status_t ferry_ucx_am_handler_set(ferry_ucx_worker_t *w, unsigned id,
                                        ucp_am_recv_callback_t cb);
ferry_status_t ferry_ucx_notify(void *ctx, const ferry_peer_t *peer, const char *from,
                                const void *msg, size_t length);
/* Tell the peer our RPC endpoint, so it invalidates our cache on unregister. */
void ferry_ucx_send_hello(ferry_ucx_ep_t *ep);

#endif
