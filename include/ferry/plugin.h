/*
 * Ferry plugin ABI: what a transport or metadata plugin implements and what
 * the engine gives it.  A loadable module exports exactly one symbol,
 * ferry_plugin_entry(), returning a static ferry_plugin_t.  Function tables
 * carry their size so fields can be appended without breaking old plugins.
 */
#ifndef FERRY_PLUGIN_H
#define FERRY_PLUGIN_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <ferry/accel.h>
#include <ferry/ferry.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_PLUGIN_ABI_VERSION 4
#define FERRY_PLUGIN_ENTRY_SYMBOL "ferry_plugin_entry"

/* ---- logging (exported so modules log like the core) ---- */

typedef enum ferry_log_level {
    FERRY_LOG_ERROR = 0,
    FERRY_LOG_WARN = 1,
    FERRY_LOG_INFO = 2,
    FERRY_LOG_DEBUG = 3,
    FERRY_LOG_TRACE = 4,
} ferry_log_level_t;

FERRY_API extern int ferry_log_level_current;
FERRY_API void ferry_log_write(ferry_log_level_t level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define ferry_log_(level, ...)                                                \
    do {                                                                      \
        if ((int)(level) <= ferry_log_level_current)                          \
            ferry_log_write((level), __FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)
#define ferry_error(...) ferry_log_(FERRY_LOG_ERROR, __VA_ARGS__)
#define ferry_warn(...) ferry_log_(FERRY_LOG_WARN, __VA_ARGS__)
#define ferry_info(...) ferry_log_(FERRY_LOG_INFO, __VA_ARGS__)
#ifdef NDEBUG
#define ferry_debug(...) ((void)0)
#define ferry_trace(...) ((void)0)
#else
#define ferry_debug(...) ferry_log_(FERRY_LOG_DEBUG, __VA_ARGS__)
#define ferry_trace(...) ferry_log_(FERRY_LOG_TRACE, __VA_ARGS__)
#endif

/* ---- settings tables ---- */

typedef enum ferry_setting_type {
    FERRY_SETTING_STRING, /* char * (strdup-ed; free with ferry_settings_release) */
    FERRY_SETTING_SIZE,   /* size_t, accepts k/m/g suffixes (powers of 1024) */
    FERRY_SETTING_UINT,   /* unsigned */
    FERRY_SETTING_BOOL,   /* int: y/n, yes/no, 1/0, on/off, true/false */
    FERRY_SETTING_TIME_MS,/* unsigned milliseconds; accepts ms/s suffixes */
} ferry_setting_type_t;

typedef struct ferry_setting {
    const char *name;          /* variable is FERRY_<COMPONENT>_<name> */
    const char *default_value;
    const char *doc;           /* one line */
    size_t offset;             /* into the component's settings struct */
    ferry_setting_type_t type;
} ferry_setting_t;

/* Fill dst from the table: variable if set, else default.  An unparsable
 * value is an error naming the variable. component NULL: FERRY_<name>. */
FERRY_API ferry_status_t ferry_settings_read(const char *component, const ferry_setting_t *table,
                                   size_t count, void *dst);
FERRY_API void ferry_settings_release(const ferry_setting_t *table, size_t count, void *dst);

/* ---- process identity (for transports that reach a same-kernel peer) ---- */

/* "<boot id>:<pid namespace>:<pid>:<start time>" of this process. */
FERRY_API void ferry_process_identity(char *out, size_t len);
/* Parse an identity at the start of text; returns what follows its fourth
 * ':' (NULL if malformed).  *pid_p and *start_p are set only when the
 * process runs on our kernel and in our pid namespace, else 0. */
FERRY_API const char *ferry_process_identity_parse(const char *text, long *pid_p,
                                                   unsigned long long *start_p);
/* Start time of a process (clock ticks since boot), 0 if gone or a zombie. */
FERRY_API unsigned long long ferry_process_start_time(long pid);
/* Whether pid still names the process that started at start_time. */
FERRY_API int ferry_process_alive(long pid, unsigned long long start_time);
/* Whether the process is stopped (SIGSTOP, a tracer's stop): it runs no
 * code, so a lock it holds in shared memory stays held until it resumes. */
FERRY_API int ferry_process_stopped(long pid);

/* ---- copies ---- */

/* Copy length bytes into memory another process reads (a same-host
 * transport's WRITE): non-temporal stores and a store fence from
 * FERRY_COPY_NT_MIN bytes where the CPU has them, memcpy below.  dst and
 * src must not overlap. */
FERRY_API void ferry_copy_to_peer(void *dst, const void *src, size_t length);

/* One copy of a same-host transport's run: into a peer's memory (to_peer:
 * as ferry_copy_to_peer) or out of it into ours (plain stores). */
typedef struct ferry_copy_item {
    void *dst;
    const void *src;
    size_t length;
    int to_peer;
} ferry_copy_item_t;

/* Do every copy before returning; from FERRY_COPY_PARALLEL_MIN bytes in
 * all, the process's copy helpers (FERRY_COPY_THREADS) take a share. */
FERRY_API void ferry_copy_many(const ferry_copy_item_t *items, size_t count);

/* ---- time ---- */

/* *deadline_p = now on clock (CLOCK_REALTIME for a default condition
 * variable, CLOCK_MONOTONIC for one set so) + timeout_ms, normalized: the
 * deadline pthread_cond_timedwait takes. */
FERRY_API void ferry_deadline_after_ms(struct timespec *deadline_p, int clock,
                                       unsigned timeout_ms);
/* The same, timeout_us microseconds from now. */
FERRY_API void ferry_deadline_after_us(struct timespec *deadline_p, int clock,
                                       uint64_t timeout_us);

/* ---- memory locations ---- */

/* Whether memory at that location is host memory, which the CPU reaches with
 * loads and stores and the kernel copies: NULL or "" (the default), "cpu",
 * "cpu:N", and "cxl", "cxl:N" (the cxl transport's shared window, mapped
 * like any file).  Device memory ("cuda:N", "rocm:N", ...) is not. */
FERRY_API int ferry_location_is_host(const char *location);
/* Whether the location names the CXL window ("cxl", "cxl:N"), which only the
 * cxl transport hands out. */
FERRY_API int ferry_location_is_cxl(const char *location);
/* Whether the location is of that kind: "kind" or "kind:qualifier". */
FERRY_API int ferry_location_is_kind(const char *location, const char *kind);

/* ---- transports ---- */

/* What a transport knows of a remote segment. */
typedef struct ferry_peer {
    const char *name;      /* segment name */
    uint64_t generation;   /* the peer engine's incarnation */
    const char *endpoint;  /* this transport's endpoint string from the descriptor */
    const char *rpc;       /* the peer's RPC host:port */
    int same_host;         /* host identities are equal */
    /* In submit, or NULL: a slot of the submitting batch's own for this
     * transport, that nobody else touches during the submit.  The
     * transport may keep one object there for the batch's next submits
     * (a connection looked up, with its reference); the engine hands it to
     * peer_cache_release when the batch goes. */
    void **cache;
    /* The descriptor the strings above and the slices' remote_key come
     * from, by a number no other descriptor of this process ever has: what
     * a transport derived from one of those strings (an unpacked key, say)
     * it may find again by (descriptor_serial, string address), without
     * reading the string. */
    uint64_t descriptor_serial;
} ferry_peer_t;

typedef struct ferry_slice ferry_slice_t;
struct ferry_slice {
    ferry_opcode_t opcode;
    void *local;
    uint64_t remote_addr;
    size_t length;
    const char *remote_key; /* this transport's key for the remote buffer */
    void *local_memh;       /* this transport's handle for the local buffer, or NULL */
    ferry_slice_t *next;    /* owned by the transport between submit and done */
    void *owner;            /* engine private */
    /* local is device memory, given only to a transport whose local_memory
     * took it: never touched by the CPU (move it with the services'
     * stage_in and stage_out, token NULL). */
    int local_device;
};

typedef enum ferry_access {
    FERRY_ACCESS_READ = 1,  /* a peer reads from this engine's memory */
    FERRY_ACCESS_WRITE = 2, /* a peer writes into this engine's memory */
    /* With READ or WRITE: the caller serves storage buffers too (it does
     * their I/O on the file); without it a storage buffer is refused
     * (FERRY_ERR_UNSUPPORTED), its addresses being no memory. */
    FERRY_ACCESS_STORAGE = 4,
} ferry_access_t;

/* A storage range's file, for a target that moves its bytes (the
 * services' storage_file). */
typedef struct ferry_storage_file {
    /* The owner's descriptor: neither closed nor moved (positioned calls
     * only); writes with write_flags (pwritev2's: RWF_DSYNC for durable
     * storage). */
    int fd;
    uint64_t offset; /* the file offset of addr */
    int write_flags;
    /* addr's bytes in a MAP_SHARED mapping of the storage (the page cache
     * itself: a copy from it is a read), made on first use and unmapped
     * with the storage; NULL where it is not mapped.  Only the
     * kernel may touch it (send from it): a file cut short makes its end
     * fault, which a system call answers with EFAULT and a CPU load with
     * SIGBUS. */
    const void *mapped;
    /* The same mapping where writes may go there: storage peers may
     * write, not durable (a store to the page cache is no RWF_DSYNC);
     * else NULL.  A write past the file's end faults: check its size. */
    void *mapped_writable;
} ferry_storage_file_t;

typedef struct ferry_transport_services {
    size_t size;
    void *engine;
    const char *segment_name;
    uint64_t generation;
    const char *rpc_endpoint;   /* this engine's RPC host:port */
    const char *advertise_host; /* host address to put in endpoint strings */
    /* Target side: may a peer touch [addr, addr+length)?  On FERRY_OK the
     * range stays registered until access_release(token). */
    ferry_status_t (*access_acquire)(void *engine, uint64_t addr, uint64_t length,
                                     ferry_access_t access, void **token_p);
    void (*access_release)(void *engine, void *token);
    /* Initiator side: a slice finished (any thread, once per slice). */
    void (*slice_done)(ferry_slice_t *slice, ferry_status_t status);
    /* A peer whose RPC endpoint is rpc talks to us: tell it on unregister. */
    void (*peer_seen)(void *engine, const char *rpc);
    /* Target side: a notify arrived through the transport (any thread). */
    void (*notify_deliver)(void *engine, const char *from, const void *msg, size_t length);
    /* Target side, for a range access_acquire granted: whether it is
     * device memory, which the transport must not touch with the CPU (nor
     * hand to a system call) but move with stage_in and stage_out.  A
     * storage buffer (FERRY_ACCESS_STORAGE) answers 1 too: stage_in and
     * stage_out then write and read its file. */
    int (*access_is_device)(void *engine, void *token);
    /* Device memory: fill length bytes at dst from what fill writes into
     * page-locked host buffers (a socket's payload), each buffer copied to
     * the device while fill writes the next.  fill's failure ends it and
     * is returned.  token: the target's access_acquire token of the range,
     * or NULL (an initiator's slice with local_device: the pointer says
     * whose memory it is). */
    ferry_status_t (*stage_in)(void *engine, void *token, void *dst, size_t length,
                               ferry_status_t (*fill)(void *arg, void *buffer, size_t length),
                               void *arg);
    /* The other way: length bytes at src go to drain in host buffers, the
     * next one copied off the device while drain takes this one. */
    ferry_status_t (*stage_out)(void *engine, void *token, const void *src, size_t length,
                                ferry_status_t (*drain)(void *arg, const void *buffer,
                                                        size_t length),
                                void *arg);
    /* Initiator side: a chain of slices (linked by next) finished, all
     * with one status: what slice_done on each would do, at the cost of
     * one call (a request's and a batch's countdowns move once per run of
     * their slices, not once per slice).  Each slice is in one chain or
     * one slice_done, never both.  Use FERRY_TRANSPORT_SERVICES_HAS: an
     * older engine's table ends before it. */
    void (*slices_done)(ferry_slice_t *slices, ferry_status_t status);
    /* Target side, for a storage range access_acquire granted: how the
     * transport moves its bytes itself instead of through stage_in and
     * stage_out's bounce buffer (*file, valid until access_release(token)).
     * FERRY_ERR_UNSUPPORTED: no storage, or storage registered DIRECT or
     * SHARED (it must not go through this host's page cache): stage_in and
     * stage_out keep it.  Use FERRY_TRANSPORT_SERVICES_HAS. */
    ferry_status_t (*storage_file)(void *engine, void *token, uint64_t addr,
                                   ferry_storage_file_t *file);
} ferry_transport_services_t;

/* Whether the engine's services table (maybe of an older engine, hence
 * shorter) has the member. */
#define FERRY_TRANSPORT_SERVICES_HAS(svc, member)                                          \
    ((svc)->size >= offsetof(ferry_transport_services_t, member) + sizeof((svc)->member) &&  \
     (svc)->member != NULL)

/* Finish a chain of slices with one status through whichever the engine
 * offers. */
static inline void ferry_transport_slices_done(const ferry_transport_services_t *svc,
                                               ferry_slice_t *slices, ferry_status_t status)
{
    if (FERRY_TRANSPORT_SERVICES_HAS(svc, slices_done)) {
        if (slices != NULL)
            svc->slices_done(slices, status);
        return;
    }
    for (ferry_slice_t *slice = slices, *next; slice != NULL; slice = next) {
        next = slice->next;
        slice->next = NULL;
        svc->slice_done(slice, status);
    }
}

typedef enum ferry_reach {
    FERRY_REACH_NO = 0,
    FERRY_REACH_YES = 1,
    FERRY_REACH_FALLBACK = 2,
} ferry_reach_t;

/* What a waiter gives a transport's wait op (ferry_transport_ops_t.wait). */
typedef struct ferry_wait {
    /* Whether the wait is over: cheap, any thread, called often. */
    int (*done)(void *arg);
    /* The waiter's own sleep until done or the deadline, woken by whoever
     * finishes its requests: FERRY_OK or FERRY_ERR_TIMEOUT. */
    ferry_status_t (*sleep)(void *arg, const struct timespec *deadline);
    void *arg;
    const struct timespec *deadline; /* absolute, CLOCK_MONOTONIC; NULL: none */
} ferry_wait_t;

typedef struct ferry_transport_ops {
    size_t size;
    ferry_status_t (*create)(const ferry_transport_services_t *svc, void **ctx_p);
    void (*destroy)(void *ctx);
    /* The endpoint string peers use to reach us (malloc-ed). */
    ferry_status_t (*address)(void *ctx, char **endpoint_p);
    /* key_p: malloc-ed key string for the descriptor ("" if none needed).
     * FERRY_ERR_UNSUPPORTED: this transport does not reach memory at that
     * location (device memory, for most): the buffer is published without
     * its key, and the registration goes on with the other transports. */
    ferry_status_t (*mem_register)(void *ctx, void *addr, size_t length, const char *location,
                                   char **key_p, void **memh_p);
    void (*mem_deregister)(void *ctx, void *memh);
    /* Can this transport move data to that peer's buffer?  A ferry_reach_t:
     * FERRY_REACH_FALLBACK says "only if no other transport can" (a path
     * that works but is slow or fragile for this buffer). */
    int (*reaches)(void *ctx, const ferry_peer_t *peer, const char *remote_key);
    /* Queue a list of slices (linked by next).  Every slice queued is
     * finished by exactly one slice_done.  A non-OK return means no slice
     * was queued; FERRY_ERR_STALE says the peer's generation differs. */
    ferry_status_t (*submit)(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);
    /* Drop connections and cached keys for that peer incarnation. */
    void (*peer_forget)(void *ctx, const ferry_peer_t *peer);
    /* Slice size this transport wants, 0 = no slicing; asked once, after
     * create. */
    size_t (*slice_size)(void *ctx);
    /* Optional: deliver a notify (<= FERRY_NOTIFY_MAX bytes) to the peer, which
     * hands it to its engine's notify_deliver.  Returns once the peer has it
     * or the transport's bound passed.  NULL: the engine uses its RPC. */
    ferry_status_t (*notify)(void *ctx, const ferry_peer_t *peer, const char *from,
                             const void *msg, size_t length);
    /* Optional: advance this transport's requests on the calling thread and
     * return how many events that completed.  ferry_batch_wait calls it in a
     * loop for FERRY_WAIT_SPIN microseconds before it sleeps, so a request
     * can finish without a handoff from the transport's own thread, and
     * ferry_engine_progress calls it for a program that polls memory.  Any
     * thread, concurrently; cheap when nothing is in flight. */
    unsigned (*progress)(void *ctx);
    /* Optional: allocate length bytes of the memory this transport reaches
     * best (UCX: memory UCX maps itself, which same-host peers attach; CXL:
     * the shared window), registered with this transport as mem_register
     * would; mem_deregister(memh) releases it.  FERRY_ERR_UNSUPPORTED: this
     * transport has no such memory for that location. */
    ferry_status_t (*mem_alloc)(void *ctx, size_t length, const char *location, void **addr_p,
                                char **key_p, void **memh_p);
    /* Optional: that peer incarnation unregistered memory (its owner told
     * us): drop what is cached per buffer (unpacked keys, attachments) once
     * no request uses it; connections stay. */
    void (*peer_changed)(void *ctx, const ferry_peer_t *peer);
    /* Optional: the caller that drove progress is about to sleep
     * (ferry_batch_wait, after its spin): a transport whose own thread
     * keeps off while callers poll takes over now, not at its next look. */
    void (*progress_leave)(void *ctx);
    /* Optional: release what submit kept in a ferry_peer_t's cache slot
     * (called before destroy).  Without it, submit gets no slot. */
    void (*peer_cache_release)(void *ctx, void *cached);
    /* Optional: the engine is going.  Close listeners, end every request
     * served for a peer (access_release called) and finish every slice in
     * flight (FAILED when not done), and join the threads that would call
     * the engine's services: after it, the transport calls none of them.
     * mem_deregister and peer_cache_release still work; destroy follows.
     * Without it, the engine waits for each registration's accesses to end
     * before deregistering (the transport's own timeouts bound that), then
     * destroys the transport. */
    void (*stop)(void *ctx);
    /* Optional: whether submit takes a local buffer at that location (a
     * device pointer it copies without the CPU).  Without it: host memory
     * only, and the engine stages device memory through host buffers.  A
     * transport that cannot reach a remote buffer at some location says so
     * in mem_register (FERRY_ERR_UNSUPPORTED: no key for that buffer). */
    int (*local_memory)(void *ctx, const char *location);
    /* Optional (ferry_batch_cancel): finish with FERRY_ERR_CANCELED, through
     * slices_done and outside the transport's locks, every slice it holds
     * whose owner lies in [owner_lo, owner_hi) and whose bytes it can still
     * keep from moving (not yet handed to the wire or the copy); leave the
     * others to finish as they would.  Never reports a slice CANCELED whose
     * bytes may still land.  Without it, nothing is cancelled. */
    void (*cancel)(void *ctx, const void *owner_lo, const void *owner_hi);
    /* Optional: wait for w->done in this transport (README of the file
     * transport, "Waiting in the ring"): block the calling thread where the
     * transport's own events arrive (a completion queue, not a futex),
     * finishing every completion it takes meanwhile, other batches'
     * included (their waiters are woken as by the transport's thread), until
     * w->done(w->arg) holds or w->deadline passes; or, where it cannot (say,
     * another thread waits there already), call w->sleep and see that its
     * own thread finishes the requests.  FERRY_OK or FERRY_ERR_TIMEOUT.
     * ferry_batch_wait calls it, after its spin, when every request of the
     * batch's round went to this transport.  Any thread, concurrently. */
    ferry_status_t (*wait)(void *ctx, const struct ferry_wait *w);
} ferry_transport_ops_t;

/* Whether a transport's ops table (maybe of an older plugin, hence shorter)
 * has the optional member. */
#define FERRY_TRANSPORT_OPS_HAS(ops, member)                                             \
    ((ops)->size >= offsetof(ferry_transport_ops_t, member) + sizeof((ops)->member) &&   \
     (ops)->member != NULL)

/* ferry_plugin_t.flags */
enum {
    FERRY_TRANSPORT_SAME_HOST_ONLY = 1u << 0, /* transports: never across hosts */
    FERRY_METADATA_OWNER_SERVES = 1u << 1,    /* metadata: peers fetch descriptors from their
                                                 owner, so publish needs no encoding */
    /* transports: works only once the user configured it.  create returns
     * FERRY_ERR_UNSUPPORTED when not configured: the engine skips it without
     * a word; any other failure fails the engine, since the user asked for
     * it.  Named in FERRY_TRANSPORTS while not configured: an error. */
    FERRY_TRANSPORT_OPT_IN = 1u << 2,
    /* transports: the initiator copies into the peer's memory and the peer
     * checks nothing (shm, cxl, ucx rkeys).  The engine counts such
     * requests per segment, and an invalidation by the segment's owner
     * waits until those that resolved before it ended (the unregister
     * rule); their descriptors must be confirmed by the owner. */
    FERRY_TRANSPORT_ONE_SIDED = 1u << 3,
    /* transports: whoever holds this transport's key of a buffer can read
     * it, whatever the buffer's flags (a UCX rkey): a buffer that is not
     * remote-readable is published without this transport's key. */
    FERRY_TRANSPORT_KEY_GRANTS_READ = 1u << 4,
    /* metadata: every reader of this store is a Ferry engine, so it may
     * hold descriptors in their compact form (doc/metadata.md, "Descriptor
     * forms"); without it (an older plugin, or a store others read, as
     * Mooncake's HTTP server) descriptors are published as JSON. */
    FERRY_METADATA_COMPACT = 1u << 5,
    /* transports: reaches storage buffers (location "file", from
     * ferry_register_storage).  Such a buffer is registered with these
     * transports only, and mem_register is not called: their key is the
     * engine's storage key (src/core/storage_key.c), which says where the
     * storage lives and how a peer recognises it. */
    FERRY_TRANSPORT_STORAGE = 1u << 6,
    /* transports: the target side serves storage buffers for peers that
     * cannot reach the storage themselves: it passes FERRY_ACCESS_STORAGE
     * to access_acquire and moves a range for which access_is_device says
     * 1 with stage_in and stage_out, which do the file's I/O.  A storage
     * buffer is registered with it too (mem_register, location "file"). */
    FERRY_TRANSPORT_SERVES_STORAGE = 1u << 7,
};

/* ---- metadata stores ---- */

typedef struct ferry_metadata_services {
    size_t size;
    void *engine;
    const char *rpc_endpoint;
    /* p2p: fetch a descriptor from the engine listening at rpc (host:port). */
    ferry_status_t (*rpc_fetch)(void *engine, const char *rpc, const char *name,
                                char **descriptor_p);
    /* A watch saw the named segment republished or gone: cached copies are
     * stale (any thread; must not be called with a lock the plugin's other
     * calls need). */
    void (*segment_changed)(void *engine, const char *name);
} ferry_metadata_services_t;

/*
 * A store keeps this engine's newest descriptor: when the server cannot be
 * reached, publish returns FERRY_ERR_METADATA (the engine logs it, the
 * registration still succeeds) and the store keeps retrying in the
 * background until the server takes it.  fetch is bounded in time.
 */
typedef struct ferry_metadata_ops {
    size_t size;
    ferry_status_t (*create)(const ferry_metadata_services_t *svc, const char *uri,
                             void **ctx_p);
    void (*destroy)(void *ctx);
    ferry_status_t (*publish)(void *ctx, const char *name, const char *descriptor);
    /* FERRY_ERR_SEGMENT_NOT_FOUND when no such segment. */
    ferry_status_t (*fetch)(void *ctx, const char *name, char **descriptor_p);
    ferry_status_t (*remove)(void *ctx, const char *name);
    /* Optional: the segment name to use when the user chose none. */
    ferry_status_t (*default_name)(void *ctx, char **name_p);
    /*
     * Optional, both or neither (found through size, FERRY_METADATA_OPS_HAS:
     * an older plugin lacks them and its readers fetch whole): change
     * records beside the descriptor, so that a reader holding revision v
     * reads only what changed since, and an owner need not store its whole
     * descriptor on every change (doc/metadata.md, "Incremental refresh").
     * The records are opaque texts to the store.
     *
     * publish_changes stores `text`, the record that leads from revision - 1
     * to `revision` (generation's), with the descriptor's lifetime (lease,
     * expiry), and makes `revision` the newest; records below `oldest` may
     * go.  The descriptor under the segment's key is then a checkpoint: the
     * engine publishes it whole only now and then, right after the
     * publish_changes of its revision, and readers bring it up to date with
     * the records after it.  Anything but FERRY_OK (text NULL: no record
     * for this revision; the store keeps too many since the checkpoint; the
     * server is away) makes the engine publish the whole descriptor next.
     * A store that loses its records (restart, a write that failed) must
     * not let a reader mistake the loss for "nothing changed": it writes
     * the checkpoint, the records since it and the newest revision again.
     *
     * fetch_changes: the newest revision the store knows for that
     * segment, its generation, and the records it holds of revisions
     * above `since` and up to the newest, ascending (*records_p and each
     * text malloc-ed; the caller checks that none is missing).
     * FERRY_ERR_SEGMENT_NOT_FOUND: the store knows no newest revision.
     */
    ferry_status_t (*publish_changes)(void *ctx, const char *name, uint64_t generation,
                                      uint64_t revision, uint64_t oldest, const char *text);
    ferry_status_t (*fetch_changes)(void *ctx, const char *name, uint64_t since,
                                    uint64_t *generation_p, uint64_t *newest_p,
                                    char ***records_p, size_t *count_p);
} ferry_metadata_ops_t;

/* Whether a metadata ops table (maybe of an older plugin, hence shorter)
 * has the optional member. */
#define FERRY_METADATA_OPS_HAS(ops, member)                                              \
    ((ops)->size >= offsetof(ferry_metadata_ops_t, member) + sizeof((ops)->member) &&    \
     (ops)->member != NULL)

/* ---- the plugin ---- */

typedef enum ferry_plugin_kind {
    FERRY_PLUGIN_TRANSPORT = 1,
    FERRY_PLUGIN_METADATA = 2,
} ferry_plugin_kind_t;

typedef struct ferry_plugin {
    uint32_t abi_version;
    ferry_plugin_kind_t kind;
    const char *name;        /* "tcp", "ucx", "p2p", "etcd", ... */
    const char *description; /* one line */
    int priority;            /* transports: higher wins selection */
    unsigned flags;
    const ferry_setting_t *settings; /* for ferry_info -c; may be NULL */
    size_t settings_count;
    const char *settings_component;  /* e.g. "TCP" for FERRY_TCP_* */
    const void *ops;         /* ferry_transport_ops_t or ferry_metadata_ops_t */
    void (*info)(FILE *out); /* optional: version and details for ferry_info */
    /* Transports of accelerator modules (cuda_ipc, hip_ipc): the vendor
     * table (accel.h), used by the engine whether or not the transport is
     * enabled.  NULL for every other plugin. */
    const ferry_accel_ops_t *accel;
} ferry_plugin_t;

typedef const ferry_plugin_t *(*ferry_plugin_entry_fn_t)(void);

#ifdef __cplusplus
}
#endif

#endif
