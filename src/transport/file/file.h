/*
 * The file transport: the initiator does the I/O of a storage buffer
 * (ferry_register_storage) itself, on its own descriptor of the same file or
 * namespace, when it can reach it (README.md: design, fencing and limits).
 *
 * Endpoint string: "file1:", the owner's process identity (plugin.h) and ":",
 * by which a same-host initiator sees that the owner is gone.  Buffer keys:
 * the engine's storage keys (src/core/storage_key.c), checked by the
 * descriptor decoders before they get here.
 *
 * Bounds: a slice is refused before any I/O unless it lies inside the
 * key's [addr, addr + len); its file offset is then off + (remote_addr -
 * addr).  The engine has already checked the buffer and its access flags
 * against a descriptor the owner confirmed (the transport is one-sided).
 *
 * Objects and who holds them:
 * - ferry_file_target_t (an opened remote storage range): refs are the
 *   table's one while it is in the table, plus one per op in flight; the
 *   last put closes its descriptors.  Immutable after it is made, except
 *   the owner liveness fields and nowait_refused (atomics).
 * - ferry_file_op_t (one slice's I/O): made by submit, freed by op_finish
 *   before its slice_done; the engine (uring or pool) owns it in between.
 *   Freed ops go to the transport's op cache (free_ops), freed at destroy.
 * Locks: ferry_file_t.lock guards the target table, op_lock the op cache;
 * each engine has its own (file_uring.c, file_pool.c).  No lock is held
 * across slice_done.
 */
#ifndef FERRY_FILE_H
#define FERRY_FILE_H

#include "../../core/core.h"

#include <pthread.h>
#include <stdatomic.h>

#define FERRY_FILE_ENDPOINT_PREFIX "file1:"
#define FERRY_FILE_TABLE_SIZE 64
#define FERRY_FILE_NOWAIT_READ 1
#define FERRY_FILE_NOWAIT_WRITE 2
#define FERRY_FILE_OP_CACHE 1024

typedef struct ferry_file_settings {
    char *engine;          /* auto, uring, threads */
    unsigned threads;
    unsigned queue_depth;
    unsigned liveness_ms;
    char *sysfs_root;
    char *dev_root;
    char *wwid_map;
    unsigned spin_us;        /* threads engine: how long an idle thread looks for work */
} ferry_file_settings_t;

typedef struct ferry_file_target {
    char *key_text;
    ferry_storage_key_t key;
    int reachable;           /* 0: a failed lookup, kept so it is logged once */
    int fd;                  /* page-cache I/O; -1 where none */
    int fd_direct;           /* O_DIRECT; -1 where the file system refuses it */
    int writable;
    char *owner;             /* the owner's segment name and generation */
    uint64_t generation;
    long pid;                /* a same-kernel owner, else 0 */
    unsigned long long start_time;
    atomic_uint_fast64_t checked_ms;
    atomic_int owner_gone;
    atomic_int unaligned_logged;
    atomic_uint refs;
    struct ferry_file_target *next;
    /* FERRY_FILE_NOWAIT_READ/_WRITE: RWF_NOWAIT refused (EOPNOTSUPP) on
     * fd, not tried again (the threads engine's inline attempt). */
    atomic_int nowait_refused;
} ferry_file_target_t;

typedef struct ferry_file_op {
    ferry_slice_t *slice;
    ferry_file_target_t *target;
    int fd;
    int write;
    int rw_flags;
    char *buffer;            /* what is left: [buffer, +left) at offset */
    size_t left;
    uint64_t offset;
    struct ferry_file_op *next;
} ferry_file_op_t;

typedef struct ferry_file ferry_file_t;

/* An I/O engine: start takes a chain of ops (linked by next), each ended by
 * exactly one ferry_file_op_finish; stop waits for those in flight. */
typedef struct ferry_file_engine_ops {
    const char *name;
    ferry_status_t (*create)(ferry_file_t *file, void **engine_p);
    void (*start)(void *engine, ferry_file_op_t *ops);
    void (*stop)(void *engine);
    /* Optional: finish what completed, on the calling thread; how many. */
    unsigned (*progress)(void *engine);
    /* Optional: the transport's wait op (plugin.h), for this engine. */
    ferry_status_t (*wait)(void *engine, const ferry_wait_t *w);
    /* Optional, with wait: an op ended outside the engine (file_gpu.c):
     * a thread blocked in wait looks at its done() again. */
    void (*kick)(void *engine);
} ferry_file_engine_ops_t;

struct ferry_file {
    ferry_transport_services_t svc;
    ferry_file_settings_t settings;
    char *address;
    pthread_mutex_t lock;    /* table */
    ferry_file_target_t *table[FERRY_FILE_TABLE_SIZE];
    const ferry_file_engine_ops_t *io;
    void *io_engine;
    /* Finished ops kept for the next submits, so that an I/O allocates
     * nothing (at most FERRY_FILE_OP_CACHE); op_lock guards them. */
    pthread_mutex_t op_lock;
    ferry_file_op_t *free_ops;
    unsigned n_free_ops;
    /* Device-memory slices' threads (file_gpu.c): made on the first such
     * slice under lock, stopped by destroy. */
    struct ferry_file_gpu *gpu;
};

extern const ferry_setting_t ferry_file_settings_table[];
extern const size_t ferry_file_settings_count;

/* file_target.c */
/* The target of a key (opened on first sight), referenced; never NULL
 * unless out of memory (an unreachable one has reachable 0). */
ferry_file_target_t *ferry_file_target_get(ferry_file_t *file, const ferry_peer_t *peer,
                                           const char *key_text);
void ferry_file_target_put(ferry_file_target_t *target);
/* Whether the owner still lives (looked up at most every liveness_ms). */
int ferry_file_target_owner_alive(ferry_file_t *file, ferry_file_target_t *target);
/* Drop the targets of that owner (every generation when generation is 0). */
void ferry_file_targets_forget(ferry_file_t *file, const char *owner, uint64_t generation);
void ferry_file_targets_free(ferry_file_t *file);

/* file_xfer.c */
ferry_status_t ferry_file_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);
/* An op's I/O ended: tell the engine, drop the target, free the op. */
void ferry_file_op_finish(ferry_file_t *file, ferry_file_op_t *op, ferry_status_t status);
/* Free the op cache (destroy, after the engine stopped). */
void ferry_file_ops_free(ferry_file_t *file);
/* Status of an I/O call's result n (bytes, or -errno), the op advanced:
 * FERRY_INPROGRESS when bytes are left (a short transfer: go on). */
ferry_status_t ferry_file_op_advance(ferry_file_op_t *op, long n);

/* file_gpu.c: ops whose slice has local_device (fd -1: chosen per I/O),
 * each ended by one ferry_file_op_finish on a thread of its own; stop
 * finishes those queued and joins the threads. */
void ferry_file_gpu_start(ferry_file_t *file, ferry_file_op_t *ops);
void ferry_file_gpu_stop(ferry_file_t *file);

/* file_pool.c, file_uring.c */
extern const ferry_file_engine_ops_t ferry_file_pool_ops;
/* NULL when built without liburing. */
extern const ferry_file_engine_ops_t *const ferry_file_uring_ops;

#endif
