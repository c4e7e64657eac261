/*
 * shm peers: one entry per peer incarnation (endpoint string, generation),
 * made when the engine first asks whether we reach it.  Making it probes
 * the kernel once: is the pid still the process the endpoint names, and
 * can we attach to it at all?
 */
#include "shm.h"
#include "../../util/util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

static ferry_shm_peer_t *peer_parse(const ferry_peer_t *peer)
{
    size_t prefix = strlen(FERRY_SHM_ENDPOINT_PREFIX);
    if (strncmp(peer->endpoint, FERRY_SHM_ENDPOINT_PREFIX, prefix) != 0)
        return NULL;
    ferry_shm_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    const char *probe = ferry_process_identity_parse(peer->endpoint + prefix, &p->pid,
                                                     &p->start_time);
    char *end = NULL;
    p->probe = probe ? (uintptr_t)strtoull(probe, &end, 16) : 0;
    if (probe == NULL || end == probe || *end != '\0' ||
        (p->endpoint = strdup(peer->endpoint)) == NULL) {
        free(p);
        return NULL;
    }
    p->generation = peer->generation;
    return p;
}

/* Is the pid that process (its start time too, a start time of 0 matching
 * nothing), and does the kernel let us attach (read one byte of it)?  The
 * pid alone could name a stranger: a recycled pid, or a stale or forged
 * descriptor. */
static void peer_probe(ferry_shm_t *shm, ferry_shm_peer_t *p, const char *name)
{
    if (p->pid == 0) {
        ferry_debug("shm: peer %s runs in another pid namespace or kernel", name);
        return;
    }
    if (p->start_time == 0 || ferry_process_start_time(p->pid) != p->start_time) {
        ferry_info("shm: peer %s (pid %ld, started at %llu) is gone", name, p->pid, p->start_time);
        p->gone = 1;
        return;
    }
    char byte;
    struct iovec local = {&byte, 1}, remote = {(void *)p->probe, 1};
    if (process_vm_readv((pid_t)p->pid, &local, 1, &remote, 1, 0) == 1) {
        p->usable = 1;
        return;
    }
    int err = errno;
    p->gone = err == ESRCH;
    if (err != ESRCH && atomic_exchange(&shm->refused_logged, 1) == 0)
        ferry_warn("shm: the kernel refuses cross-memory attach to peer %s (pid %ld): %s "
                   "(ptrace policy or another user); the next transport serves it", name,
                   p->pid, strerror(err));
}

static void peer_free(ferry_shm_peer_t *p)
{
    free(p->endpoint);
    free(p);
}

void ferry_shm_peer_put(ferry_shm_peer_t *p)
{
    if (atomic_fetch_sub(&p->refs, 1) == 1)
        peer_free(p);
}

/* Caller holds shm->lock. */
static ferry_shm_peer_t **table_slot(ferry_shm_t *shm, const char *endpoint, uint64_t generation)
{
    ferry_shm_peer_t **pp = &shm->peers;
    while (*pp != NULL &&
           ((*pp)->generation != generation || strcmp((*pp)->endpoint, endpoint) != 0))
        pp = &(*pp)->next;
    return pp;
}

ferry_shm_peer_t *ferry_shm_peer_get(ferry_shm_t *shm, const ferry_peer_t *peer)
{
    if (peer == NULL || peer->endpoint == NULL)
        return NULL;
    pthread_mutex_lock(&shm->lock);
    ferry_shm_peer_t *p = *table_slot(shm, peer->endpoint, peer->generation);
    if (p != NULL)
        atomic_fetch_add(&p->refs, 1);
    pthread_mutex_unlock(&shm->lock);
    if (p != NULL)
        return p;
    ferry_shm_peer_t *fresh = peer_parse(peer);
    if (fresh == NULL) {
        ferry_error("shm: the endpoint of %s is not \"" FERRY_SHM_ENDPOINT_PREFIX
                    "<boot id>:<pid ns>:<pid>:<start>:<probe>\"", peer->name);
        return NULL;
    }
    peer_probe(shm, fresh, peer->name);
    atomic_store(&fresh->checked_ms, ferry_time_ms());
    atomic_store(&fresh->refs, 2); /* the table's and ours */
    /* Two threads may have probed the same peer: keep the first entry. */
    pthread_mutex_lock(&shm->lock);
    ferry_shm_peer_t **slot = table_slot(shm, fresh->endpoint, fresh->generation);
    if (*slot == NULL) {
        *slot = fresh;
        p = fresh;
        fresh = NULL;
    } else {
        p = *slot;
        atomic_fetch_add(&p->refs, 1);
    }
    pthread_mutex_unlock(&shm->lock);
    if (fresh != NULL)
        peer_free(fresh);
    return p;
}

/* Nothing is cached per connection: forgetting drops the entry, and the
 * next request to that incarnation probes again. */
void ferry_shm_peer_forget(void *ctx, const ferry_peer_t *peer)
{
    ferry_shm_t *shm = ctx;
    if (peer == NULL || peer->endpoint == NULL)
        return;
    pthread_mutex_lock(&shm->lock);
    ferry_shm_peer_t **slot = table_slot(shm, peer->endpoint, peer->generation), *p = *slot;
    if (p != NULL)
        *slot = p->next;
    pthread_mutex_unlock(&shm->lock);
    if (p != NULL)
        ferry_shm_peer_put(p);
}

void ferry_shm_peers_free(ferry_shm_t *shm)
{
    for (ferry_shm_peer_t *p = shm->peers, *next; p != NULL; p = next) {
        next = p->next;
        ferry_shm_peer_put(p);
    }
    shm->peers = NULL;
}
