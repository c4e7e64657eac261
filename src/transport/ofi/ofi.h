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
 *   o1:<key hex>:<base hex>:<length hex>[:<raw key hex>]
 * the MR key (fi_mr_key), the address the buffer was registered at and its
 * length; the raw key when the provider asks for FI_MR_RAW (the peer maps it
 * with fi_mr_map_raw).  With FI_MR_VIRT_ADDR a slice addresses the target
 * by its virtual address, otherwise by its offset from <base>.
 *
 * Objects and lifetimes:
 *   ferry_ofi_t       the transport: fabric, domain, the target endpoint
 *                     (published, serves peers' RMA), the peer table, one
 *                     progress thread.  Teardown order (ofi_context.c):
 *                     thread joined -> peers closed (their ops FAILED) ->
 *                     target endpoint -> registrations (by the engine) ->
 *                     domain -> fabric.
 *   ferry_ofi_peer_t  one peer incarnation (endpoint string + generation):
 *                     an initiator endpoint of its own, with its own CQ and
 *                     AV.  Own, because closing it is what stops the
 *                     provider from touching the local buffers of ops still
 *                     posted to a peer that stopped answering (README.md,
 *                     "Faults"), without touching other peers' ops.
 *   ferry_ofi_op_t    one posted fi_writemsg/fi_readmsg (one slice); its
 *                     fi_context2 is the CQ entry's op_context.
 *   ferry_ofi_mem_t   one registration (memh of mem_register).
 *
 * Peer references (refs): the table's (dropped when the peer leaves the
 * table: peer_forget, stop), one per caller between ferry_ofi_peer_get and
 * ferry_ofi_peer_put (submit, progress, the thread's sweep).  The last put
 * closes the endpoint (if still open) and frees the peer.
 *
 * Locks:
 *   ferry_ofi_t.lock       the peer table (peers, next).
 *   peer->ep_lock (rwlock) read: posting and reading the CQ (the provider
 *                          is FI_THREAD_SAFE); write: closing the endpoint.
 *                          ep, cq, av are NULL once closed.
 *   peer->lock (mutex)     ops list, posted, state, why, last_activity_ms.
 *   Never peer->lock while taking ep_lock; no lock across a blocking call.
 */
#ifndef FERRY_OFI_H
#define FERRY_OFI_H

#include <ferry/plugin.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
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
    int hmem;            /* HMEM */
} ferry_ofi_settings_t;

typedef enum ferry_ofi_peer_state {
    FERRY_OFI_PEER_OK = 0,
    FERRY_OFI_PEER_FAILED = 1, /* endpoint closed, ops failed; submit refuses */
} ferry_ofi_peer_state_t;

typedef struct ferry_ofi ferry_ofi_t;
typedef struct ferry_ofi_op ferry_ofi_op_t;

typedef struct ferry_ofi_peer {
    ferry_ofi_t *ofi;
    char *endpoint;       /* the descriptor's string (our copy) */
    uint64_t generation;
    long pid;             /* same kernel and pid namespace, else 0 */
    unsigned long long start_time;
    int pidfd;            /* pidfd_open(pid), or -1 */
    atomic_uint refs;
    atomic_uint_fast64_t checked_ms; /* last liveness look (same-host peers) */

    pthread_rwlock_t ep_lock;
    struct fid_ep *ep;
    struct fid_cq *cq;
    struct fid_av *av;
    fi_addr_t addr;

    pthread_mutex_t lock;
    ferry_ofi_op_t *ops;  /* posted, not completed (doubly linked) */
    unsigned posted;
    atomic_uint busy;     /* == posted, read without the lock */
    ferry_ofi_peer_state_t state;
    ferry_status_t why;   /* state FAILED: the status its ops got */
    uint64_t last_activity_ms; /* last completion, or the post that made posted 1 */

    struct ferry_ofi_peer *next; /* table; ferry_ofi_t.lock */
} ferry_ofi_peer_t;

struct ferry_ofi_op {
    struct fi_context2 context; /* first: what the CQ entry gives back */
    ferry_slice_t *slice;
    ferry_ofi_peer_t *peer;
    struct fid_mr *local_mr; /* registered for this op only (FI_MR_LOCAL), or NULL */
    uint64_t raw_key;        /* mapped with fi_mr_map_raw for this op (FI_MR_RAW) */
    int raw_mapped;
    ferry_ofi_op_t *prev, *next;
};

/* An endpoint that could not be closed safely (ofi_peer.c, must_park). */
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
                                looks a same-host peer up in /proc */
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
    atomic_uint_fast64_t next_key; /* chosen MR keys (no FI_MR_PROV_KEY) */
    atomic_uint next_name;   /* endpoints named so far (ferry_ofi_name_endpoint) */
    char *address;           /* our endpoint string; immutable after create */

    int park_on_silence;     /* tcp;ofi_rxm: see ofi_peer.c, must_park */
    pthread_mutex_t lock;    /* peers, parked */
    ferry_ofi_peer_t *peers;
    ferry_ofi_parked_t *parked; /* never closed: domain and fabric stay too */
    atomic_uint busy_peers;  /* peers with ops posted: the thread polls */

    pthread_t thread;
    int thread_started;
    atomic_int stop;
    int wake_fd;             /* eventfd: submit and progress_leave wake the thread */
    atomic_int sleeping;
    atomic_uint_fast64_t caller_polls; /* bumped by each progress op */
};

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
} ferry_ofi_key_t;
ferry_status_t ferry_ofi_key_parse(const char *text, ferry_ofi_key_t *key_p);
/* The op's local descriptor: the registration's, or an MR made for the op
 * (op->local_mr) where the provider needs one (FI_MR_LOCAL). */
ferry_status_t ferry_ofi_local_desc(ferry_ofi_t *ofi, ferry_ofi_op_t *op, void **desc_p);
/* Release what the op registered or mapped for itself. */
void ferry_ofi_op_release_mr(ferry_ofi_t *ofi, ferry_ofi_op_t *op);

/* ---- ofi_peer.c ---- */
/* The peer incarnation's entry (created and connected on first use),
 * referenced.  FERRY_ERR_PEER_FAILED: failed (or found dead); FERRY_ERR_STALE:
 * the entry of that endpoint has another generation; FERRY_ERR_CONNECT:
 * the endpoint string is bad or the provider refused the address. */
ferry_status_t ferry_ofi_peer_get(ferry_ofi_t *ofi, const ferry_peer_t *peer,
                                  ferry_ofi_peer_t **p_p);
void ferry_ofi_peer_put(ferry_ofi_peer_t *p);
/* Whether the peer's process is gone (same-host peers only; see ofi_peer.c). */
int ferry_ofi_peer_dead(ferry_ofi_peer_t *p);
/* Mark failed (first status wins), close the endpoint (or park it:
 * ofi_peer.c), fail its ops.  provider_saw_it: a CQ error entry said so. */
void ferry_ofi_peer_fail(ferry_ofi_peer_t *p, ferry_status_t why, const char *what,
                         int provider_saw_it);
int ferry_ofi_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key);
void ferry_ofi_peer_forget(void *ctx, const ferry_peer_t *peer);
/* Every peer referenced into a NULL-terminated array (malloc-ed); the
 * caller puts each. */
ferry_ofi_peer_t **ferry_ofi_peers_busy(ferry_ofi_t *ofi, size_t *count_p);
/* Fail peers whose ops have seen no completion for the timeout. */
void ferry_ofi_peers_sweep(ferry_ofi_t *ofi);
/* Leave the table and close every peer (stop). */
void ferry_ofi_peers_close_all(ferry_ofi_t *ofi);

/* ---- ofi_xfer.c ---- */
ferry_status_t ferry_ofi_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);
/* Read the peer's CQ and finish what completed; returns how many.  Caller
 * holds a reference. */
unsigned ferry_ofi_peer_progress(ferry_ofi_peer_t *p);
/* Drive the target endpoint (rxm and shm serve peers' RMA only while
 * somebody reads its CQ). */
unsigned ferry_ofi_target_progress(ferry_ofi_t *ofi);
/* Take the oldest op posted to the peer off its list (NULL: none).
 * Whoever takes an op off the list finishes it, exactly once. */
ferry_ofi_op_t *ferry_ofi_op_pop(ferry_ofi_peer_t *p);
/* Finish an op taken off the list: its slice done with status, freed. */
void ferry_ofi_op_complete(ferry_ofi_op_t *op, ferry_status_t status);

#endif
