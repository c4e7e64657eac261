/*
 * The shm transport: same-host transfers by cross-memory attach
 * (process_vm_writev / process_vm_readv), the kernel copying between our
 * buffer and the peer's, with no shared segment and no helper thread.
 *
 * Endpoint string (the descriptor's "transports":{"shm":...}):
 *   shm1:<boot id>:<pid namespace>:<pid>:<start time>:<probe address>
 * The identity says which process to copy to, and lets us see at once that
 * it is gone or that its pid names another process now; the probe address
 * is a byte of the peer that we read once to learn whether the kernel lets
 * us attach at all (ptrace policy, another user).  Buffer keys are empty:
 * CMA needs no registration.
 *
 * Bounds: CMA is one-sided, the peer's CPU never sees a request.  The
 * engine refuses any request outside the peer's published buffers before
 * it gets here; the kernel refuses addresses the peer has not mapped.
 *
 * Locks: ferry_shm_t.lock guards the peer table; a peer is immutable once
 * in it except for `checked_ms` and `refs` (atomics).  refs: the table's,
 * plus one per caller between ferry_shm_peer_get and ferry_shm_peer_put.
 */
#ifndef FERRY_SHM_H
#define FERRY_SHM_H

#include <ferry/plugin.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define FERRY_SHM_ENDPOINT_PREFIX "shm1:"
/* A peer is looked up in /proc before a request when the last look is
 * this old: a copy into a recycled pid would reach a stranger. */
#define FERRY_SHM_LIVENESS_MS 20

typedef struct ferry_shm_peer {
    char *endpoint;
    uint64_t generation;
    long pid;                  /* 0: not on our kernel and pid namespace */
    unsigned long long start_time;
    uintptr_t probe;
    int usable;                /* the kernel lets us attach */
    int gone;                  /* the probe found no such process */
    atomic_uint_fast64_t checked_ms;
    atomic_uint refs;
    struct ferry_shm_peer *next;
} ferry_shm_peer_t;

typedef struct ferry_shm {
    ferry_transport_services_t svc;
    char *address;
    pthread_mutex_t lock;
    ferry_shm_peer_t *peers;
    atomic_int refused_logged; /* the kernel's refusal is logged once */
} ferry_shm_t;

/* shm_peer.c */
/* The peer's entry (created on first sight), referenced; NULL when its
 * endpoint cannot be parsed. */
ferry_shm_peer_t *ferry_shm_peer_get(ferry_shm_t *shm, const ferry_peer_t *peer);
void ferry_shm_peer_put(ferry_shm_peer_t *p);
void ferry_shm_peer_forget(void *ctx, const ferry_peer_t *peer);
void ferry_shm_peers_free(ferry_shm_t *shm);
/* shm_xfer.c */
ferry_status_t ferry_shm_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices);

const ferry_plugin_t *ferry_shm_plugin(void);

#endif
