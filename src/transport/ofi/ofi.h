/*
 * The ofi transport: one-sided RMA (fi_writemsg / fi_readmsg) through a
 * libfabric provider on reliable-datagram endpoints (FI_EP_RDM).  README.md
 * in this folder says what maps to what; this header says what each object
 * holds, which lock guards what, and who holds each reference.
 *
 * Endpoint string (the descriptor's "transports":{"ofi":...}):
 *   ofi1:<provider>:<boot id>:<pid namespace>:<pid>:<start time>:<address hex>
 * <provider> is fi_info's prov_name ("tcp;ofi_rxm", "shm", "verbs;ofi_rxm"),
 * <address hex> the fi_getname of our target endpoint.  Hex, not base64:
 * addresses are tens of bytes, and hex needs no code of its own.
 *
 * Buffer key (per buffer, "keys":{"ofi":...}):
 *   o1:<key hex>:<base hex>:<length hex>[:<raw base hex>:<raw key hex>]
 * the MR key (fi_mr_key), the address the buffer was registered at and its
 * length; under FI_MR_RAW the base and raw key fi_mr_raw_attr gave (the
 * peer maps them with fi_mr_map_raw).  With FI_MR_VIRT_ADDR a slice addresses the target
 * by its virtual address, otherwise by its offset from <base>.
 *
 * Objects and lifetimes:
 *   ferry_ofi_t       the transport: fabric, domain, the target endpoint
 *                     (published, serves peers' RMA, never closed while the
 *                     engine runs), the current lane, the peer list, one
 *                     progress thread.  Teardown order (ofi_context.c):
 *                     thread joined -> lane closed (every op FAILED) -> peers
 *                     dropped -> target endpoint -> registrations (by the
 *                     engine) -> domain -> fabric -> our /dev/shm names.
 *   ferry_ofi_lane_t  the one initiator endpoint every peer shares (own CQ
 *                     and AV; ofi_lane.c).  Replaced by a fresh one when a
 *                     silent peer must be fenced: closing the endpoint is
 *                     the only thing that makes the provider let go of the
 *                     local buffers of ops still posted (README.md, "Faults").
 *   ferry_ofi_peer_t  one peer incarnation (endpoint string + generation):
 *                     its ops (posted on the lane, or pending: not yet
 *                     accepted by the provider), its address on the lane.
 *   ferry_ofi_op_t    one slice: pending, then one fi_writemsg/fi_readmsg
 *                     posted on a lane; its fi_context2 is the CQ entry's
 *                     op_context.  A fence may move it back to pending.
 *   ferry_ofi_mem_t   one registration (memh of mem_register).
 *
 * Peer references (refs): the table's (dropped by peer_forget and stop;
 * in_table then 0), one per op (taken at submit, dropped when the op is
 * finished), one per caller between ferry_ofi_peer_get (or the busy list)
 * and ferry_ofi_peer_put.  A peer stays in ofi->peers until its last
 * reference goes (so a fence finds every op, a forgotten peer's too); the
 * last put unlinks it under ofi->lock and frees it.  Its address stays in
 * the lane's AV (never fi_av_remove: ofi_peer.c).  Lists taken under
 * ofi->lock reference a peer only if its refs are not already 0.
 *
 * Lane references: none are counted.  ofi->lane is read only under
 * lane_lock, read-held by whoever posts on it (submit's pump, the
 * thread's), or by the one reader of its CQ (lane_reading, ofi_xfer.c
 * cq_claim: the progress op, the thread), each for the length of that
 * call, never across a wait.  The fence and stop, which swap or close it,
 * hold both: the write lock and the CQ's claim (ferry_ofi_lane_claim,
 * taken after the write lock, before any other lock).  So no one can be
 * inside the old lane when it is closed, and a posted op records the lane
 * id it was posted on (not a pointer).  Across a swap: the fence holds
 * both while it closes the old lane and sorts its ops, sets ofi->lane to
 * NULL (posts then leave ops pending, CQ reads find nothing), drops them,
 * finishes the failed ops, opens the fresh lane with neither held, and
 * installs it under both again.  The old lane's memory is freed by the
 * fence (or kept in ofi->parked) once both have shut everybody out of it;
 * the thread, submit and the progress op only ever hold ofi->lane under
 * one of them, so none can still point at it.  A CQ read took the read
 * lock too until the seventh round's review: 21 ns a hold here, paid by
 * every look of a caller's spin.
 *
 * Locks, in the order they are taken:
 *   ferry_ofi_t.lane_lock (rwlock)  ofi->lane (pointer and endpoint);
 *                                   read: post, fi_av_insert
 *                                   (FI_THREAD_SAFE); write: swap or close
 *                                   the lane.
 *   ferry_ofi_t.lane_reading (claim) ofi->lane for its CQ's one reader;
 *                                   the fence and stop take it under the
 *                                   write lock, raising lane_wanted first
 *                                   so that readers stop claiming it.  Its
 *                                   holder takes peer->lock, nothing else.
 *   ferry_ofi_t.lock (mutex)        peers (list, in_table, next), parked.
 *   ferry_ofi_t.op_cache_lock       op_cache, op_cache_count; nothing is
 *                                   taken under it (a leaf; a mutex: as a
 *                                   spin lock it made shm 64 KiB writes
 *                                   ~5% slower on a host with more threads
 *                                   than cores, doc/performance.md "ofi,
 *                                   seventh round").
 *   peer->lock (mutex)              posted and pending lists and counts,
 *                                   state, why, last_activity_ms,
 *                                   lane_id, addr, attempted, connected,
 *                                   pumping.
 *   No lock is held across slice_done/slices_done, across a
 *   ferry_ofi_peer_put, or while a fresh lane is opened (a new rxm lane
 *   takes ~230 ms).
 */
#ifndef FERRY_OFI_H
#define FERRY_OFI_H

#include <ferry/plugin.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#define FERRY_OFI_ENDPOINT_PREFIX "ofi1:"
#define FERRY_OFI_KEY_PREFIX "o1:"
#define FERRY_OFI_API_VERSION FI_VERSION(1, 17)
#define FERRY_OFI_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define FERRY_OFI_MIN(a, b) ((a) < (b) ? (a) : (b))
/* A same-host peer is looked up in /proc before a submit when the last
 * look is this old (a restarted peer is noticed before anything is posted
 * to the dead one). */
#define FERRY_OFI_LIVENESS_MS 20
/* The same through the peer's pidfd (a poll), at most this often (on the
 * coarse clock: once per kernel tick, 1-4 ms, where it advances slower). */
#define FERRY_OFI_PIDFD_MS 1
/* While ops are posted, the target endpoint's CQ is read on every this
 * many looks (ofi_context.c, progress_all). */
#define FERRY_OFI_TARGET_EVERY 4
/* Without a count of RMA served (tcp;ofi_rxm has no FI_RMA_EVENT), a read
 * of the target CQ that found no entry but took this long served a peer's
 * RMA: an empty look is an epoll_wait of no ready socket (~1 us here),
 * serving a 64 KiB read a 64 KiB sendmsg (tens).  It counts as the
 * target's event, so its thread spins on through a stream of requests
 * instead of sleeping on the fd once per FD_SPIN window (a wakeup, and
 * an empty pipeline behind it, mid-stream; ofi_context.c, idle_look). */
#define FERRY_OFI_SERVED_US 5
/* In a spin window the progress thread yields the core on every this many
 * empty looks (ofi_context.c, spin_look). */
#define FERRY_OFI_YIELD_EVERY 8
/* Finished ops kept for reuse (ofi_xfer.c). */
#define FERRY_OFI_OP_CACHE 1024
/* CQ entries read per call. */
#define FERRY_OFI_CQ_BATCH 32

typedef struct ferry_ofi_settings {
    char *provider;      /* PROVIDER: "" = the first hardware provider */
    size_t slice_size;   /* SLICE_SIZE */
    unsigned window;     /* WINDOW: ops posted per peer (also <= tx_attr->size) */
    unsigned timeout_ms; /* TIMEOUT */
    char *completion;    /* COMPLETION: delivery | transmit */
    char *progress;      /* PROGRESS: wait | poll */
    unsigned nap_us;     /* NAP */
    unsigned spin_us;    /* SPIN */
    char *fd_spin;       /* FD_SPIN: "auto" or microseconds */
    unsigned fd_spin_us; /* FD_SPIN as a number (not auto) */
    int fd_spin_auto;    /* FD_SPIN=auto: ofi_context.c, fd_spin_window */
    int hmem;            /* HMEM */
} ferry_ofi_settings_t;

typedef enum ferry_ofi_peer_state {
    FERRY_OFI_PEER_OK = 0,
    FERRY_OFI_PEER_FAILED = 1, /* ops failed or failing; submit refuses */
} ferry_ofi_peer_state_t;

typedef struct ferry_ofi ferry_ofi_t;
typedef struct ferry_ofi_op ferry_ofi_op_t;

/* The shared initiator endpoint (ofi_lane.c). */
typedef struct ferry_ofi_lane {
    uint64_t id;         /* 1, 2, ...: which lane a peer's address or an op belongs to */
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    /* tcp;ofi_rxm: a peer failed here after its posts were refused
     * (-FI_EAGAIN: rxm was still connecting) and never accepted: rxm keeps
     * a connection attempt to it pending, and closing such an endpoint
     * crashed libfabric 1.17.  The lane is parked instead of closed. */
    atomic_int suspect;
} ferry_ofi_lane_t;

typedef struct ferry_ofi_peer {
    ferry_ofi_t *ofi;
    char *endpoint;       /* the descriptor's string (our copy) */
    uint64_t generation;
    void *address;        /* the peer's target address (fi_av_insert), for every lane */
    size_t address_length;
    long pid;             /* same kernel and pid namespace, else 0 */
    unsigned long long start_time;
    int pidfd;            /* pidfd_open(pid), or -1 */
    atomic_uint refs;
    atomic_uint_fast64_t checked_ms; /* last liveness look (same-host peers) */
    atomic_int dead;      /* seen gone once: never looked at again */

    pthread_mutex_t lock;
    ferry_ofi_op_t *posted_ops;  /* accepted by the provider (doubly linked) */
    unsigned posted;
    ferry_ofi_op_t *pending_head, *pending_tail; /* not yet accepted, in order */
    unsigned pending;
    /* written under the lock; read under it, or without it in one acquire
     * load (peer_state: a submit's look at a cached peer took the lock for
     * this alone) */
    _Atomic(ferry_ofi_peer_state_t) state;
    ferry_status_t why;   /* state FAILED: the status its ops get */
    uint64_t last_activity_ms; /* last completion or accepted post, or when it became busy */
    uint64_t lane_id;     /* the lane addr is valid on; 0: not inserted */
    fi_addr_t addr;
    int attempted;        /* a post was tried on lane_id */
    int connected;        /* a post was accepted on lane_id */
    int pumping;          /* somebody posts its pending ops now */
    atomic_uint busy;     /* posted + pending, read without the lock */
    atomic_int forgotten; /* peer_forget dropped it: batch caches look it up again */

    int in_table;                /* ofi->lock */
    struct ferry_ofi_peer *next; /* ofi->peers; ofi->lock */
} ferry_ofi_peer_t;

struct ferry_ofi_op {
    struct fi_context2 context; /* first: what the CQ entry gives back */
    ferry_slice_t *slice;
    ferry_ofi_peer_t *peer;  /* referenced */
    uint64_t rma_addr;       /* the target address as the provider wants it */
    uint64_t rkey;           /* the key, mapped when FI_MR_RAW */
    uint64_t lane_id;        /* posted on that lane */
    struct fid_mr *local_mr; /* registered for this op only (FI_MR_LOCAL), or NULL */
    uint64_t raw_key;        /* mapped with fi_mr_map_raw for this op (FI_MR_RAW) */
    int raw_mapped;
    ferry_ofi_op_t *prev, *next;
};

/* A lane that could not be closed safely (ofi_lane.c, must_park). */
typedef struct ferry_ofi_parked {
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    struct fid_domain *domain; /* the one that holds the transport's own */
    struct fid_fabric *fabric;
    struct ferry_ofi_parked *next;
} ferry_ofi_parked_t;

typedef struct ferry_ofi_mem {
    struct fid_mr *mr;
    void *desc; /* fi_mr_desc, for local use under FI_MR_LOCAL */
    void *addr;
    size_t length;
} ferry_ofi_mem_t;

struct ferry_ofi {
    ferry_transport_services_t svc;
    ferry_ofi_settings_t settings;
    int poll_mode;           /* PROGRESS=poll */
    uint64_t write_flags;    /* FI_DELIVERY_COMPLETE or FI_TRANSMIT_COMPLETE */
    struct fi_info *info;    /* the provider in use */
    int software;            /* a software provider (tcp, shm, ...) */
    int silent_deaths;       /* a dead peer gives no CQ error (shm): the sweep
                                looks a same-host peer up (pidfd) */
    int target_copies;       /* the target moves a write's bytes (shm: its CMA
                                copy), so a busy initiator may back off; on
                                rxm our own CQ reads move them */
    int mr_mode;             /* info->domain_attr->mr_mode */
    int hmem;                /* FI_HMEM asked and offered */
    unsigned window;         /* min(settings.window, tx_attr->size) */
    struct fid_fabric *fabric;
    struct fid_domain *domain;
    /* The target endpoint: its address is published; peers' RMA lands in
     * memory registered on this domain (bound to it under FI_MR_ENDPOINT). */
    struct fid_ep *target_ep;
    struct fid_cq *target_cq;
    struct fid_av *target_av;
    int target_fd;           /* the target CQ's wait fd, or -1 (shm has none) */
    /* Counts peers' RMA served by the target endpoint (FI_RMA_EVENT, where
     * the provider offers it: shm), or NULL: the only sign that a peer is
     * using us, since served RMA leaves no CQ entry. */
    struct fid_cntr *target_cntr;
    atomic_uint_fast64_t target_served; /* its last value read */
    /* 1 while a thread reads that CQ (ofi_xfer.c, cq_claim): a second
     * reader goes on instead of waiting for the provider's lock. */
    atomic_int target_reading;
    atomic_int lane_reading;
    /* 1 while the fence or stop waits for lane_reading: readers do not
     * claim it meanwhile (ferry_ofi_lane_claim) */
    atomic_int lane_wanted;
    atomic_int lane_posting; /* runs of posts under way (pump_locked) */
    atomic_uint_fast64_t next_key; /* chosen MR keys (no FI_MR_PROV_KEY) */
    atomic_uint next_name;   /* endpoints named so far (ferry_ofi_name_endpoint) */
    char *address;           /* our endpoint string; immutable after create */

    pthread_rwlock_t lane_lock;
    ferry_ofi_lane_t *lane;  /* NULL: stopped, or a fresh lane could not be opened */
    atomic_uint_fast64_t lanes_opened;
    atomic_uint lanes_closed; /* fences so far (tests and logs) */

    int park_on_silence;     /* tcp;ofi_rxm: see ofi_lane.c, must_park */
    pthread_mutex_t lock;    /* peers, parked */
    ferry_ofi_peer_t *peers; /* every peer alive, in the table or not */
    ferry_ofi_parked_t *parked; /* never closed: domain and fabric stay too */
    atomic_uint busy_peers;  /* peers with ops posted or pending: the thread polls */
    atomic_uint pending_ops; /* ops pending on all peers: the thread pumps */

    /* Finished ops kept for the next submits (at most FERRY_OFI_OP_CACHE):
     * a submit takes its ops and a CQ read's worth of finished ops goes
     * back in one lock hold each, instead of a calloc and a free per op. */
    pthread_mutex_t op_cache_lock;
    ferry_ofi_op_t *op_cache;
    unsigned op_cache_count;

    pthread_t thread;
    int thread_started;
    atomic_int stop;
    int wake_fd;             /* eventfd: submit and progress_leave wake the thread */
    atomic_int sleeping;
    /* The thread naps because callers drive progress (their progress op):
     * a submit does not wake it (the caller that waits drives its request;
     * the nap ends within 1 ms, or at the caller's progress_leave). */
    atomic_int caller_nap;
    atomic_uint_fast64_t caller_polls; /* bumped by each progress op */
    atomic_uint_fast64_t caller_leaves; /* bumped by each progress_leave */
    atomic_uint_fast64_t target_turn; /* looks while busy: the target CQ every TARGET_EVERY-th */
};

/* A counter that only has to move (caller_polls, target_turn), bumped with
 * a plain load and store: two callers bumping it at once may count one
 * look, which neither reader minds, where a locked add cost each look of
 * a caller's spin ~6 ns. */
static inline uint64_t ferry_ofi_bump(atomic_uint_fast64_t *counter)
{
    uint64_t value = atomic_load_explicit(counter, memory_order_relaxed);
    atomic_store_explicit(counter, value + 1, memory_order_relaxed);
    return value;
}

/* ---- ofi_plugin.c ---- */
extern const ferry_setting_t ferry_ofi_settings_table[];
extern const size_t ferry_ofi_settings_count;
uint64_t ferry_ofi_time_ms(void);
/* The provider's error (negative fi_errno) as a Ferry status. */
ferry_status_t ferry_ofi_status(int fi_error);
/* Hex text of bytes (malloc-ed) and back (NULL on bad text). */
char *ferry_ofi_hex_encode(const void *data, size_t length);
void *ferry_ofi_hex_decode(const char *text, size_t text_length, size_t *length_p);

/* ---- ofi_context.c ---- */
/* Choose the provider and open fabric, domain and the target endpoint;
 * start the progress thread.  FERRY_ERR_UNSUPPORTED: no provider to use
 * and none named (the transport stays off). */
ferry_status_t ferry_ofi_context_start(ferry_ofi_t *ofi);
/* The transport's stop op: the thread joined, every peer closed. */
void ferry_ofi_context_quiesce(ferry_ofi_t *ofi);
/* After quiesce and the engine's deregistrations: endpoint, domain, fabric. */
void ferry_ofi_context_close(ferry_ofi_t *ofi);
void ferry_ofi_wake(ferry_ofi_t *ofi);
unsigned ferry_ofi_progress(void *ctx);
void ferry_ofi_progress_leave(void *ctx);
void ferry_ofi_print_info(FILE *out);
/* Name an endpoint before fi_enable where the provider takes the name from
 * us and would otherwise derive it from the pid (shm: a region in /dev/shm
 * that a killed process leaves behind, which made the next process given
 * that pid fail fi_enable with EBUSY). */
int ferry_ofi_name_endpoint(ferry_ofi_t *ofi, struct fid_ep *ep);
/* AV and endpoint (bound to cq, the AV and cntr if not NULL, named,
 * enabled) of what. */
ferry_status_t ferry_ofi_endpoint_open(ferry_ofi_t *ofi, struct fid_cq *cq, struct fid_cntr *cntr,
                                       struct fid_av **av_p, struct fid_ep **ep_p,
                                       const char *what);
uint64_t ferry_ofi_time_us(void);
/* Whether the provider's core (the part before ';') is software. */
int ferry_ofi_provider_is_software(const char *prov_name);

/* ---- ofi_mem.c ---- */
ferry_status_t ferry_ofi_mem_register(void *ctx, void *addr, size_t length,
                                      const char *location, char **key_p, void **memh_p);
void ferry_ofi_mem_deregister(void *ctx, void *memh);
/* A key string parsed. */
typedef struct ferry_ofi_key {
    uint64_t key;
    uint64_t base;
    uint64_t length;
    void *raw;          /* malloc-ed, or NULL */
    size_t raw_length;
    uint64_t raw_base;  /* fi_mr_raw_attr's base, for fi_mr_map_raw */
} ferry_ofi_key_t;
ferry_status_t ferry_ofi_key_parse(const char *text, ferry_ofi_key_t *key_p);
/* The op's local descriptor for a post on ep: the registration's, or an MR
 * made for the op (op->local_mr) where the provider needs one (FI_MR_LOCAL). */
ferry_status_t ferry_ofi_local_desc(ferry_ofi_t *ofi, ferry_ofi_op_t *op, struct fid_ep *ep,
                                    void **desc_p);
/* Release what the op registered for itself (local_mr). */
void ferry_ofi_op_release_local(ferry_ofi_op_t *op);
/* Release what the op registered or mapped for itself. */
void ferry_ofi_op_release_mr(ferry_ofi_t *ofi, ferry_ofi_op_t *op);

/* What a batch keeps in its cache slot (ferry_peer_t.cache) between its
 * submits: the peer it submitted to last (referenced) and the last key it
 * parsed, found again by (descriptor_serial, key string address) without
 * reading the string.  Released by peer_cache_release. */
typedef struct ferry_ofi_batch_cache {
    ferry_ofi_peer_t *peer;
    uint64_t descriptor_serial;
    const char *endpoint;    /* peer->endpoint's address in that descriptor */
    const char *key_text;    /* NULL: no key kept */
    ferry_ofi_key_t key;     /* raw always NULL: FI_MR_RAW keys are not kept */
} ferry_ofi_batch_cache_t;

/* ---- ofi_lane.c ---- */
/* Open the first lane (context start). */
ferry_status_t ferry_ofi_lane_start(ferry_ofi_t *ofi);
/* A peer of the lane with that id went silent with ops posted on it: close
 * (or park) the lane, fail the ops of every failed peer, put every other
 * peer's unfinished ops back to pending, and open a fresh lane.  Nothing
 * when the lane was already replaced.  No lock held by the caller. */
void ferry_ofi_lane_fence(ferry_ofi_t *ofi, uint64_t lane_id, const char *why);
/* Stop: close (or park) the lane; every op posted or pending fails with
 * FERRY_ERR_CANCELED.  After the thread is joined. */
void ferry_ofi_lane_stop(ferry_ofi_t *ofi);
/* The peer's address on the current lane (inserted on first use of each
 * lane).  Caller holds lane_lock for reading and p->lock. */
int ferry_ofi_lane_address(ferry_ofi_t *ofi, ferry_ofi_lane_t *lane, ferry_ofi_peer_t *p);
/* A peer failed after its posts were refused and none accepted (rxm still
 * connecting): that lane must never be closed (ofi_lane.c, must_park). */
void ferry_ofi_lane_suspect(ferry_ofi_t *ofi, uint64_t lane_id);

/* ---- ofi_peer.c ---- */
/* The peer incarnation's entry (created on first use), referenced.
 * FERRY_ERR_PEER_FAILED: failed (or found dead); FERRY_ERR_STALE: the
 * entry of that endpoint has another generation; FERRY_ERR_CONNECT: the
 * endpoint string is bad. */
ferry_status_t ferry_ofi_peer_get(ferry_ofi_t *ofi, const ferry_peer_t *peer,
                                  ferry_ofi_peer_t **p_p);
/* The same through the batch's cache slot (peer->cache) when it names that
 * peer incarnation, else peer_get, and the slot then keeps it. */
ferry_status_t ferry_ofi_peer_get_cached(ferry_ofi_t *ofi, const ferry_peer_t *peer,
                                         ferry_ofi_peer_t **p_p);
/* Another reference to a peer the caller holds one of. */
void ferry_ofi_peer_ref(ferry_ofi_peer_t *p, unsigned count);
void ferry_ofi_peer_put(ferry_ofi_peer_t *p);
/* Whether the peer's process is gone (same-host peers only; see ofi_peer.c). */
int ferry_ofi_peer_dead(ferry_ofi_peer_t *p);
/* Mark failed (first status wins), fail its pending ops, and fence the
 * lane when ops of it are posted there and the provider will not say
 * (provider_saw_it: a CQ error entry said so, and rxm reports every other
 * op of that peer the same way).  No lock held by the caller. */
void ferry_ofi_peer_fail(ferry_ofi_peer_t *p, ferry_status_t why, const char *what,
                         int provider_saw_it);
int ferry_ofi_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key);
void ferry_ofi_peer_forget(void *ctx, const ferry_peer_t *peer);
/* Every busy peer referenced into an array (malloc-ed); the caller puts each. */
ferry_ofi_peer_t **ferry_ofi_peers_busy(ferry_ofi_t *ofi, size_t *count_p);
/* Fail peers that are gone, or whose ops have seen nothing for the timeout. */
void ferry_ofi_peers_sweep(ferry_ofi_t *ofi);
/* Drop the table's references (stop, after the lane is closed). */
void ferry_ofi_peers_close_all(ferry_ofi_t *ofi);

/* ---- ofi_xfer.c ---- */
ferry_status_t ferry_ofi_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);
void ferry_ofi_peer_cache_release(void *ctx, void *cached);
/* Post the peer's pending ops while its window has room and the lane
 * accepts them; returns how many were posted.  Caller holds a reference. */
unsigned ferry_ofi_peer_pump(ferry_ofi_peer_t *p);
/* The lane's CQ claimed, waiting for its reader to finish (the fence and
 * stop, under lane_lock's write hold: ofi.h, "Lane references"), and
 * given back. */
void ferry_ofi_lane_claim(ferry_ofi_t *ofi);
void ferry_ofi_lane_unclaim(ferry_ofi_t *ofi);
/* Read the lane's CQ and finish what completed; returns how many. */
unsigned ferry_ofi_lane_progress(ferry_ofi_t *ofi);
/* Drive the target endpoint (rxm and shm serve peers' RMA only while
 * somebody reads its CQ). */
unsigned ferry_ofi_target_progress(ferry_ofi_t *ofi);
/* Op lists (caller holds p->lock). */
void ferry_ofi_posted_link(ferry_ofi_peer_t *p, ferry_ofi_op_t *op);
void ferry_ofi_posted_unlink(ferry_ofi_peer_t *p, ferry_ofi_op_t *op);
void ferry_ofi_pending_push_front(ferry_ofi_peer_t *p, ferry_ofi_op_t *op);
ferry_ofi_op_t *ferry_ofi_pending_pop(ferry_ofi_peer_t *p);
/* Finish a chain of ops (linked by next) taken off their lists with one
 * status: slices done, peer references dropped, ops freed. */
void ferry_ofi_ops_finish(ferry_ofi_t *ofi, ferry_ofi_op_t *ops, ferry_status_t status);
/* Free the ops kept for reuse (destroy, after the lane is closed). */
void ferry_ofi_op_cache_free(ferry_ofi_t *ofi);

#endif
