/*
 * The GPU IPC transport (cuda_ipc, hip_ipc, the test suite's testgpu_ipc):
 * same-host copies between device memory of two processes, through the
 * vendor's IPC handles and asynchronous copies.  The code is the same for
 * every vendor; each module compiles it with its vendor file, which defines
 * ferry_gpu_ipc_vendor() (accel.h's table).  The engine treats it as
 * FERRY_TRANSPORT_ONE_SIDED: the owner's CPU never sees a request, and the
 * unregister rule (an invalidation waits for the copies that resolved before
 * it) is the core's; we finish a slice only once its event says so.
 *
 * Endpoint string (the descriptor's "transports":{"<kind>_ipc":...}):
 *   gpuipc1:<boot id>:<pid namespace>:<pid>:<start time>:<kind>
 * The identity says which process owns the handles (a shareable handle names
 * a file descriptor of that pid) and lets us see at once that it is gone or
 * restarted.  A peer whose identity equals ours is this process: we copy
 * with its addresses directly, opening nothing.
 *
 * Buffer key (mem_register; one per registration):
 *   gpuipc1:<alloc base hex>:<alloc length hex>:<buffer id hex>:<uuid>:<handle>
 * The handle (vendor ipc_export text, last so that it may hold any byte but
 * NUL) opens the whole allocation at its base, so a buffer registered inside
 * an allocation maps at import base + (remote_addr - alloc base).  The UUID
 * (no ':') names the device in every process whatever its ordinals.
 *
 * Bounds: the engine refuses a request outside the peer's published buffers
 * before it gets here, but a forged descriptor can claim anything: a slice
 * must lie inside [alloc base, alloc base + the length the open actually
 * mapped), and within what the key claims; otherwise the submit fails with
 * FERRY_ERR_OUT_OF_RANGE and nothing is written.
 *
 * Objects, locks, holders (no lock a submit that hits the cache takes is held
 * across a vendor call that may block for long: ipc_open runs under the
 * peer's open_lock only, event_wait under none):
 *   ferry_gpu_ipc_t.peers_lock   the peer table (peers, each peer's `next`)
 *   ferry_gpu_ipc_peer_t.lock    that peer's imports (list, users, stale)
 *   ferry_gpu_ipc_peer_t.open_lock  held across ipc_open, so that two submits
 *                                missing the same import open it once
 *   ferry_gpu_ipc_t.runs_lock    the runs in flight (runs, runs_tail, each run's
 *                                `next`), stopping; the progress thread's cond
 *   ferry_gpu_ipc_device_t.lock  the device's streams (made once) and event pool
 * Order: peers_lock, then peer->open_lock, then peer->lock; runs_lock and
 * device->lock are leaves.
 *
 * Who holds a peer (refs): the table (dropped by peer_forget or destroy),
 * each batch cache slot that keeps it (peer_cache_release), each submit
 * while it runs, each run in flight.  The last put frees it, closing its
 * imports (none has users by then: every run held the peer).
 * An import is used by runs (users, counted per slice); it is closed when
 * it is stale (peer_changed, peer_forget, the peer found gone) and has no
 * users, or when its peer is freed.
 */
#ifndef FERRY_GPU_IPC_H
#define FERRY_GPU_IPC_H

#include <ferry/accel.h>
#include <ferry/plugin.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define FERRY_GPU_IPC_PREFIX "gpuipc1:"
/* A peer is looked up in /proc before a submit and at a run's completion
 * when the last look is this old: a dead peer's slices fail. */
#define FERRY_GPU_IPC_LIVENESS_MS 20
#define FERRY_GPU_IPC_MAX_STREAMS 64
#define FERRY_GPU_IPC_MAX_DEVICES 64
#define FERRY_GPU_IPC_MIN(a, b) ((a) < (b) ? (a) : (b))
#define FERRY_GPU_IPC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

typedef struct ferry_gpu_ipc_settings {
    unsigned streams;  /* per device */
    unsigned poll_us;  /* the progress thread's pause between looks while copies run */
    size_t slice_size; /* 0: one copy per request */
    int pin_host;      /* page-lock registered host buffers */
} ferry_gpu_ipc_settings_t;

/* A parsed buffer key (pointers into the key string). */
typedef struct ferry_gpu_ipc_key {
    uintptr_t base;
    size_t length;
    uint64_t buffer_id;
    const char *uuid; /* up to the next ':' */
    size_t uuid_length;
    const char *handle; /* to the end */
} ferry_gpu_ipc_key_t;

/* Our registration of a local device buffer (a slice's local_memh): the
 * device its copies run on when the peer's device is not one we see. */
typedef struct ferry_gpu_ipc_memh {
    int device;  /* -1: host memory */
    void *pinned; /* host memory we page-locked (host_unregister at deregister), or NULL */
} ferry_gpu_ipc_memh_t;

/* One peer allocation opened in this process (peer->lock for users, stale
 * and next; the rest is immutable once in the list). */
typedef struct ferry_gpu_ipc_import {
    char *key;
    uint64_t hash;
    uintptr_t remote_base;
    size_t remote_length; /* what the key claims */
    char *local_base;     /* where the open mapped the allocation's base */
    size_t mapped;        /* the length the open actually mapped */
    void *opened;         /* for ipc_close */
    int device;           /* ordinal the open used (UUID matched), -1: the vendor chose */
    unsigned users;       /* slices in flight using it */
    int stale;            /* close once users is 0 */
    struct ferry_gpu_ipc_import *next;
} ferry_gpu_ipc_import_t;

/* One remote engine incarnation (endpoint, generation). */
typedef struct ferry_gpu_ipc_peer {
    struct ferry_gpu_ipc *gpu;
    char *endpoint;
    uint64_t generation;
    long pid; /* 0: not on our kernel and pid namespace */
    unsigned long long start_time;
    int self;                       /* the peer is this process */
    atomic_uint refs;
    atomic_int gone;                /* found dead: its slices fail */
    atomic_int forgotten;           /* out of the table: cache slots look again */
    atomic_uint_fast64_t checked_ms;
    pthread_mutex_t lock;
    pthread_mutex_t open_lock;      /* held across ipc_open: one open per handle */
    ferry_gpu_ipc_import_t *imports;
    struct ferry_gpu_ipc_peer *next; /* gpu->peers_lock */
} ferry_gpu_ipc_peer_t;

typedef struct ferry_gpu_ipc_device {
    char uuid[FERRY_ACCEL_UUID_MAX];
    pthread_mutex_t lock;
    void *streams[FERRY_GPU_IPC_MAX_STREAMS];
    unsigned n_streams;   /* lock; made on the device's first run */
    atomic_int ready;     /* streams made (read without the lock once set) */
    atomic_uint next;     /* round robin over the streams */
    void **events;        /* lock: the pool of free events */
    size_t n_events, events_cap;
} ferry_gpu_ipc_device_t;

/* Slices of one submit that run on one stream of one device, finished
 * together when the event recorded behind them is passed. */
typedef struct ferry_gpu_ipc_run {
    ferry_gpu_ipc_peer_t *peer; /* referenced */
    ferry_slice_t *slices;      /* linked by next */
    size_t n_slices;
    int device;
    void *event;                /* NULL: nothing to wait for */
    ferry_status_t status;      /* the first slice that failed to queue, and those after */
    size_t failed_from;         /* index of that slice (n_slices: none) */
    struct ferry_gpu_ipc_run *next;
    ferry_gpu_ipc_import_t *imports[]; /* one per slice, NULL for a same-process peer */
} ferry_gpu_ipc_run_t;

typedef struct ferry_gpu_ipc {
    ferry_transport_services_t svc;
    const ferry_accel_ops_t *vendor;
    ferry_gpu_ipc_settings_t settings;
    char identity[192];
    char *address;
    int n_devices;
    ferry_gpu_ipc_device_t *devices;

    pthread_mutex_t peers_lock;
    ferry_gpu_ipc_peer_t *peers;

    pthread_mutex_t runs_lock;
    pthread_cond_t runs_cond;       /* the progress thread waits for work */
    ferry_gpu_ipc_run_t *runs, *runs_tail;
    atomic_uint in_flight;          /* runs queued, for a cheap empty test */
    int stopping;                   /* runs_lock */
    int thread_sleeping;            /* runs_lock: the thread waits for a run to come */
    unsigned completing;            /* runs_lock: callers finishing runs they took */
    atomic_int stopped;             /* submit refuses */
    pthread_t thread;
    int thread_started;
} ferry_gpu_ipc_t;

/* Counters of this process (all transport instances of this module), for
 * ferry_info and tests. */
extern atomic_ulong ferry_gpu_ipc_opens;
extern atomic_ulong ferry_gpu_ipc_closes;
/* Opens by the device they were made with ([0]: the vendor chose, [1 + n]:
 * ordinal n): a peer's device is matched by UUID, not by its ordinal. */
extern atomic_ulong ferry_gpu_ipc_opens_on[1 + FERRY_GPU_IPC_MAX_DEVICES];

/* gpu_ipc_plugin.c */
const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void); /* the vendor file's */
uint64_t ferry_gpu_ipc_now_ms(void);
/* The ordinal of the device with that UUID here, -1 if we do not see it. */
int ferry_gpu_ipc_device_by_uuid(const ferry_gpu_ipc_t *gpu, const char *uuid,
                                 size_t uuid_length);

/* gpu_ipc_peer.c */
/* The peer's entry (made on first sight), referenced; NULL when its
 * endpoint does not parse.  Uses and fills peer->cache when given. */
ferry_gpu_ipc_peer_t *ferry_gpu_ipc_peer_get(ferry_gpu_ipc_t *gpu, const ferry_peer_t *peer);
void ferry_gpu_ipc_peer_put(ferry_gpu_ipc_peer_t *p);
/* Whether the peer still runs (looked up at most every LIVENESS_MS unless
 * force); a dead one is marked gone and its unused imports closed. */
int ferry_gpu_ipc_peer_alive(ferry_gpu_ipc_peer_t *p, int force);
void ferry_gpu_ipc_peer_forget(void *ctx, const ferry_peer_t *peer);
void ferry_gpu_ipc_peer_changed(void *ctx, const ferry_peer_t *peer);
void ferry_gpu_ipc_peer_cache_release(void *ctx, void *cached);
void ferry_gpu_ipc_peers_free(ferry_gpu_ipc_t *gpu);

/* gpu_ipc_import.c */
int ferry_gpu_ipc_key_parse(const char *key, ferry_gpu_ipc_key_t *parsed);
/* The key for a buffer inside that allocation (malloc-ed). */
ferry_status_t ferry_gpu_ipc_key_make(const ferry_accel_range_t *range, const char *uuid,
                                      const char *handle, char **key_p);
/* The import of key for that peer, opened on first use, with one user
 * more; FERRY_ERR_STALE when the allocation or its owner is gone. */
ferry_status_t ferry_gpu_ipc_import_get(ferry_gpu_ipc_peer_t *p, const char *key,
                                        ferry_gpu_ipc_import_t **import_p);
/* Drop users (count of them) of each import in the array (NULLs skipped);
 * closes those that became unused and stale. */
void ferry_gpu_ipc_imports_put(ferry_gpu_ipc_peer_t *p, ferry_gpu_ipc_import_t **imports,
                               size_t count);
/* Mark every import of the peer stale and close the unused ones. */
void ferry_gpu_ipc_imports_stale(ferry_gpu_ipc_peer_t *p);
/* Close every import (the peer is being freed: no users). */
void ferry_gpu_ipc_imports_free(ferry_gpu_ipc_peer_t *p);

/* gpu_ipc_xfer.c */
ferry_status_t ferry_gpu_ipc_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);
unsigned ferry_gpu_ipc_progress(void *ctx);
ferry_status_t ferry_gpu_ipc_thread_start(ferry_gpu_ipc_t *gpu);
void ferry_gpu_ipc_stop(void *ctx);
/* Destroy the streams and pooled events (after stop). */
void ferry_gpu_ipc_devices_free(ferry_gpu_ipc_t *gpu);

#endif
