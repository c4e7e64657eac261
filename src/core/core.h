/* The engine's internal objects: registry, descriptors, segment cache,
 * batches, plugins.  Locking rules are stated next to each structure. */
#ifndef FERRY_CORE_H
#define FERRY_CORE_H

#include "../util/util.h"

#include <time.h>

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
    /* A storage buffer (ferry_register_storage): its file, freed with the
     * entry; NULL for memory. */
    struct ferry_storage *storage;
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

/* ---------------- descriptor.c: the segment descriptor and its codecs ---------------- */

/* descriptor_pool.c: where a descriptor's per-buffer strings live. */
typedef struct ferry_desc_pool ferry_desc_pool_t;
/* A new pool holding a reference on parent (may be NULL). */
ferry_desc_pool_t *ferry_desc_pool_new(ferry_desc_pool_t *parent);
ferry_desc_pool_t *ferry_desc_pool_ref(ferry_desc_pool_t *pool);
void ferry_desc_pool_unref(ferry_desc_pool_t *pool);
/* How many ancestors the pool holds (a chain of applied changes). */
unsigned ferry_desc_pool_depth(const ferry_desc_pool_t *pool);
/* The size of the next chunk, when the caller knows roughly what it needs. */
void ferry_desc_pool_reserve(ferry_desc_pool_t *pool, size_t bytes);
/* Aligned for any type, uninitialized; NULL when out of memory. */
void *ferry_desc_pool_alloc(ferry_desc_pool_t *pool, size_t size);
/* Unaligned bytes (strings). */
void *ferry_desc_pool_bytes(ferry_desc_pool_t *pool, size_t size);
char *ferry_desc_pool_strndup(ferry_desc_pool_t *pool, const char *text, size_t length);

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
    /* Counts the owner's publishes that changed something, within one
     * generation; 0: unknown (a JSON descriptor, or an owner that does not
     * count), so never asked for changes. */
    uint64_t revision;
    char *host_id;
    char *rpc;
    size_t n_transports;
    ferry_desc_transport_t *transports; /* malloc-ed, and their strings */
    size_t n_buffers;
    ferry_desc_buffer_t *buffers; /* sorted by addr, disjoint; malloc-ed */
    /* NULL: each buffer's location, keys array and keys are malloc-ed
     * (descriptors built by hand); else they all live in this pool or its
     * ancestors. */
    ferry_desc_pool_t *pool;
    /* Not part of the value either.  serial: no other descriptor of this
     * process has it (ferry_peer_t.descriptor_serial).  same_host: the
     * owning engine's host comparison, 0 until made, else 1 (other host)
     * or 2 (ours). */
    uint64_t serial;
    atomic_int same_host;
    /* Whether its owner serves this same descriptor (confirm.c):
     * FERRY_DESC_UNCONFIRMED until asked. */
    atomic_int confirmed;
    /* confirm.c's lock: a confirmed descriptor of the same generation this
     * one was made from by a store's change records (referenced), so that
     * the owner confirms it by its changes since that one instead of its
     * whole text; NULL once used, or when there is none. */
    struct ferry_descriptor *confirm_base;
} ferry_descriptor_t;

enum {
    FERRY_DESC_UNCONFIRMED = 0,
    FERRY_DESC_CONFIRMED = 1,
    FERRY_DESC_REFUSED = 2,
};

/* The two text forms of a descriptor (descriptor.c explains both). */
typedef enum ferry_desc_form {
    FERRY_DESC_FORM_JSON = 0,
    FERRY_DESC_FORM_COMPACT = 1,
} ferry_desc_form_t;

/* What decoders refuse before it costs memory, in either form. */
#define FERRY_DESC_MAX_TEXT ((size_t)64 << 20)
#define FERRY_DESC_MAX_STRING ((size_t)64 << 10)
#define FERRY_DESC_MAX_BUFFERS ((size_t)1000000)
#define FERRY_DESC_MAX_TRANSPORTS ((size_t)64)
#define FERRY_DESC_COMPACT_MAGIC "ferry:desc:1\n"
#define FERRY_DESC_CHANGES_MAGIC "ferry:changes:1\n"

ferry_descriptor_t *ferry_descriptor_new(void);
ferry_descriptor_t *ferry_descriptor_ref(ferry_descriptor_t *desc);
void ferry_descriptor_unref(ferry_descriptor_t *desc);
/* n references at once (a run of requests sharing one descriptor): take
 * them while holding one, drop them as one step (frees on the last). */
void ferry_descriptor_ref_n(ferry_descriptor_t *desc, unsigned n);
void ferry_descriptor_unref_n(ferry_descriptor_t *desc, unsigned n);
/* JSON text, malloc-ed. */
ferry_status_t ferry_descriptor_encode(const ferry_descriptor_t *desc, char **json_p);
/* Either form, malloc-ed and NUL-terminated; *length_p (may be NULL) its length. */
ferry_status_t ferry_descriptor_encode_as(const ferry_descriptor_t *desc, ferry_desc_form_t form,
                                          char **text_p, size_t *length_p);
/* Either form, told apart by its first bytes.  Strict: any type error,
 * missing field, overflow or overlap is FERRY_ERR_DECODE, logged once. */
ferry_status_t ferry_descriptor_decode(const char *text, size_t length,
                                       ferry_descriptor_t **desc_p);
/* The form of a text by its first bytes (JSON for anything not compact). */
ferry_desc_form_t ferry_descriptor_text_form(const char *text, size_t length);
/* A decoder's last step: finish desc and hand it over (*desc_p) when status
 * is FERRY_OK, else (or when finish fails) unref it; returns the outcome. */
ferry_status_t ferry_descriptor_complete(ferry_descriptor_t *desc, ferry_status_t status,
                                         ferry_descriptor_t **desc_p);
/* "r", "w", "rw" for a buffer's access; NULL when peers may not touch it. */
const char *ferry_desc_access_text(unsigned access);
/* Sort buffers (unless sorted already) and reject overlaps (the decoders
 * and the builder use it). */
ferry_status_t ferry_descriptor_finish(ferry_descriptor_t *desc);
/* Buffer containing [addr, addr+length) or NULL. */
const ferry_desc_buffer_t *ferry_descriptor_find(const ferry_descriptor_t *desc, uint64_t addr,
                                                 uint64_t length);
int ferry_descriptor_transport_index(const ferry_descriptor_t *desc, const char *name);
/* Whether two descriptors hold the same value (the revision aside: it
 * counts publishes, it describes no memory). */
int ferry_descriptor_same(const ferry_descriptor_t *a, const ferry_descriptor_t *b);
/* Decoders' shared report: "segment descriptor: <prefix>.<key>: <problem>"
 * logged once, returns FERRY_ERR_DECODE. */
ferry_status_t ferry_desc_decode_bad(const char *prefix, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Whether the bytes are UTF-8 text without NUL (what JSON strings hold). */
int ferry_desc_text_valid(const char *text, size_t length);

/* descriptor_compact.c: the compact form (its header describes it).
 * decode fills a new descriptor that ferry_descriptor_decode finishes. */
ferry_status_t ferry_descriptor_compact_encode(const ferry_descriptor_t *desc, char **text_p,
                                               size_t *length_p);
ferry_status_t ferry_descriptor_compact_decode(const char *text, size_t length,
                                               ferry_descriptor_t *desc);
/* The compact reader's pieces, shared with the change-set reader: each
 * logs once ("line N: what: problem") and returns FERRY_ERR_DECODE. */
typedef struct ferry_desc_cursor {
    const char *p, *end;
    size_t line;
} ferry_desc_cursor_t;
ferry_status_t ferry_desc_cursor_literal(ferry_desc_cursor_t *in, const char *word,
                                         const char *what);
ferry_status_t ferry_desc_cursor_char(ferry_desc_cursor_t *in, char c, const char *what);
ferry_status_t ferry_desc_cursor_hex(ferry_desc_cursor_t *in, const char *what,
                                     uint64_t *value_p);
/* *text_p points into the text: *length_p bytes, not NUL-terminated. */
ferry_status_t ferry_desc_cursor_str(ferry_desc_cursor_t *in, const char *what,
                                     const char **text_p, size_t *length_p);
/* One buffer line, strings into pool (shared with previous's when equal). */
ferry_status_t ferry_desc_cursor_buffer(ferry_desc_cursor_t *in, size_t n_transports,
                                        ferry_desc_pool_t *pool,
                                        const ferry_desc_buffer_t *previous,
                                        ferry_desc_buffer_t *buffer);
/* The compact writer's pieces: a buffer line's size (without newline),
 * the line itself, a hex number; each returns where the writing ended. */
size_t ferry_desc_compact_buffer_size(const ferry_descriptor_t *desc,
                                      const ferry_desc_buffer_t *buffer);
char *ferry_desc_compact_put_buffer(const ferry_descriptor_t *desc,
                                    const ferry_desc_buffer_t *buffer, char *out);
char *ferry_desc_compact_put_hex(char *out, uint64_t value);
char *ferry_desc_compact_put_word(char *out, const char *word);

/* descriptor_blob.c: a descriptor as the bytes an application carries
 * itself (its header describes them): a 16-byte header, then the compact
 * form.  decode is strict (FERRY_ERR_DECODE, logged once) and takes only
 * what encode writes. */
#define FERRY_DESC_BLOB_HEADER 16
ferry_status_t ferry_descriptor_blob_encode(const ferry_descriptor_t *desc, uint8_t **blob_p,
                                            size_t *length_p);
/* The same from a descriptor's compact text (malloc-ed blob). */
ferry_status_t ferry_descriptor_blob_wrap(const char *text, size_t length, uint8_t **blob_p,
                                          size_t *length_p);
ferry_status_t ferry_descriptor_blob_decode(const void *blob, size_t length,
                                            ferry_descriptor_t **desc_p);

/* descriptor_changes.c: what changed between two revisions of one
 * generation of a descriptor (incremental refresh).  A change set lists,
 * per revision step, the buffers removed (by address) and added (whole),
 * both sorted by address; keys follow the transports of the descriptor it
 * applies to (fixed within a generation). */
typedef struct ferry_desc_step {
    uint64_t revision;           /* the revision this step leads to */
    ferry_desc_pool_t *pool;     /* its strings', or NULL: the set's pool holds them */
    size_t n_removed;
    uint64_t *removed;           /* addresses, ascending */
    size_t n_added;
    ferry_desc_buffer_t *added;  /* ascending, disjoint; strings in the set's pool */
} ferry_desc_step_t;

typedef struct ferry_desc_changes {
    uint64_t generation;
    uint64_t from;               /* the revision the first step applies to */
    size_t n_transports;         /* keys per added buffer */
    size_t n_steps;
    ferry_desc_step_t *steps;    /* revisions ascending, each one more */
    ferry_desc_pool_t *pool;
} ferry_desc_changes_t;

void ferry_desc_changes_init(ferry_desc_changes_t *changes, uint64_t generation, uint64_t from,
                             size_t n_transports);
void ferry_desc_changes_fini(ferry_desc_changes_t *changes);
/* Text of the steps of changes whose revisions are above `since` (which
 * must be at least changes->from), malloc-ed. */
ferry_status_t ferry_desc_changes_encode(const ferry_desc_changes_t *changes, uint64_t since,
                                         char **text_p, size_t *length_p);
/* Strict, like the descriptor decoders; changes is initialized here. */
ferry_status_t ferry_desc_changes_decode(const char *text, size_t length,
                                         ferry_desc_changes_t *changes);
/* base with the changes applied: a new descriptor (its pool's parent is
 * base's) at the last step's revision.  FERRY_ERR_DECODE when the changes
 * do not fit base (another generation or revision, a different transport
 * count, an added buffer overlapping a kept one); a removed address that
 * base lacks is no error (the owner may show a removal before it counts
 * it).  Logs once. */
ferry_status_t ferry_descriptor_apply(const ferry_descriptor_t *base,
                                      const ferry_desc_changes_t *changes,
                                      ferry_descriptor_t **desc_p);

/* ---------------- stats.c: what the engine's requests did ---------------- */

/* Slot 0: local copies; slot i + 1: engine transport i. */
#define FERRY_STATS_SLOTS (FERRY_MAX_TRANSPORTS + 1)

/* Relaxed atomics: added to by whichever thread finishes requests, read by
 * snapshots; no ordering between them is promised. */
typedef struct ferry_stats_counters {
    /* No count of requests: each finished request is in one latency
     * bucket, and a snapshot sums them (one locked addition less per
     * completion call). */
    atomic_uint_fast64_t failures;
    atomic_uint_fast64_t bytes;
    atomic_uint_fast64_t latency[FERRY_STATS_BUCKETS];
} ferry_stats_counters_t;

/* One peer's counters, per transport.  The engine owns it from the first
 * open of that name until the engine is freed (after every batch), so a
 * run may keep a plain pointer to it while its requests fly, even past
 * the segment's close. */
typedef struct ferry_peer_stats {
    char *name;
    ferry_stats_counters_t by_slot[FERRY_STATS_SLOTS];
} ferry_peer_stats_t;

/* lock: peers, n_peers, capacity (a snapshot or an open takes it; a
 * completion never does).  Past FERRY_STATS_PEERS_MAX names, new ones share
 * the `other` entry.  enabled: FERRY_STATS, fixed at create. */
#define FERRY_STATS_PEERS_MAX 4096
typedef struct ferry_engine_stats {
    pthread_mutex_t lock;
    ferry_peer_stats_t **peers;
    size_t n_peers, capacity;
    ferry_peer_stats_t *other;
    int enabled;
} ferry_engine_stats_t;

void ferry_stats_init(ferry_engine_stats_t *stats, int enabled);
void ferry_stats_fini(ferry_engine_stats_t *stats);
/* The counters of the peer of that name (made at its first open); NULL
 * when statistics are off or memory is short (then it is not counted). */
ferry_peer_stats_t *ferry_stats_peer(ferry_engine_stats_t *stats, const char *name);

/* When a submit began, in ticks (util.h: the TSC where the kernel's clock
 * runs on it, ~10 ns a read here against clock_gettime's ~23; a one-request
 * batch reads it twice). */
static inline uint64_t ferry_stats_now(void)
{
    return ferry_ticks();
}

/* done requests of one run finished in one completion call (failed of
 * them failed, the others moved bytes), submitted at submit_ticks
 * (ferry_stats_now), through engine transport `transport` (-1: a local
 * copy). */
static inline void ferry_stats_count(ferry_peer_stats_t *peer, int transport, unsigned done,
                                     unsigned failed, uint64_t bytes, uint64_t submit_ticks)
{
    ferry_stats_counters_t *c = &peer->by_slot[transport + 1];
    uint64_t elapsed = ferry_stats_now() - submit_ticks;
    /* A reading behind the submit's (another CPU's counter a hair back)
     * counts as no time. */
    uint64_t ns = (int64_t)elapsed > 0 ? ferry_ticks_to_ns(elapsed) : 0;
    unsigned bucket = ns > 1 ? 63u - (unsigned)__builtin_clzll(ns) : 0;
    if (bucket >= FERRY_STATS_BUCKETS)
        bucket = FERRY_STATS_BUCKETS - 1;
    atomic_fetch_add_explicit(&c->bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->latency[bucket], done, memory_order_relaxed);
    if (failed)
        atomic_fetch_add_explicit(&c->failures, failed, memory_order_relaxed);
}

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
    /* Opened from a blob (ferry_segment_open_blob), set with the first
     * desc under lock: refreshes ask its owner over RPC, never the store. */
    int from_blob;
    /* Its peer's statistics (stats.c), NULL when not counted; set before
     * the handle is handed out, fixed. */
    ferry_peer_stats_t *stats;
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
/* The segment of desc's name: one more open of the entry if there is one
 * (desc unused), else a new entry holding desc (a reference taken), which
 * refreshes from its owner over RPC only. */
ferry_status_t ferry_segment_cache_open_desc(ferry_engine_t *engine, ferry_descriptor_t *desc,
                                             ferry_segment_t **segment_p);
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
/* The engine and the open segment behind two public handles, or
 * FERRY_ERR_INVALID_HANDLE. */
ferry_status_t ferry_segment_resolve(ferry_engine_h engine_handle, ferry_segment_h segment_handle,
                                     ferry_engine_t **engine_p, ferry_segment_t **segment_p);
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

/* Registrations since the last publish (engine_publish.c): entries added
 * (still registered) and addresses of published ones removed; overflow
 * when there were too many to keep as one step. */
typedef struct ferry_desc_pending {
    ferry_reg_entry_t **added;
    size_t n_added, added_capacity;
    uint64_t *removed;
    size_t n_removed, removed_capacity;
    int overflow;
} ferry_desc_pending_t;

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
    int stats;
    char *descriptor_format;
    unsigned subscribers_max;
    unsigned wait_spin_us;
    size_t copy_nt_min;
    char *copy_threads;
    size_t copy_parallel_min;
    size_t stage_chunk;
    size_t stage_pinned_max;
    char *storage_gpu; /* storage_device.c: auto, cufile, staging */
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

    /* What was published and how (engine_publish.c).  publish_form is
     * fixed after create.  published_lock: revision (the newest), changes
     * (the steps that led to it: changes.from + changes.n_steps ==
     * revision), local_desc (built on demand: NULL or older until someone
     * asks) and its texts per form (NULL until asked), published_epoch.
     * register_lock: pending, register_epoch. */
    ferry_desc_form_t publish_form;
    pthread_mutex_t published_lock;
    uint64_t revision;
    ferry_desc_changes_t changes;
    ferry_descriptor_t *local_desc;
    char *published_text[2];
    size_t published_length[2];
    uint64_t published_epoch;    /* entries registered up to here are published */
    uint64_t register_epoch;     /* last epoch handed out */
    ferry_desc_pending_t pending;
    /* register_lock: a shared store's change records (engine_publish.c):
     * the last revision given to publish_changes (0: none), the revision of
     * the last whole descriptor published (the checkpoint), the records
     * since it and their bytes, and the checkpoint's length; store_behind:
     * the store refused the last publication, so the next one is whole
     * (and ferry_publish reports what the store says, never a memo). */
    uint64_t store_revision;
    uint64_t store_checkpoint;
    unsigned store_steps;
    size_t store_bytes;
    size_t store_whole_length;
    int store_behind;

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
    ferry_engine_stats_t stats; /* freed last: runs point into it */
};

ferry_engine_t *ferry_engine_lookup(ferry_engine_h handle);
/* The index of the enabled transport of that name, or -1. */
int ferry_engine_transport_index(const ferry_engine_t *engine, const char *name);
void ferry_engine_free(ferry_engine_t *engine);
/* The caller stops driving the transports' progress (it goes to sleep):
 * their threads take over now. */
void ferry_engine_progress_leave(ferry_engine_t *engine);

/* engine_publish.c */
/* The registrations since the last publish become a new revision, and a
 * store that holds whole descriptors gets the newest.  Caller holds
 * register_lock. */
ferry_status_t ferry_engine_publish_locked(ferry_engine_t *engine);
/* The newest local descriptor (referenced) and/or a copy of its JSON. */
ferry_status_t ferry_engine_local_descriptor(ferry_engine_t *engine, ferry_descriptor_t **desc_p,
                                             char **json_p);
/* A copy of the newest local descriptor's text in that form. */
ferry_status_t ferry_engine_local_text(ferry_engine_t *engine, ferry_desc_form_t form,
                                       char **text_p, size_t *length_p);
/* For a peer that holds generation's revision: the changes since (a
 * change set's text), or the whole descriptor in form when the log does
 * not reach back to it. */
ferry_status_t ferry_engine_changes_text(ferry_engine_t *engine, uint64_t generation,
                                         uint64_t revision, ferry_desc_form_t form,
                                         char **text_p, size_t *length_p);
/* Caller holds register_lock: entry was added, or leaves the registry. */
void ferry_engine_changes_added(ferry_engine_t *engine, ferry_reg_entry_t *entry);
void ferry_engine_changes_removed(ferry_engine_t *engine, ferry_reg_entry_t *entry);
ferry_status_t ferry_engine_changes_init(ferry_engine_t *engine);
/* Frees the log, the pending changes, the local descriptor and its texts. */
void ferry_engine_changes_fini(ferry_engine_t *engine);

/* engine_register.c */
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
/* A descriptor from its owner at rpc, in either form (name may be ""). */
ferry_status_t ferry_engine_rpc_fetch(void *engine, const char *rpc, const char *name,
                                      char **descriptor_p);
/* The same for a caller that holds generation's revision (not 0): the
 * owner answers with the changes since, or the whole descriptor (an older
 * owner always does).  *text_p is NUL-terminated, *length_p long. */
ferry_status_t ferry_engine_rpc_fetch_since(ferry_engine_t *engine, const char *rpc,
                                            const char *name, uint64_t generation,
                                            uint64_t revision, char **text_p, size_t *length_p);
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
/* desc was made from held by a shared store's change records: the
 * confirmed descriptor behind held (held itself, or its base) becomes
 * desc's confirm_base.  desc is not shared yet. */
void ferry_engine_confirm_base_pass(ferry_engine_t *engine, const ferry_descriptor_t *held,
                                    ferry_descriptor_t *desc);
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
/* The service of the same name (plugin.h); storage.c. */
ferry_status_t ferry_engine_storage_file(void *engine, void *token, uint64_t addr,
                                         ferry_storage_file_t *file);

/* ---------------- built-in plugins ---------------- */
const ferry_plugin_t *ferry_tcp_plugin(void);
const ferry_plugin_t *ferry_shm_plugin(void);
const ferry_plugin_t *ferry_cxl_plugin(void);
const ferry_plugin_t *ferry_p2p_plugin(void);
const ferry_plugin_t *ferry_file_plugin(void);

/* ---------------- storage.c, storage_key.c: storage buffers ---------------- */

#define FERRY_STORAGE_LOCATION "file"
#define FERRY_STORAGE_TRANSPORT "file" /* the transport whose keys are storage keys */
#define FERRY_STORAGE_PATH_MAX 4096
#define FERRY_STORAGE_HOST_MAX 128
#define FERRY_STORAGE_WWID_MAX 256
#define FERRY_STORAGE_ALIGN_MAX ((uint64_t)1 << 20)
#define FERRY_STORAGE_KEY_MAX (3 * (FERRY_STORAGE_PATH_MAX + FERRY_STORAGE_HOST_MAX + \
                                    FERRY_STORAGE_WWID_MAX) + 256)

typedef enum ferry_storage_kind {
    FERRY_STORAGE_KIND_FILE = 0,
    FERRY_STORAGE_KIND_BLOCK = 1,
} ferry_storage_kind_t;

/* What a storage key says (storage_key.c describes its text). */
typedef struct ferry_storage_key {
    uint64_t addr, length;  /* the buffer */
    uint64_t offset;        /* of addr in the file */
    uint32_t align;         /* direct I/O: offsets, lengths and memory aligned to it */
    unsigned options;       /* FERRY_STORAGE_* */
    ferry_storage_kind_t kind;
    char host[FERRY_STORAGE_HOST_MAX + 1];
    uint64_t dev, ino;      /* st_dev, st_ino; a block device: st_rdev, 0 */
    char wwid[FERRY_STORAGE_WWID_MAX + 1]; /* "" when none */
    char path[FERRY_STORAGE_PATH_MAX + 1];
} ferry_storage_key_t;

/* The canonical text (malloc-ed), NULL when out of memory. */
char *ferry_storage_key_format(const ferry_storage_key_t *key);
/* Strict; FERRY_ERR_DECODE with *why_p saying what is wrong (not logged). */
ferry_status_t ferry_storage_key_parse(const char *text, ferry_storage_key_t *key,
                                       const char **why_p);
/* A decoder's check of one buffer's storage key against the buffer and
 * the descriptor's host; logs once. */
ferry_status_t ferry_storage_key_check(const ferry_descriptor_t *desc,
                                       const ferry_desc_buffer_t *buffer, const char *text);
/* Every storage key of buffers [first, first + count). */
ferry_status_t ferry_storage_keys_check(const ferry_descriptor_t *desc, size_t first,
                                        size_t count);

/* A registered storage range, owned by its registry entry (entry->storage):
 * made by ferry_storage_open, freed with the entry.  Immutable after open
 * but for `mapped`, set once. */
typedef struct ferry_storage {
    ferry_storage_key_t key;
    char *key_text;
    int fd;                 /* the owner's, for copies to its own segment */
    void *reserved;         /* the PROT_NONE address range */
    size_t reserved_length;
    /* The range mapped MAP_SHARED for a serving target (storage_file),
     * from key.offset rounded down to a page, writable if `writable`: NULL
     * until first asked for, MAP_FAILED when it cannot be; unmapped by
     * ferry_storage_close. */
    _Atomic(void *) mapped;
    int writable; /* fd is O_RDWR: peers may write (mapped writable too) */
} ferry_storage_t;

/* Open and check the region, reserve its addresses, make its key (host:
 * this engine's host identity; sysfs_root: where WWIDs are read). */
ferry_status_t ferry_storage_open(const ferry_storage_region_t *region, unsigned flags,
                                  const char *host, const char *sysfs_root,
                                  ferry_storage_t **storage_p);
void ferry_storage_close(ferry_storage_t *storage);
/* A copy between local memory and [addr, addr + length) of the storage
 * (inside it: the caller checked), by the owner's descriptor. */
ferry_status_t ferry_storage_copy(const ferry_storage_t *storage, ferry_opcode_t opcode,
                                  uint64_t addr, void *local, size_t length);
/* A transport's target serving a peer (the services stage_in and
 * stage_out): [addr, +length) of the storage filled from fill's buffers,
 * or read into buffers that drain takes, a bounce buffer at a time. */
ferry_status_t ferry_storage_stage_in(const ferry_storage_t *storage, uint64_t addr,
                                      size_t length,
                                      ferry_status_t (*fill)(void *arg, void *buffer,
                                                             size_t length),
                                      void *arg);
ferry_status_t ferry_storage_stage_out(const ferry_storage_t *storage, uint64_t addr,
                                       size_t length,
                                       ferry_status_t (*drain)(void *arg, const void *buffer,
                                                               size_t length),
                                       void *arg);
/* Every byte of a pread (write 0) or pwrite (write 1) at offset, short
 * transfers continued, EINTR retried; FERRY_ERR_IO (logged) when the file
 * ends first or the call fails.  rw_flags: pwritev2's (RWF_DSYNC). */
ferry_status_t ferry_storage_full_io(int fd, int write, void *buffer, size_t length,
                                     uint64_t offset, int rw_flags);
/* The WWID of the block device rdev from <sysfs_root>/dev/block/M:m/wwid
 * (out[size], "" when there is none). */
void ferry_storage_wwid_of(const char *sysfs_root, uint64_t rdev, char *out, size_t size);
/* The path of the block device with that WWID on this host: first the
 * mapping "WWID=PATH[;WWID=PATH...]" (NVMe-oF attachments under other
 * names), then <sysfs_root>/block/NAME/wwid, as <dev_root>/NAME.  0 when
 * none. */
int ferry_storage_wwid_find(const char *sysfs_root, const char *dev_root, const char *map,
                            const char *wwid, char *path, size_t size);

/* ---------------- storage_device.c, cufile.c: device memory and storage ---------------- */

/* This process's descriptors of one storage range, for I/O between it and
 * device memory. */
typedef struct ferry_storage_fds {
    int fd;            /* page-cache I/O; -1 where none */
    int fd_direct;     /* O_DIRECT; -1 where none */
    uint32_t align;    /* direct I/O's alignment (the key's) */
    unsigned options;  /* the key's FERRY_STORAGE_* options */
    const char *path;  /* for log lines */
} ferry_storage_fds_t;
/* Whether FERRY_STORAGE_GPU's value is one this engine knows (logged when
 * not: FERRY_ERR_INVALID_PARAM). */
ferry_status_t ferry_storage_gpu_check(const char *mode);
/* length bytes between device memory (an accelerator's, its pointer says
 * whose) and the file at offset, in the calling thread, by cuFile or
 * through the engine's pinned staging buffers, as FERRY_STORAGE_GPU and
 * cuFile's state choose.  FERRY_ERR_UNSUPPORTED (logged) when cuFile is
 * forced and cannot serve it; FERRY_ERR_INVALID_PARAM when the storage
 * takes direct I/O only and the I/O is not aligned. */
ferry_status_t ferry_storage_device_io(ferry_engine_t *engine, const ferry_storage_fds_t *fds,
                                       int write, void *device, size_t length, uint64_t offset);
/* The engine's own storage buffer and local device memory (a request to
 * its own segment). */
ferry_status_t ferry_storage_copy_device(ferry_engine_t *engine, const ferry_storage_t *storage,
                                         ferry_opcode_t opcode, uint64_t addr, void *device,
                                         size_t length);

typedef enum ferry_cufile_mode {
    FERRY_CUFILE_ABSENT, /* no library, or its driver session did not open */
    FERRY_CUFILE_COMPAT, /* compatibility mode: no nvidia-fs, cuFile copies through host */
    FERRY_CUFILE_NATIVE, /* GPUDirect Storage: DMA between storage and GPU memory */
} ferry_cufile_mode_t;
/* Load cuFile once per process; *why_p (if not NULL): why it is absent or
 * in compatibility mode. */
ferry_cufile_mode_t ferry_cufile_load(const char **why_p);
/* One line for ferry_info: found or not, native or compatibility mode. */
void ferry_cufile_describe(char *text, size_t length);
/* length bytes between cuda memory at device and the file fd at offset;
 * short transfers continued, anything else FERRY_ERR_IO (logged). */
ferry_status_t ferry_cufile_io(int fd, int write, void *device, size_t length, uint64_t offset);

#endif
