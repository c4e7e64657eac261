/* The engine's internal objects: registry, descriptors, segment cache,
 * batches, plugins.  Locking rules are stated next to each structure. */
#ifndef FERRY_CORE_H
#define FERRY_CORE_H

#include "../util/util.h"

#define FERRY_MAX_TRANSPORTS 8
#define FERRY_ACCEL_VENDORS_MAX 4
#define FERRY_DESCRIPTOR_VERSION 1
#define FERRY_LOCAL_TRANSPORT_NAME "local"

typedef struct ferry_engine ferry_engine_t;
typedef struct ferry_batch ferry_batch_t;

/* ---------------- plugin.c: built-in and loadable plugins ---------------- */

typedef struct ferry_plugin_list {
    const ferry_plugin_t *plugins[32];
    size_t count;
} ferry_plugin_list_t;

/* Find a plugin by kind and name: built-in first, then module_dir. */
ferry_status_t ferry_plugin_find(const char *module_dir, ferry_plugin_kind_t kind,
                                 const char *name, const ferry_plugin_t **plugin_p);
/* Whether that plugin is built in or loads from module_dir (logs nothing). */
int ferry_plugin_available(const char *module_dir, ferry_plugin_kind_t kind, const char *name);
/* Every built-in plugin and every module found in module_dir. */
void ferry_plugin_list_all(const char *module_dir, ferry_plugin_list_t *list);
void ferry_plugin_list_release(ferry_plugin_list_t *list);
const char *ferry_plugin_default_dir(void);
int ferry_plugin_is_builtin(const ferry_plugin_t *plugin);

/* ---------------- registry.c: the engine's registered ranges ---------------- */

typedef struct ferry_reg_entry {
    uintptr_t addr;
    size_t length;
    char *location;
    unsigned flags;             /* FERRY_REG_REMOTE_* */
    unsigned refs;              /* registrations of this exact range; registry lock */
    uint64_t epoch;             /* registration order; published once <= published_epoch */
    /* Accesses holding the range (transfers), and FERRY_REG_DYING once
     * unregister started (no new accesses): one word, so the release that
     * lets the count drop to 0 is the releaser's last touch of the entry. */
    atomic_uint holds;
    void *memh[FERRY_MAX_TRANSPORTS];
    char *keys[FERRY_MAX_TRANSPORTS];
    /* ferry_alloc memory: the transport that allocated it (its memh frees
     * it, after every other transport let go), or FERRY_ALLOC_HEAP. */
    int allocated;
    int alloc_transport;
    /* Device memory: its vendor (set at registration, from the location
     * agreed with the pointer); NULL for host memory. */
    const ferry_accel_ops_t *accel;
    /* The registry's tree (its lock): children (0 left, 1 right) and the
     * subtree's height. */
    struct ferry_reg_entry *tree_child[2];
    int tree_height;
} ferry_reg_entry_t;
#define FERRY_ALLOC_HEAP (-1)
#define FERRY_ALLOC_DEVICE (-2) /* ferry_alloc memory from entry->accel's mem_alloc */
#define FERRY_REG_DYING 0x80000000u

/* n more holds on an entry the caller holds already (so it cannot go
 * meanwhile): the holds of a run of requests on one buffer, taken at once. */
static inline void ferry_reg_entry_hold_more(ferry_reg_entry_t *entry, unsigned n)
{
    atomic_fetch_add_explicit(&entry->holds, n, memory_order_relaxed);
}

/* Take a hold on an entry found without the registry lock (a batch's kept
 * entry): 0 if it is dying. */
static inline int ferry_reg_entry_hold(ferry_reg_entry_t *entry)
{
    if (atomic_load_explicit(&entry->holds, memory_order_relaxed) & FERRY_REG_DYING)
        return 0;
    atomic_fetch_add_explicit(&entry->holds, 1, memory_order_acquire);
    return 1;
}

/*
 * Entries ordered by address (an AVL tree through the entries).  `lock`
 * (rwlock) protects root, count and the entries' tree fields: lookups
 * read-lock it briefly, insert and remove write-lock it.
 * Register and unregister are serialized by the engine's registration mutex,
 * so transports register outside `lock`.
 */
typedef struct ferry_registry {
    pthread_rwlock_t lock;
    ferry_reg_entry_t *root;
    size_t count;
    pthread_mutex_t drain_lock; /* with `drained`: waits for an entry's holds to end */
    pthread_cond_t drained;
} ferry_registry_t;

void ferry_registry_init(ferry_registry_t *registry);
void ferry_registry_fini(ferry_registry_t *registry);
/* Identical range: *entry_p is the existing entry (refs not yet taken),
 * *is_new 0.  Partial overlap: FERRY_ERR_OVERLAP. */
ferry_status_t ferry_registry_check(ferry_registry_t *registry, uintptr_t addr, size_t length,
                                    ferry_reg_entry_t **entry_p);
ferry_status_t ferry_registry_insert(ferry_registry_t *registry, ferry_reg_entry_t *entry);
/* Entry whose range starts at addr. */
ferry_reg_entry_t *ferry_registry_find_start(ferry_registry_t *registry, uintptr_t addr);
/* Remove from the ordered set and mark dying: new accesses are refused. */
void ferry_registry_remove(ferry_registry_t *registry, ferry_reg_entry_t *entry);
/* Wait until no access holds the entry. */
void ferry_registry_drain(ferry_registry_t *registry, ferry_reg_entry_t *entry);
/* Hold the entry containing [addr, addr+length), if `need` flags allow. */
ferry_reg_entry_t *ferry_registry_acquire(ferry_registry_t *registry, uintptr_t addr,
                                          size_t length, unsigned need);
void ferry_registry_release(ferry_registry_t *registry, ferry_reg_entry_t *entry);
/* Give back that many holds at once (a run of requests on one buffer). */
void ferry_registry_release_n(ferry_registry_t *registry, ferry_reg_entry_t *entry,
                              unsigned holds);
/* In address order; the caller holds the lock (read) throughout.  The
 * stack bounds an AVL tree's height for any count that fits in memory. */
typedef struct ferry_registry_iter {
    ferry_reg_entry_t *stack[96];
    int depth;
} ferry_registry_iter_t;
void ferry_registry_iter_init(ferry_registry_iter_t *it, const ferry_registry_t *registry);
ferry_reg_entry_t *ferry_registry_iter_next(ferry_registry_iter_t *it);
ferry_reg_entry_t *ferry_reg_entry_new(uintptr_t addr, size_t length, const char *location,
                                       unsigned flags);
void ferry_reg_entry_free(ferry_reg_entry_t *entry);

/* ---------------- descriptor.c: the segment descriptor and its codec ---------------- */

typedef struct ferry_desc_transport {
    char *name;
    char *endpoint;
} ferry_desc_transport_t;

typedef struct ferry_desc_buffer {
    uint64_t addr;
    uint64_t length;
    char *location;
    unsigned access;   /* FERRY_REG_REMOTE_READ | _WRITE */
    char **keys;       /* [n_transports]; NULL where a transport has no key */
    /* Not part of the value: the owning engine's transport selection for
     * this buffer, 0 until made, else (engine index + 1) | (index in
     * transports + 1) << 16.  Its inputs are fixed for this descriptor. */
    atomic_int route;
} ferry_desc_buffer_t;

/* Immutable once built; shared by reference count. */
typedef struct ferry_descriptor {
    atomic_uint refs;
    char *name;
    uint64_t generation;
    char *host_id;
    char *rpc;
    size_t n_transports;
    ferry_desc_transport_t *transports;
    size_t n_buffers;
    ferry_desc_buffer_t *buffers; /* sorted by addr, disjoint */
    /* Not part of the value either.  serial: no other descriptor of this
     * process has it (ferry_peer_t.descriptor_serial).  same_host: the
     * owning engine's host comparison, 0 until made, else 1 (other host)
     * or 2 (ours). */
    uint64_t serial;
    atomic_int same_host;
    /* Whether its owner serves this same descriptor (confirm.c):
     * FERRY_DESC_UNCONFIRMED until asked. */
    atomic_int confirmed;
} ferry_descriptor_t;

enum {
    FERRY_DESC_UNCONFIRMED = 0,
    FERRY_DESC_CONFIRMED = 1,
    FERRY_DESC_REFUSED = 2,
};

ferry_descriptor_t *ferry_descriptor_new(void);
ferry_descriptor_t *ferry_descriptor_ref(ferry_descriptor_t *desc);
void ferry_descriptor_unref(ferry_descriptor_t *desc);
/* JSON text, malloc-ed. */
ferry_status_t ferry_descriptor_encode(const ferry_descriptor_t *desc, char **json_p);
/* Strict: any type error, missing field, overflow or overlap is FERRY_ERR_DECODE. */
ferry_status_t ferry_descriptor_decode(const char *json, size_t length,
                                       ferry_descriptor_t **desc_p);
/* Sort buffers and reject overlaps (the decoder and the builder use it). */
ferry_status_t ferry_descriptor_finish(ferry_descriptor_t *desc);
/* Buffer containing [addr, addr+length) or NULL. */
const ferry_desc_buffer_t *ferry_descriptor_find(const ferry_descriptor_t *desc, uint64_t addr,
                                                 uint64_t length);
int ferry_descriptor_transport_index(const ferry_descriptor_t *desc, const char *name);

/* ---------------- segment_cache.c: opened remote segments ---------------- */

typedef struct ferry_segment {
    uint64_t handle;
    char *name;
    unsigned opens;          /* cache lock */
    int is_local;            /* this engine's own segment */
    pthread_mutex_t lock;    /* desc, fetching, stale */
    pthread_cond_t changed;
    ferry_descriptor_t *desc;
    int fetching;
    ferry_status_t fetch_status;
    int stale;               /* invalidated by its owner: refresh before use */
    /* Changes (under lock) with desc and stale, from a process-wide count,
     * so a (segment, version) pair names one descriptor for good; 0 for our
     * own segment, whose descriptor is not cached here. */
    atomic_uint_fast64_t version;
    /* segment_copiers.c: one-sided requests in flight, counted by epoch;
     * drain_lock serializes drains (each flips copier_epoch). */
    atomic_uint copiers[2];
    atomic_int copier_epoch;
    pthread_mutex_t drain_lock;
    struct ferry_segment *next; /* cache lock */
} ferry_segment_t;

typedef struct ferry_segment_cache {
    pthread_mutex_t lock; /* list and opens */
    ferry_segment_t *list;
} ferry_segment_cache_t;

void ferry_segment_cache_init(ferry_segment_cache_t *cache);
void ferry_segment_cache_fini(ferry_engine_t *engine, ferry_segment_cache_t *cache);
ferry_status_t ferry_segment_cache_open(ferry_engine_t *engine, const char *name,
                                        ferry_segment_t **segment_p);
void ferry_segment_cache_close(ferry_engine_t *engine, ferry_segment_t *segment);
/* The current descriptor (referenced), refreshing first if it was invalidated. */
ferry_status_t ferry_segment_descriptor(ferry_engine_t *engine, ferry_segment_t *segment,
                                        ferry_descriptor_t **desc_p);
/* The same, with the segment's version for ferry_segment_still_current. */
ferry_status_t ferry_segment_descriptor_versioned(ferry_engine_t *engine,
                                                  ferry_segment_t *segment,
                                                  ferry_descriptor_t **desc_p,
                                                  uint64_t *version_p);
/* Whether the descriptor that came with version is still the segment's
 * current one (not replaced, not invalidated), without the lock: a caller
 * that holds a reference on it may use it again instead of asking anew. */
static inline int ferry_segment_still_current(const ferry_segment_t *segment, uint64_t version)
{
    return version != 0 &&
           atomic_load_explicit(&segment->version, memory_order_acquire) == version;
}
/* Fetch again; if seen != NULL only when the cached one is still `seen`
 * (so racing threads refresh once). */
ferry_status_t ferry_segment_refetch(ferry_engine_t *engine, ferry_segment_t *segment,
                                     const ferry_descriptor_t *seen);
ferry_status_t ferry_segment_cache_refresh(ferry_engine_t *engine, const char *name);
/* The owner said its descriptor changed: new requests resolve anew, and
 * the one-sided copies in flight to it end before this returns (within
 * drain_ms; 0: no wait), FERRY_ERR_TIMEOUT if some did not. */
ferry_status_t ferry_segment_cache_invalidate(ferry_engine_t *engine, const char *name,
                                              uint64_t generation, unsigned drain_ms);
/* segment_copiers.c.  Before a one-sided transport copies for requests
 * resolved at version: count that many copies in (*epoch_p) unless the
 * segment changed since (FERRY_ERR_STALE, nothing counted: resolve again). */
ferry_status_t ferry_segment_copier_enter(ferry_segment_t *segment, uint64_t version,
                                          unsigned copies, int *epoch_p);
/* That many requests counted in at epoch ended: their last touch of the
 * segment. */
void ferry_segment_copier_exit(ferry_segment_t *segment, int epoch, unsigned copies);
/* Wait for the copies counted in before this call (after a change of the
 * segment's version); FERRY_ERR_TIMEOUT when some still run at the bound. */
ferry_status_t ferry_segment_copiers_drain(ferry_segment_t *segment, unsigned timeout_ms);
/* Before the segment is freed: every copy ended. */
void ferry_segment_copiers_wait_all(ferry_segment_t *segment);
/* ferry_metadata_services_t.segment_changed */
void ferry_segment_cache_changed(void *engine, const char *name);

/* ---------------- engine.c ---------------- */

typedef struct ferry_transport_instance {
    const ferry_plugin_t *plugin;
    const ferry_transport_ops_t *ops;
    void *ctx;
    char *address;
    size_t slice_size; /* ops->slice_size, asked once: 0 = no slicing */
    int one_sided;     /* FERRY_TRANSPORT_ONE_SIDED: requests count as copiers */
    /* Bit i: submit takes local device memory of the engine's accel[i]
     * (ops->local_memory), asked once after create; else the engine stages. */
    unsigned local_device;
} ferry_transport_instance_t;

typedef struct ferry_subscriber {
    char *rpc;
    struct ferry_subscriber *next;
} ferry_subscriber_t;

typedef struct ferry_notify_item {
    ferry_notify_t notify;
    struct ferry_notify_item *next;
} ferry_notify_item_t;

typedef struct ferry_engine_settings {
    char *segment_name;
    char *metadata;
    char *rpc_address;
    char *transports;
    char *module_dir;
    char *host_id;
    unsigned rpc_timeout_ms;
    size_t rpc_max_frame;
    unsigned rpc_idle_timeout_ms;
    unsigned rpc_max_conns;
    unsigned rpc_max_conns_per_source;
    unsigned invalidate_timeout_ms;
    int confirm_descriptors;
    unsigned subscribers_max;
    unsigned wait_spin_us;
    size_t copy_nt_min;
    char *copy_threads;
    size_t copy_parallel_min;
    size_t stage_chunk;
    size_t stage_pinned_max;
} ferry_engine_settings_t;

/* stage.c: page-locked host buffers through which device memory goes to
 * and from transports that take host memory only.  lock guards the lists
 * and `pinned`. */
typedef struct ferry_stage_chunk ferry_stage_chunk_t;
typedef struct ferry_stage_pool {
    pthread_mutex_t lock;
    ferry_stage_chunk_t *chunks; /* free buffers */
    struct stage_lane *lanes;    /* free streams with their events */
    size_t pinned;               /* bytes of page-locked buffers made */
    size_t chunk_size;
    size_t pinned_max;
} ferry_stage_pool_t;

struct ferry_engine {
    uint64_t handle;
    ferry_engine_settings_t settings;
    int copy_helpers; /* this engine counts among the copy helpers' users */
    char *name;
    uint64_t generation;
    char host_id[128];
    char advertise_host[256];
    char rpc_endpoint[300];
    ferry_transport_services_t transport_services;
    ferry_metadata_services_t metadata_services;

    ferry_registry_t registry;
    pthread_mutex_t register_lock; /* serializes register/unregister/publish */

    size_t n_transports;
    ferry_transport_instance_t transports[FERRY_MAX_TRANSPORTS];
    size_t n_progress;          /* transports with a progress op, in progress[] */
    ferry_transport_instance_t *progress[FERRY_MAX_TRANSPORTS];

    const ferry_plugin_t *metadata_plugin;
    const ferry_metadata_ops_t *metadata;
    void *metadata_ctx;

    /* published_lock: the newest local descriptor and its JSON, rebuilt on
     * demand when registrations changed (published_stale) */
    pthread_mutex_t published_lock;
    char *published_json;
    ferry_descriptor_t *local_desc;
    int published_stale;
    uint64_t published_epoch;    /* entries registered up to here are published */
    uint64_t register_epoch;     /* register_lock: last epoch handed out */

    struct ferry_rpc_server *rpc_server;
    /* Set (release) once create has built everything: the RPC server runs
     * from early on (its port is part of our name), and its handler
     * answers FERRY_ERR_BUSY until then instead of reading a half-built
     * engine. */
    atomic_int serving;
    ferry_segment_cache_t segments;

    /* The peers an unregister tells (FETCH callers, transports' peers),
     * at most settings.subscribers_max. */
    pthread_mutex_t subscribers_lock;
    ferry_subscriber_t *subscribers;
    unsigned n_subscribers;

    pthread_mutex_t notify_lock;
    ferry_notify_item_t *notify_head, *notify_tail;
    size_t notify_count;

    pthread_mutex_t batches_lock;
    ferry_batch_t *batches;

    /* The usable accelerator vendors (fixed after create) and the staging
     * buffers for their memory. */
    size_t n_accel;
    const ferry_accel_ops_t *accel[FERRY_ACCEL_VENDORS_MAX];
    ferry_stage_pool_t stage;
    int stage_ready; /* stage initialized (create got that far) */
};

ferry_engine_t *ferry_engine_lookup(ferry_engine_h handle);
/* The index of the enabled transport of that name, or -1. */
int ferry_engine_transport_index(const ferry_engine_t *engine, const char *name);
void ferry_engine_free(ferry_engine_t *engine);
/* The caller stops driving the transports' progress (it goes to sleep):
 * their threads take over now. */
void ferry_engine_progress_leave(ferry_engine_t *engine);

/* engine_register.c */
/* Build the descriptor from the registry and publish it. Caller holds register_lock. */
ferry_status_t ferry_engine_publish_locked(ferry_engine_t *engine);
/* The newest local descriptor (referenced) and/or a copy of its JSON. */
ferry_status_t ferry_engine_local_descriptor(ferry_engine_t *engine, ferry_descriptor_t **desc_p,
                                             char **json_p);
void ferry_engine_deregister_all(ferry_engine_t *engine);
ferry_status_t ferry_engine_access_acquire(void *engine, uint64_t addr, uint64_t length,
                                           ferry_access_t access, void **token_p);
void ferry_engine_access_release(void *engine, void *token);
/* rpc becomes a subscriber (told of our unregisters); FERRY_ERR_NO_RESOURCE
 * when the list is full. */
ferry_status_t ferry_engine_subscribe(ferry_engine_t *engine, const char *rpc);
void ferry_engine_peer_seen(void *engine, const char *rpc);
void ferry_engine_peer_forget_rpc(ferry_engine_t *engine, const char *rpc);

/* engine_rpc.c */
ferry_status_t ferry_engine_rpc_fetch(void *engine, const char *rpc, const char *name,
                                      char **descriptor_p);
ferry_status_t ferry_engine_send_notify(ferry_engine_t *engine, const ferry_descriptor_t *desc,
                                        const void *msg, size_t length);
void ferry_engine_notify_deliver(void *engine, const char *from, const void *msg, size_t length);
ferry_status_t ferry_engine_rpc_handle(void *engine, int type, const void *payload,
                                       size_t length, int *reply_type_p, void **reply_p,
                                       size_t *reply_length_p);

/* ---------------- batch.c ---------------- */

/* Whether desc's owner runs on this engine's host (host identities equal). */
int ferry_engine_same_host(const ferry_engine_t *engine, const ferry_descriptor_t *desc);
/* Whether engine transport i reaches the buffer: why not (a static text)
 * or NULL and *reach_p, *desc_transport_p set. */
const char *ferry_engine_transport_reach(ferry_engine_t *engine, size_t i,
                                         const ferry_descriptor_t *desc,
                                         const ferry_desc_buffer_t *buffer, int *reach_p,
                                         int *desc_transport_p);
/* First transport, in the engine's order of preference, that both sides
 * enabled and that reaches the buffer; one that reaches it only as a
 * fallback serves when no other does.  Returns the engine index or -1. */
int ferry_engine_select_transport(ferry_engine_t *engine, const ferry_descriptor_t *desc,
                                  const ferry_desc_buffer_t *buffer, int *desc_transport_p);
/* confirm.c: whether desc's owner serves the same descriptor, asked over
 * RPC once per descriptor (which makes us its subscriber); a one-sided
 * transport uses only confirmed descriptors. */
int ferry_engine_descriptor_confirmed(ferry_engine_t *engine, const ferry_descriptor_t *desc);
/* The peer as a transport sees it, from desc and its transport index. */
void ferry_engine_make_peer(const ferry_engine_t *engine, const ferry_descriptor_t *desc,
                            int desc_transport, ferry_peer_t *peer);
/* Drop every transport's state for that peer incarnation. */
void ferry_engine_forget_peer(ferry_engine_t *engine, const ferry_descriptor_t *desc);
/* The peer unregistered memory: transports drop their per-buffer caches. */
void ferry_engine_peer_changed(ferry_engine_t *engine, const ferry_descriptor_t *desc);
void ferry_batch_slice_done(ferry_slice_t *slice, ferry_status_t status);
/* A chain of slices (linked by next) finished with one status. */
void ferry_batch_slices_done(ferry_slice_t *slices, ferry_status_t status);
/* Before the transports go: what they keep for each batch goes back. */
void ferry_batch_release_peer_caches(ferry_engine_t *engine);
void ferry_batch_free_all(ferry_engine_t *engine);
/* An unregistered entry is going: no batch may keep pointing at it. */
void ferry_batch_forget_entry(ferry_engine_t *engine, const ferry_reg_entry_t *entry);

/* ---------------- accel.c: accelerator vendors ---------------- */

/* The usable vendors (init succeeded) among the modules in module_dir,
 * each initialized once per process (an unusable one says why, once). */
size_t ferry_accel_vendors(const char *module_dir, const ferry_accel_ops_t **usable, size_t max);
/* Why the vendor is not usable (its init's answer), NULL when it is. */
const char *ferry_accel_why(const ferry_accel_ops_t *ops);
/* The usable vendor of that kind ("cuda"), or NULL. */
const ferry_accel_ops_t *ferry_accel_find(const char *module_dir, const char *kind);
/* Every accelerator module, its state and devices (ferry_info). */
void ferry_accel_print(FILE *out, const char *module_dir);
/* The engine's vendors, from the plugins it found (all). */
void ferry_engine_accel_start(ferry_engine_t *engine, const ferry_plugin_list_t *all);
/* The vendor a location names ("cuda:0"), NULL for any other location. */
const ferry_accel_ops_t *ferry_engine_accel_of(const ferry_engine_t *engine,
                                               const char *location);
/* The vendor whose device memory addr is (and its allocation), or NULL. */
const ferry_accel_ops_t *ferry_engine_accel_query(const ferry_engine_t *engine, const void *addr,
                                                  ferry_accel_range_t *range_p);
/* The location a registration gets: asked, or what "*" detects; an error
 * (logged) when asked contradicts the pointer.  *vendor_p: device memory's
 * vendor, NULL for host memory. */
ferry_status_t ferry_engine_location_resolve(const ferry_engine_t *engine, const void *addr,
                                             size_t length, const char *asked, char *resolved,
                                             size_t resolved_length,
                                             const ferry_accel_ops_t **vendor_p);
/* Shareable device memory at a device location; FERRY_ERR_UNSUPPORTED when
 * no usable vendor has that kind. */
ferry_status_t ferry_engine_device_alloc(const ferry_engine_t *engine, const char *location,
                                         size_t length, void **addr_p,
                                         const ferry_accel_ops_t **vendor_p);

/* stage.c */
void ferry_stage_pool_init(ferry_stage_pool_t *pool, size_t chunk_size, size_t pinned_max);
void ferry_stage_pool_fini(ferry_stage_pool_t *pool);
/* A buffer of engine->stage.chunk_size bytes (page-locked while the pool's
 * bound allows), NULL when out of memory. */
ferry_stage_chunk_t *ferry_stage_get(ferry_engine_t *engine, const ferry_accel_ops_t *vendor);
void ferry_stage_put(ferry_engine_t *engine, ferry_stage_chunk_t *chunk);
void *ferry_stage_buffer(const ferry_stage_chunk_t *chunk);
/* The services of the same names (plugin.h). */
int ferry_engine_access_is_device(void *engine, void *token);
ferry_status_t ferry_engine_stage_in(void *engine, void *token, void *dst, size_t length,
                                     ferry_status_t (*fill)(void *arg, void *buffer,
                                                            size_t length),
                                     void *arg);
ferry_status_t ferry_engine_stage_out(void *engine, void *token, const void *src, size_t length,
                                      ferry_status_t (*drain)(void *arg, const void *buffer,
                                                              size_t length),
                                      void *arg);

/* ---------------- built-in plugins ---------------- */
const ferry_plugin_t *ferry_tcp_plugin(void);
const ferry_plugin_t *ferry_shm_plugin(void);
const ferry_plugin_t *ferry_cxl_plugin(void);
const ferry_plugin_t *ferry_p2p_plugin(void);

#endif
