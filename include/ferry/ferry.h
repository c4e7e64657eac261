/*
 * Ferry: a transfer engine for HPC and AI clusters.
 *
 * A process registers memory; the engine publishes it as a segment (a name, a
 * generation and a list of buffers) through a metadata store.  Any other engine
 * opens the segment by name and moves bytes with "READ/WRITE length bytes at
 * address target_offset of segment X".  See ferry(7) in doc/ for the model.
 *
 * Threads: every call is safe from many threads on one engine.  A handle used
 * after it was destroyed, or with another engine, returns FERRY_ERR_INVALID_HANDLE.
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <ferry/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_VERSION_MAJOR 0
#define FERRY_VERSION_MINOR 1

typedef struct ferry_engine_handle *ferry_engine_h;
typedef struct ferry_segment_handle *ferry_segment_h;
typedef struct ferry_batch_handle *ferry_batch_h;

/*
 * Engine configuration.  Set a bit in field_mask for each field you fill;
 * fields whose bit is clear come from the FERRY_* variable named beside
 * them, or from the default.  A field given here wins over the variable.
 */
enum {
    FERRY_CONFIG_FIELD_NAME = 1u << 0,       /* FERRY_SEGMENT_NAME */
    FERRY_CONFIG_FIELD_METADATA = 1u << 1,   /* FERRY_METADATA */
    FERRY_CONFIG_FIELD_RPC_ADDRESS = 1u << 2,/* FERRY_RPC_ADDRESS */
    FERRY_CONFIG_FIELD_TRANSPORTS = 1u << 3, /* FERRY_TRANSPORTS */
    FERRY_CONFIG_FIELD_MODULE_DIR = 1u << 4, /* FERRY_MODULE_DIR */
    FERRY_CONFIG_FIELD_HOST_ID = 1u << 5,    /* FERRY_HOST_ID */
};

typedef struct ferry_config {
    uint64_t field_mask;
    const char *name;        /* segment name; p2p default: the RPC host:port */
    const char *metadata;    /* metadata store URI: "p2p", "pmix", ...; NULL/"": pmix
                              * in a PMIx-launched job (module installed), else p2p */
    const char *rpc_address; /* RPC listen address "host[:port]" */
    const char *transports;  /* "tcp,ucx" or "^ucx"; empty: every built one */
    const char *module_dir;  /* where loadable plugins are found */
    const char *host_id;     /* host identity override (tests fake hosts) */
} ferry_config_t;

FERRY_API ferry_status_t ferry_engine_create(const ferry_config_t *config, ferry_engine_h *engine_p);
FERRY_API void ferry_engine_destroy(ferry_engine_h engine);

/* The name peers open this engine's segment by (valid until destroy). */
FERRY_API const char *ferry_engine_segment_name(ferry_engine_h engine);

/*
 * Advance the transports that can make progress on the calling thread (ucx)
 * and return how many events that handled (0 when there was nothing to do;
 * tcp, shm and cxl never need it).  Optional: every transport also
 * progresses on its own threads, and ferry_batch_wait polls for
 * FERRY_WAIT_SPIN microseconds before sleeping.  A program that waits by
 * polling memory for a peer's write (a flag at the end of a message) calls
 * it in that loop, so an incoming write is placed without waiting for a
 * transport thread to be scheduled, as with ucp_worker_progress.
 */
FERRY_API unsigned ferry_engine_progress(ferry_engine_h engine);

/* Registration flags. */
enum {
    FERRY_REG_REMOTE_READ = 1u << 0,  /* peers may READ the range */
    FERRY_REG_REMOTE_WRITE = 1u << 1, /* peers may WRITE the range */
    FERRY_REG_DEFER_PUBLISH = 1u << 2, /* publish later with ferry_publish() */
};
#define FERRY_REG_REMOTE (FERRY_REG_REMOTE_READ | FERRY_REG_REMOTE_WRITE)

typedef struct ferry_region {
    void *addr;
    size_t length;
    /* "cpu", "cpu:NUMA", "cxl", "cuda:N", "hip:N", ...; NULL or "" = "cpu";
     * "*": detected from the pointer (device memory of an accelerator
     * module's vendor, else "cpu").  The grammar: kind[:qualifier], kind
     * [a-z][a-z0-9_]*, qualifier [A-Za-z0-9_.-]+, 64 bytes at most;
     * anything else is FERRY_ERR_INVALID_PARAM.  Device memory at a
     * location that contradicts the pointer (host memory as "cuda:0",
     * cuda:0 memory as "cpu" or "cuda:1") is FERRY_ERR_INVALID_PARAM, a
     * range past the end of its device allocation FERRY_ERR_OUT_OF_RANGE,
     * a device kind without a usable module FERRY_ERR_UNSUPPORTED.  Device
     * ordinals are this process's (CUDA_VISIBLE_DEVICES applies). */
    const char *location;
} ferry_region_t;

/*
 * Register [addr, addr+length).  A range that partially overlaps a registered
 * one is refused (FERRY_ERR_OVERLAP); the identical range again, with the
 * same flags and location, takes a reference that ferry_unregister() drops;
 * with other flags or another location it is refused
 * (FERRY_ERR_INVALID_PARAM: unregister it first to change them).  flags 0
 * means FERRY_REG_REMOTE.
 */
FERRY_API ferry_status_t ferry_register(ferry_engine_h engine, void *addr, size_t length,
                              const char *location, unsigned flags);
/* All or nothing: on error no region stays registered. Publishes once. */
FERRY_API ferry_status_t ferry_register_batch(ferry_engine_h engine, const ferry_region_t *regions,
                                    size_t count, unsigned flags);
/* Drop one reference on the range starting at addr; the last one waits for
 * transfers on it, deregisters, publishes and tells peers. */
FERRY_API ferry_status_t ferry_unregister(ferry_engine_h engine, void *addr);
/* Publish the segment now (registrations do it themselves unless deferred):
 * FERRY_OK once the metadata store has it, else the store's error (a shared
 * store keeps retrying in the background; ferry_register succeeds all the
 * same).  So a caller that must know its segment can be opened asks this. */
FERRY_API ferry_status_t ferry_publish(ferry_engine_h engine);

/*
 * Allocate length bytes that peers reach best and register them (flags as
 * for ferry_register).  The memory comes from the highest-priority transport
 * that provides memory at that location (location NULL = "cpu"): with ucx,
 * memory UCX maps itself, which a same-host peer attaches and writes with
 * plain stores instead of UCX's emulated RMA on registered user memory;
 * at a device location ("cuda:N", "hip:N"), device memory from the
 * accelerator module, which peers on the host open through GPU IPC;
 * at location "cxl" (or "cxl:N"), chunks of the cxl transport's shared
 * window (FERRY_CXL_PATH; FERRY_ERR_UNSUPPORTED without one,
 * FERRY_ERR_NO_MEMORY when it is full); for "cpu" without such a
 * transport, page-aligned heap memory (from 2 MiB up: 2 MiB-aligned,
 * transparent huge pages advised).  *addr_p is the
 * segment address peers use.  Release with ferry_free (ferry_unregister
 * refuses to drop its last registration); ferry_engine_destroy frees what
 * is left.
 */
FERRY_API ferry_status_t ferry_alloc(ferry_engine_h engine, size_t length, const char *location,
                                     unsigned flags, void **addr_p);
/* Unregister (waiting for transfers, telling peers) and release memory from
 * ferry_alloc.  FERRY_ERR_BUSY while it is registered again on top. */
FERRY_API ferry_status_t ferry_free(ferry_engine_h engine, void *addr);

FERRY_API ferry_status_t ferry_segment_open(ferry_engine_h engine, const char *name,
                                  ferry_segment_h *segment_p);
FERRY_API ferry_status_t ferry_segment_close(ferry_engine_h engine, ferry_segment_h segment);
/* Fetch the descriptor again; name NULL refreshes every open segment. */
FERRY_API ferry_status_t ferry_segment_refresh(ferry_engine_h engine, const char *name);

/* The decoded descriptor of a segment as JSON text; free() it. */
FERRY_API ferry_status_t ferry_segment_describe(ferry_engine_h engine, ferry_segment_h segment,
                                      char **json_p);

/*
 * Ask whether the engine that owns an opened segment is alive: one request
 * and reply to the RPC endpoint in the descriptor this engine holds, no
 * data moved, nothing fetched.  Returns
 *   FERRY_OK                 its engine answered, the same incarnation we hold
 *                            (also at once for this engine's own segment);
 *   FERRY_ERR_TIMEOUT        no answer within timeout_ms: frozen, overloaded,
 *                            or the network drops packets;
 *   FERRY_ERR_PEER_FAILED    the connection was refused or reset: nobody
 *                            listens there any more (killed, exited);
 *   FERRY_ERR_STALE          another incarnation answers (the owner restarted
 *                            under the same name and address: a new generation,
 *                            or it is still starting).  The segment is marked
 *                            stale: its next request fetches the new descriptor;
 *   FERRY_ERR_INVALID_HANDLE a bad engine or segment handle;
 *   another error            FERRY_ERR_PROTOCOL for a garbled answer,
 *                            FERRY_ERR_UNSUPPORTED when the descriptor names no
 *                            RPC endpoint.
 * timeout_ms <= 0 means FERRY_RPC_TIMEOUT.  Bounded: each step of the
 * exchange (connect, reply) waits at most timeout_ms, so a peer that
 * accepts but never answers (SIGSTOP) returns TIMEOUT after about
 * timeout_ms, a dead one at once, and no probe takes more than a small
 * multiple (3x) of timeout_ms.  Safe from any thread, alongside transfers
 * to the same segment; it takes no lock that transfers wait for.
 */
FERRY_API ferry_status_t ferry_segment_probe(ferry_engine_h engine, ferry_segment_h segment,
                                             int timeout_ms);

/*
 * Segment blobs, for applications that exchange metadata themselves (a
 * router, a launcher, their own sockets) instead of through a metadata
 * store.
 *
 * ferry_engine_export_blob copies this engine's segment descriptor, as a
 * peer fetching it now would get it, into blob as bytes: a 16-byte header
 * (magic "FERRYB", version 1, length, checksum) and the compact descriptor
 * text, which carries the segment name, the engine's generation and
 * revision, its host identity, RPC endpoint, transports and registered
 * buffers (addresses, lengths, access, location, transport keys: no data,
 * no secrets beyond what a metadata store holds).  The bytes are opaque to
 * the caller and not NUL-terminated.  *length_p always gets the blob's
 * size; blob NULL (capacity 0) only asks for it; a capacity too small
 * returns FERRY_ERR_OUT_OF_RANGE and writes nothing.  The size changes as
 * buffers are registered: ask again, or give room to spare.
 *
 * ferry_segment_open_blob opens the segment a blob describes without
 * asking the metadata store; ferry_segment_close closes it.  A blob that
 * was cut, padded, corrupted, of another version or not a blob at all
 * returns FERRY_ERR_DECODE with one log line saying what is wrong; nothing
 * is opened.  If a segment of that name is open already (by name or from
 * an earlier blob), this takes one more open of it and the blob's contents
 * are not used (ferry_segment_refresh updates it).
 *
 * Refresh: a blob is a snapshot.  A segment opened from one refreshes from
 * its owner over RPC, never from the store: when a request falls outside
 * the buffers it holds, or the owner invalidated them (it unregistered
 * memory), or ferry_segment_refresh is called, the engine asks the owner at
 * the blob's RPC endpoint for what changed.  So buffers the owner
 * registers later become reachable without a new blob, and buffers it
 * unregistered are refused (FERRY_ERR_OUT_OF_RANGE at submit, or a failed
 * request).  An owner that restarted at the same RPC address under the same
 * name is followed to its new generation (as ferry_segment_open's are);
 * one that is gone, or moved, cannot be reached: requests fail
 * (FERRY_ERR_PEER_FAILED, FERRY_ERR_CONNECT) until the application opens a
 * new blob.  Bounds are checked as for any segment: the owner's transport
 * refuses what is outside its registered, remote-accessible buffers,
 * whatever the blob claims, and a one-sided transport uses a blob's
 * descriptor only after its owner confirmed it over RPC.
 */
FERRY_API ferry_status_t ferry_engine_export_blob(ferry_engine_h engine, void *blob,
                                                  size_t capacity, size_t *length_p);
FERRY_API ferry_status_t ferry_segment_open_blob(ferry_engine_h engine, const void *blob,
                                                 size_t length, ferry_segment_h *segment_p);

typedef enum ferry_opcode {
    FERRY_OP_READ = 0,  /* remote -> local */
    FERRY_OP_WRITE = 1, /* local -> remote */
} ferry_opcode_t;

typedef struct ferry_request {
    ferry_opcode_t opcode;
    void *local;
    ferry_segment_h target;
    uint64_t target_offset; /* an address in the target segment (the published addr) */
    size_t length;
    /* NULL: the engine picks the transport (FERRY_TRANSPORTS, then the
     * default order).  A name ("tcp", "shm", "ucx", "cxl", ...): that
     * transport serves the request, or the submit fails with
     * FERRY_ERR_UNSUPPORTED and a log line saying why (not enabled here or
     * by the peer, same-host only, or it does not reach the buffer).
     * Requests to the engine's own segment are local copies regardless. */
    const char *transport;
} ferry_request_t;

typedef enum ferry_xfer_state {
    FERRY_XFER_WAITING = 0, /* never submitted */
    FERRY_XFER_PENDING = 1,
    FERRY_XFER_COMPLETED = 2,
    FERRY_XFER_FAILED = 3,
    FERRY_XFER_CANCELLED = 4, /* ferry_batch_cancel stopped it (error FERRY_ERR_CANCELED):
                               * not all of its bytes moved, and none will any more */
} ferry_xfer_state_t;

typedef struct ferry_xfer_status {
    ferry_xfer_state_t state;
    ferry_status_t error; /* why it FAILED */
    size_t transferred;
    const char *transport; /* which transport served it */
} ferry_xfer_status_t;

FERRY_API ferry_status_t ferry_batch_create(ferry_engine_h engine, size_t max_requests,
                                  ferry_batch_h *batch_p);
/*
 * Queue requests.  Every request is checked before any is queued: one bad
 * request (argument, unknown range) fails the call and queues nothing.
 * A batch can be submitted again once its requests finished.
 */
FERRY_API ferry_status_t ferry_batch_submit(ferry_batch_h batch, const ferry_request_t *requests,
                                  size_t count);
FERRY_API ferry_status_t ferry_batch_status(ferry_batch_h batch, size_t index,
                                  ferry_xfer_status_t *status_p);
/* Wait until every submitted request finished: FERRY_OK if all completed,
 * the first request's error if one FAILED, FERRY_ERR_TIMEOUT after
 * timeout_ms (negative: no limit; the transports' own bounds still apply). */
FERRY_API ferry_status_t ferry_batch_wait(ferry_batch_h batch, int timeout_ms);
/* FERRY_ERR_BUSY while requests are in flight. */
FERRY_API ferry_status_t ferry_batch_destroy(ferry_batch_h batch);

/*
 * Cancel the batch's unfinished requests, best effort.  Each request then
 * ends either CANCELLED (error FERRY_ERR_CANCELED) or in its true final
 * state (COMPLETED, FAILED) as it would have without the call.  CANCELLED
 * is a promise: none of that request's bytes land after it is reported
 * (some of them may have landed before, the rest never will), so its
 * buffers may be reused at once.  A part of a request that a transport
 * cannot fence is left to finish, and the request ends as that part does:
 *   tcp   slices still queued behind a connection (not yet written to the
 *         socket) end CANCELLED at once; those already written run to their
 *         response or to the FERRY_TCP_TIMEOUT failure;
 *   shm, cxl, local copies: copied within ferry_batch_submit, never
 *         unfinished: nothing to cancel;
 *   ucx, ofi and other transports without the transport op `cancel`: left
 *         to finish (UCX and libfabric cannot take back an RMA they accepted).
 * A request part of which was cancelled and part of which FAILED ends
 * FAILED.  Returns FERRY_OK (also for a batch with nothing in flight: a
 * no-op) or FERRY_ERR_INVALID_HANDLE; ferry_batch_wait then returns
 * FERRY_ERR_CANCELED when the first unsuccessful request was cancelled.
 * The batch can be waited for, submitted again once finished, and
 * destroyed as usual; cancel may race ferry_batch_wait and completions
 * from any thread.  Cancelled and failed requests both count as failures
 * in the statistics.
 */
FERRY_API ferry_status_t ferry_batch_cancel(ferry_batch_h batch);

/* Attach a notify to the batch: delivered to the segment's owner after all of
 * the batch's data, when the batch completes without failure. */
FERRY_API ferry_status_t ferry_batch_notify(ferry_batch_h batch, ferry_segment_h segment,
                                  const void *msg, size_t length);

#define FERRY_NOTIFY_MAX 4096

typedef struct ferry_notify {
    char from[256];               /* sender's segment name */
    size_t length;
    unsigned char msg[FERRY_NOTIFY_MAX];
} ferry_notify_t;

/* Deliver msg to the segment's owner; returns once the owner queued it. */
FERRY_API ferry_status_t ferry_notify_send(ferry_engine_h engine, ferry_segment_h segment,
                                 const void *msg, size_t length);
/* Take up to max queued notifies (oldest first); *count_p may be 0. */
FERRY_API ferry_status_t ferry_notify_recv(ferry_engine_h engine, ferry_notify_t *msgs, size_t max,
                                 size_t *count_p);

/*
 * Statistics of the requests this engine finished, per transport and per
 * peer, counted since the engine started or the last ferry_stats_reset.
 * A request counts once, when it finishes (COMPLETED or FAILED), under the
 * transport that served it ("local" for copies to this engine's own
 * segment) and the peer it went to (the name its segment was opened by).
 * Its latency is from its ferry_batch_submit to the completion that
 * finished it; requests finished by one completion share one clock reading.
 * Counting costs a few relaxed atomic additions per completion call, not
 * per request; FERRY_STATS=no turns it off (the snapshots then show zeros).
 */
#define FERRY_STATS_BUCKETS 40

typedef enum ferry_stats_kind {
    FERRY_STATS_BY_TRANSPORT = 0, /* one entry per enabled transport, "local" first */
    FERRY_STATS_BY_PEER = 1,      /* one entry per segment ever opened, in order of opening */
} ferry_stats_kind_t;

typedef struct ferry_stats {
    char name[256];     /* the transport's, or the peer segment's (truncated) */
    uint64_t requests;  /* finished: completed + failed */
    uint64_t failures;  /* of which failed */
    uint64_t bytes;     /* moved by the completed ones */
    /* latency[i]: requests that took [2^i, 2^(i+1)) ns; latency[0] also
     * those under 1 ns, the last bucket everything longer. */
    uint64_t latency[FERRY_STATS_BUCKETS];
} ferry_stats_t;

/*
 * Fill stats[0 .. min(max, n)) with the n entries of that kind and set
 * *count_p to n (stats may be NULL with max 0 to ask for n).  A snapshot
 * is taken while requests finish: each counter is read once, so an entry
 * may show a request whose bytes are not in yet (`requests` is the sum of
 * the latency buckets).
 */
FERRY_API ferry_status_t ferry_stats_snapshot(ferry_engine_h engine, ferry_stats_kind_t kind,
                                              ferry_stats_t *stats, size_t max, size_t *count_p);
/* Zero every counter (the peers stay listed).  Requests finishing while it
 * runs may be counted before or after, or in part. */
FERRY_API ferry_status_t ferry_stats_reset(ferry_engine_h engine);
/* The latency under which a fraction q (0..1) of the entry's requests
 * finished: the upper edge of the bucket holding that one, in ns; 0 when
 * it counted none. */
FERRY_API uint64_t ferry_stats_latency_ns(const ferry_stats_t *stats, double q);

/* What ferry_info prints. */
enum {
    FERRY_INFO_VERSION = 1u << 0,
    FERRY_INFO_PLUGINS = 1u << 1,
    FERRY_INFO_SETTINGS = 1u << 2,
    FERRY_INFO_DEVICES = 1u << 3, /* accelerator modules, their state and devices */
    FERRY_INFO_COUNTERS = 1u << 4, /* this process's control-plane counters ("name value"
                                    * lines: RPC requests served and made, connections) */
};
FERRY_API void ferry_info_print(FILE *out, unsigned what);
FERRY_API const char *ferry_version_string(void);

/*
 * Storage buffers: a range of a file or block device that peers READ and
 * WRITE like memory (doc/storage.md).  ferry_register_storage reserves an
 * address range of this process (never memory: PROT_NONE, so it cannot
 * collide with a memory registration), registers it at location "file" and
 * returns its start in *addr_p: requests use it as target_offset, as for
 * memory.  ferry_unregister(engine, *addr_p) releases it: it waits for the
 * I/O on that range in flight here and, as for memory, for the peers that
 * do I/O on it themselves (the file transport) to drain and acknowledge.
 * Set a bit in field_mask for each optional field you fill.
 */
enum {
    FERRY_STORAGE_FIELD_OFFSET = 1u << 0,  /* default 0 */
    FERRY_STORAGE_FIELD_LENGTH = 1u << 1,  /* default: from offset to the end */
    FERRY_STORAGE_FIELD_FLAGS = 1u << 2,   /* default FERRY_REG_REMOTE */
    FERRY_STORAGE_FIELD_OPTIONS = 1u << 3, /* default 0 */
};

/* ferry_storage_region_t.options */
enum {
    /* Never O_DIRECT: every I/O goes through the page cache (a file that
     * is read again and again).  Refused with FERRY_STORAGE_SHARED. */
    FERRY_STORAGE_BUFFERED = 1u << 0,
    /* O_DIRECT only: an I/O whose file offset, length or local buffer is
     * not aligned to the storage's direct-I/O alignment FAILS
     * (FERRY_ERR_INVALID_PARAM) instead of going through the page cache. */
    FERRY_STORAGE_DIRECT = 1u << 1,
    /* A WRITE completes only once its data is on stable storage
     * (RWF_DSYNC / O_DSYNC), not when it is in the page cache. */
    FERRY_STORAGE_DURABLE = 1u << 2,
    /* Other hosts attach this storage too (NVMe-oF): no page cache on any
     * host, so an unaligned I/O FAILS as with FERRY_STORAGE_DIRECT.  Implied
     * for a block device that has a WWID. */
    FERRY_STORAGE_SHARED = 1u << 3,
};

typedef struct ferry_storage_region {
    uint64_t field_mask;
    const char *path;  /* a regular file or a block device; required */
    uint64_t offset;   /* of the range in the file */
    uint64_t length;   /* the range must lie inside the file's current size */
    unsigned flags;    /* FERRY_REG_REMOTE_READ / _WRITE / FERRY_REG_DEFER_PUBLISH */
    unsigned options;  /* FERRY_STORAGE_* */
} ferry_storage_region_t;

FERRY_API ferry_status_t ferry_register_storage(ferry_engine_h engine,
                                                const ferry_storage_region_t *region,
                                                void **addr_p);

#ifdef __cplusplus
}
#endif

#endif
