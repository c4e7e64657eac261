/*
 * GPU IPC peers: one entry per peer incarnation (endpoint string,
 * generation), made when the engine first asks whether we reach it.  The
 * entry holds the peer's imports; a restarted peer is another incarnation,
 * so it gets a fresh entry and its allocations are opened anew.
 */
#include "gpu_ipc.h"

#include <stdlib.h>
#include <string.h>

static ferry_gpu_ipc_peer_t *peer_parse(ferry_gpu_ipc_t *gpu, const ferry_peer_t *peer)
{
    size_t prefix = strlen(FERRY_GPU_IPC_PREFIX);
    if (strncmp(peer->endpoint, FERRY_GPU_IPC_PREFIX, prefix) != 0)
        return NULL;
    ferry_gpu_ipc_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    const char *kind = ferry_process_identity_parse(peer->endpoint + prefix, &p->pid,
                                                    &p->start_time);
    if (kind == NULL || strcmp(kind, gpu->vendor->kind) != 0 ||
        (p->endpoint = strdup(peer->endpoint)) == NULL) {
        free(p);
        return NULL;
    }
    /* Our own identity: the same process (another engine of it, or us). */
    size_t identity = (size_t)(kind - 1 - (peer->endpoint + prefix));
    p->self = identity == strlen(gpu->identity) &&
              memcmp(peer->endpoint + prefix, gpu->identity, identity) == 0;
    p->gpu = gpu;
    p->generation = peer->generation;
    pthread_mutex_init(&p->lock, NULL);
    pthread_mutex_init(&p->open_lock, NULL);
    atomic_store(&p->checked_ms, ferry_gpu_ipc_now_ms());
    return p;
}

static void peer_free(ferry_gpu_ipc_peer_t *p)
{
    ferry_gpu_ipc_imports_free(p);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->open_lock);
    free(p->endpoint);
    free(p);
}

void ferry_gpu_ipc_peer_put(ferry_gpu_ipc_peer_t *p)
{
    if (atomic_fetch_sub(&p->refs, 1) == 1)
        peer_free(p);
}

/* Caller holds gpu->peers_lock. */
static ferry_gpu_ipc_peer_t **table_slot(ferry_gpu_ipc_t *gpu, const char *endpoint,
                                         uint64_t generation)
{
    ferry_gpu_ipc_peer_t **pp = &gpu->peers;
    while (*pp != NULL &&
           ((*pp)->generation != generation || strcmp((*pp)->endpoint, endpoint) != 0))
        pp = &(*pp)->next;
    return pp;
}

static ferry_gpu_ipc_peer_t *table_get(ferry_gpu_ipc_t *gpu, const ferry_peer_t *peer)
{
    pthread_mutex_lock(&gpu->peers_lock);
    ferry_gpu_ipc_peer_t *p = *table_slot(gpu, peer->endpoint, peer->generation);
    if (p != NULL)
        atomic_fetch_add(&p->refs, 1);
    pthread_mutex_unlock(&gpu->peers_lock);
    if (p != NULL)
        return p;
    ferry_gpu_ipc_peer_t *fresh = peer_parse(gpu, peer);
    if (fresh == NULL) {
        ferry_error("%s: the endpoint of %s is not \"" FERRY_GPU_IPC_PREFIX
                    "<boot id>:<pid ns>:<pid>:<start>:%s\"", gpu->vendor->kind, peer->name,
                    gpu->vendor->kind);
        return NULL;
    }
    atomic_store(&fresh->refs, 2); /* the table's and ours */
    /* Two threads may have parsed the same peer: keep the first entry. */
    pthread_mutex_lock(&gpu->peers_lock);
    ferry_gpu_ipc_peer_t **slot = table_slot(gpu, fresh->endpoint, fresh->generation);
    if (*slot == NULL) {
        *slot = fresh;
        p = fresh;
        fresh = NULL;
    } else {
        p = *slot;
        atomic_fetch_add(&p->refs, 1);
    }
    pthread_mutex_unlock(&gpu->peers_lock);
    if (fresh != NULL)
        peer_free(fresh);
    return p;
}

ferry_gpu_ipc_peer_t *ferry_gpu_ipc_peer_get(ferry_gpu_ipc_t *gpu, const ferry_peer_t *peer)
{
    if (peer == NULL || peer->endpoint == NULL)
        return NULL;
    /* The batch's slot: the peer it submitted to last, without the table. */
    ferry_gpu_ipc_peer_t *cached = peer->cache ? *peer->cache : NULL;
    if (cached != NULL && !atomic_load(&cached->forgotten) &&
        cached->generation == peer->generation && strcmp(cached->endpoint, peer->endpoint) == 0) {
        atomic_fetch_add(&cached->refs, 1);
        return cached;
    }
    ferry_gpu_ipc_peer_t *p = table_get(gpu, peer);
    if (p != NULL && peer->cache != NULL) {
        atomic_fetch_add(&p->refs, 1);
        *peer->cache = p;
        if (cached != NULL)
            ferry_gpu_ipc_peer_put(cached);
    }
    return p;
}

void ferry_gpu_ipc_peer_cache_release(void *ctx, void *cached)
{
    if (cached != NULL)
        ferry_gpu_ipc_peer_put(cached);
}

int ferry_gpu_ipc_peer_alive(ferry_gpu_ipc_peer_t *p, int force)
{
    if (atomic_load(&p->gone))
        return 0;
    if (p->self)
        return 1;
    uint64_t now = ferry_gpu_ipc_now_ms();
    if (!force && now - atomic_load(&p->checked_ms) < FERRY_GPU_IPC_LIVENESS_MS)
        return 1;
    atomic_store(&p->checked_ms, now);
    if (ferry_process_alive(p->pid, p->start_time))
        return 1;
    if (atomic_exchange(&p->gone, 1) == 0) {
        ferry_warn("%s: peer pid %ld is gone; failing its requests and closing what we opened "
                   "of it", p->gpu->vendor->kind, p->pid);
        ferry_gpu_ipc_imports_stale(p);
    }
    return 0;
}

/* Caller holds gpu->peers_lock; unlinks the entry, whose table reference
 * the caller then drops. */
static ferry_gpu_ipc_peer_t *table_remove(ferry_gpu_ipc_t *gpu, const ferry_peer_t *peer)
{
    ferry_gpu_ipc_peer_t **slot = table_slot(gpu, peer->endpoint, peer->generation), *p = *slot;
    if (p != NULL) {
        *slot = p->next;
        atomic_store(&p->forgotten, 1);
    }
    return p;
}

void ferry_gpu_ipc_peer_forget(void *ctx, const ferry_peer_t *peer)
{
    ferry_gpu_ipc_t *gpu = ctx;
    if (peer == NULL || peer->endpoint == NULL)
        return;
    pthread_mutex_lock(&gpu->peers_lock);
    ferry_gpu_ipc_peer_t *p = table_remove(gpu, peer);
    pthread_mutex_unlock(&gpu->peers_lock);
    if (p == NULL)
        return;
    /* Runs in flight (and cache slots) still hold it: what they use is
     * closed when they finish, the rest now. */
    ferry_gpu_ipc_imports_stale(p);
    ferry_gpu_ipc_peer_put(p);
}

/* The owner unregistered memory; we do not know which, so every import of
 * it closes once unused, and the next slice to one opens it again. */
void ferry_gpu_ipc_peer_changed(void *ctx, const ferry_peer_t *peer)
{
    ferry_gpu_ipc_t *gpu = ctx;
    if (peer == NULL || peer->endpoint == NULL)
        return;
    pthread_mutex_lock(&gpu->peers_lock);
    ferry_gpu_ipc_peer_t *p = *table_slot(gpu, peer->endpoint, peer->generation);
    if (p != NULL)
        atomic_fetch_add(&p->refs, 1);
    pthread_mutex_unlock(&gpu->peers_lock);
    if (p == NULL)
        return;
    ferry_gpu_ipc_imports_stale(p);
    ferry_gpu_ipc_peer_put(p);
}

void ferry_gpu_ipc_peers_free(ferry_gpu_ipc_t *gpu)
{
    pthread_mutex_lock(&gpu->peers_lock);
    ferry_gpu_ipc_peer_t *p = gpu->peers;
    gpu->peers = NULL;
    pthread_mutex_unlock(&gpu->peers_lock);
    for (ferry_gpu_ipc_peer_t *next; p != NULL; p = next) {
        next = p->next;
        atomic_store(&p->forgotten, 1);
        ferry_gpu_ipc_imports_stale(p);
        ferry_gpu_ipc_peer_put(p);
    }
}
