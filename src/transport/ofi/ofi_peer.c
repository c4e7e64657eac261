/*
 * Peers: one entry per peer incarnation (endpoint string + generation):
 * its address (inserted into each lane on first use there), its ops, its
 * state.  Every peer shares the lane (ofi_lane.c).
 *
 * Failure:
 *   a CQ error entry for one of its ops that is about the link (tcp;ofi_rxm:
 *   a killed peer's connection resets, every op of it comes back
 *   FI_ECANCELED / ENOTCONN within tens of ms): the peer fails, its pending
 *   ops fail here, its posted ones as their entries arrive; the lane goes on.
 *   a same-host peer found gone (pidfd; shm reports nothing) or ops that see
 *   nothing for FERRY_OFI_TIMEOUT (a frozen peer, any provider): the peer
 *   fails and, when ops of it are posted, the lane is fenced (closed and
 *   replaced, the other peers' ops posted again).
 *   ops never accepted (posts answering -FI_EAGAIN for the timeout: a dead
 *   or frozen peer rxm never connected to, shm's full command queue): they
 *   are in no provider queue, so they fail here, without a fence.
 * Submit then refuses the peer (FERRY_ERR_PEER_FAILED) until the engine
 * forgets it and refreshes the descriptor (a restarted peer: new endpoint,
 * new entry).
 */
#include "ofi.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Parse "ofi1:<provider>:<identity>:<address hex>"; the provider must be
 * ours.  Returns the address bytes (malloc-ed), or NULL. */
static void *parse_endpoint(const ferry_ofi_t *ofi, const char *endpoint, long *pid_p,
                            unsigned long long *start_p, size_t *length_p)
{
    size_t prefix = strlen(FERRY_OFI_ENDPOINT_PREFIX);
    if (endpoint == NULL || strncmp(endpoint, FERRY_OFI_ENDPOINT_PREFIX, prefix) != 0)
        return NULL;
    const char *prov = endpoint + prefix;
    const char *ours = ofi->info->fabric_attr->prov_name;
    size_t prov_length = strlen(ours);
    if (strncmp(prov, ours, prov_length) != 0 || prov[prov_length] != ':')
        return NULL;
    const char *hex = ferry_process_identity_parse(prov + prov_length + 1, pid_p, start_p);
    if (hex == NULL)
        return NULL;
    return ferry_ofi_hex_decode(hex, strlen(hex), length_p);
}

static void peer_free(ferry_ofi_peer_t *p)
{
    if (p->pidfd >= 0)
        close(p->pidfd);
    pthread_mutex_destroy(&p->lock);
    free(p->address);
    free(p->endpoint);
    free(p);
}

/* The last reference: nothing of the peer is posted or pending. */
static void peer_release(ferry_ofi_peer_t *p)
{
    ferry_ofi_t *ofi = p->ofi;
    pthread_mutex_lock(&ofi->lock);
    for (ferry_ofi_peer_t **link = &ofi->peers; *link != NULL; link = &(*link)->next) {
        if (*link == p) {
            *link = p->next;
            break;
        }
    }
    pthread_mutex_unlock(&ofi->lock);
    /* Its address stays in the lane's AV (one entry per peer incarnation,
     * for the lane's life): with libfabric 1.17, fi_av_remove on shm of a
     * peer with nothing posted still broke the next transfers to other
     * peers of the endpoint (6 runs of 6 in test_ofi: the bystander
     * crashed serving them), and rxm keeps the connection anyway. */
    peer_free(p);
}

void ferry_ofi_peer_ref(ferry_ofi_peer_t *p, unsigned count)
{
    atomic_fetch_add_explicit(&p->refs, count, memory_order_relaxed);
}

void ferry_ofi_peer_put(ferry_ofi_peer_t *p)
{
    if (p != NULL && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
        peer_release(p);
}

/* A reference taken under ofi->lock, unless the peer is already on its way
 * out (refs 0: its last put waits for ofi->lock to unlink it). */
static int ref_unless_going(ferry_ofi_peer_t *p)
{
    unsigned refs = atomic_load_explicit(&p->refs, memory_order_relaxed);
    while (refs != 0)
        if (atomic_compare_exchange_weak_explicit(&p->refs, &refs, refs + 1,
                                                  memory_order_acq_rel, memory_order_relaxed))
            return 1;
    return 0;
}

static ferry_ofi_peer_t *table_find(ferry_ofi_t *ofi, const char *endpoint)
{
    for (ferry_ofi_peer_t *p = ofi->peers; p != NULL; p = p->next)
        if (p->in_table && strcmp(p->endpoint, endpoint) == 0)
            return p;
    return NULL;
}

/* Whether a same-host peer's process is gone: a poll of its pidfd at most
 * every FERRY_OFI_PIDFD_MS (a coarse clock read otherwise: the look sat on every
 * submit and post round of a latency loop), else a look in /proc at most
 * every FERRY_OFI_LIVENESS_MS.  Once seen gone, always gone. */
int ferry_ofi_peer_dead(ferry_ofi_peer_t *p)
{
    if (p->pid == 0)
        return 0;
    if (atomic_load_explicit(&p->dead, memory_order_relaxed))
        return 1;
    uint64_t now = ferry_ofi_time_ms();
    uint64_t every = p->pidfd >= 0 ? FERRY_OFI_PIDFD_MS : FERRY_OFI_LIVENESS_MS;
    uint64_t checked = atomic_load_explicit(&p->checked_ms, memory_order_relaxed);
    if (now - checked < every)
        return 0;
    atomic_store_explicit(&p->checked_ms, now, memory_order_relaxed);
    int dead;
    if (p->pidfd >= 0) {
        struct pollfd fd = {.fd = p->pidfd, .events = POLLIN};
        dead = poll(&fd, 1, 0) > 0;
    } else {
        dead = !ferry_process_alive(p->pid, p->start_time);
    }
    if (dead)
        atomic_store_explicit(&p->dead, 1, memory_order_relaxed);
    return dead;
}

static ferry_status_t peer_state(ferry_ofi_peer_t *p)
{
    ferry_status_t status = atomic_load_explicit(&p->state, memory_order_acquire) ==
                                    FERRY_OFI_PEER_OK
                                ? FERRY_OK
                                : FERRY_ERR_PEER_FAILED;
    if (status == FERRY_OK && ferry_ofi_peer_dead(p)) {
        ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, "its process is gone", 0);
        status = FERRY_ERR_PEER_FAILED;
    }
    return status;
}

ferry_status_t ferry_ofi_peer_get(ferry_ofi_t *ofi, const ferry_peer_t *peer,
                                  ferry_ofi_peer_t **p_p)
{
    pthread_mutex_lock(&ofi->lock);
    ferry_ofi_peer_t *p = table_find(ofi, peer->endpoint);
    if (p != NULL && p->generation != peer->generation) {
        pthread_mutex_unlock(&ofi->lock);
        return FERRY_ERR_STALE;
    }
    if (p != NULL && !ref_unless_going(p))
        p = NULL; /* cannot be: the table holds a reference while in_table */
    pthread_mutex_unlock(&ofi->lock);
    if (p != NULL) {
        ferry_status_t status = peer_state(p);
        if (status != FERRY_OK) {
            ferry_ofi_peer_put(p);
            return status;
        }
        *p_p = p;
        return FERRY_OK;
    }

    /* New: connect outside the table's lock; the first insert wins a race. */
    ferry_ofi_peer_t *fresh = calloc(1, sizeof(*fresh));
    if (fresh == NULL)
        return FERRY_ERR_NO_MEMORY;
    size_t address_length = 0;
    void *address = parse_endpoint(ofi, peer->endpoint, &fresh->pid, &fresh->start_time,
                                   &address_length);
    fresh->endpoint = strdup(peer->endpoint);
    fresh->address = address;
    fresh->address_length = address_length;
    if (address == NULL || fresh->endpoint == NULL) {
        if (address == NULL)
            ferry_error("ofi: segment \"%s\": endpoint \"%.80s\" is not one of provider %s",
                        peer->name, peer->endpoint, ofi->info->fabric_attr->prov_name);
        free(address);
        free(fresh->endpoint);
        free(fresh);
        return address == NULL ? FERRY_ERR_CONNECT : FERRY_ERR_NO_MEMORY;
    }
    fresh->ofi = ofi;
    fresh->generation = peer->generation;
    atomic_init(&fresh->refs, 2); /* the table's and the caller's */
    pthread_mutex_init(&fresh->lock, NULL);
    /* The pidfd names the process itself: opened, then the start time
     * checked, it cannot name a stranger that reused the pid. */
    fresh->pidfd = fresh->pid != 0 ? (int)syscall(SYS_pidfd_open, (pid_t)fresh->pid, 0) : -1;
    if (fresh->pid != 0 && !ferry_process_alive(fresh->pid, fresh->start_time)) {
        peer_free(fresh);
        return FERRY_ERR_PEER_FAILED; /* never post to a dead incarnation */
    }
    atomic_init(&fresh->checked_ms, ferry_ofi_time_ms());
    pthread_mutex_lock(&ofi->lock);
    p = table_find(ofi, peer->endpoint);
    if (p == NULL) {
        fresh->in_table = 1;
        fresh->next = ofi->peers;
        ofi->peers = fresh;
    } else if (!ref_unless_going(p)) {
        p = NULL;
    }
    pthread_mutex_unlock(&ofi->lock);
    if (p != NULL) {
        peer_free(fresh);
        if (p->generation != peer->generation) {
            ferry_ofi_peer_put(p);
            return FERRY_ERR_STALE;
        }
        fresh = p;
    }
    *p_p = fresh;
    return FERRY_OK;
}

ferry_status_t ferry_ofi_peer_get_cached(ferry_ofi_t *ofi, const ferry_peer_t *peer,
                                         ferry_ofi_peer_t **p_p)
{
    ferry_ofi_batch_cache_t *cache = peer->cache != NULL ? *peer->cache : NULL;
    ferry_ofi_peer_t *p = cache != NULL ? cache->peer : NULL;
    /* The same descriptor's string at the same address is the same string;
     * another descriptor's is compared (a refreshed one of the same peer). */
    if (p != NULL && !atomic_load_explicit(&p->forgotten, memory_order_acquire) &&
        p->generation == peer->generation &&
        ((cache->descriptor_serial == peer->descriptor_serial &&
          cache->endpoint == peer->endpoint) ||
         strcmp(p->endpoint, peer->endpoint) == 0)) {
        ferry_ofi_peer_ref(p, 1);
        ferry_status_t status = peer_state(p);
        if (status != FERRY_OK) {
            ferry_ofi_peer_put(p);
            return status;
        }
        if (cache->descriptor_serial != peer->descriptor_serial) {
            cache->key_text = NULL; /* the old descriptor's, maybe gone */
            cache->descriptor_serial = peer->descriptor_serial;
            cache->endpoint = peer->endpoint;
        }
        *p_p = p;
        return FERRY_OK;
    }
    ferry_status_t status = ferry_ofi_peer_get(ofi, peer, p_p);
    if (status != FERRY_OK || peer->cache == NULL)
        return status;
    if (cache == NULL && (cache = calloc(1, sizeof(*cache))) == NULL)
        return FERRY_OK; /* nothing kept: the next submit looks it up again */
    ferry_ofi_peer_put(cache->peer);
    ferry_ofi_peer_ref(*p_p, 1);
    cache->peer = *p_p;
    cache->descriptor_serial = peer->descriptor_serial;
    cache->endpoint = peer->endpoint;
    cache->key_text = NULL; /* another peer's descriptor */
    *peer->cache = cache;
    return FERRY_OK;
}

void ferry_ofi_peer_fail(ferry_ofi_peer_t *p, ferry_status_t why, const char *what,
                         int provider_saw_it)
{
    ferry_ofi_op_t *pending = NULL, *op;
    pthread_mutex_lock(&p->lock);
    int first = p->state == FERRY_OFI_PEER_OK;
    if (first) {
        p->why = why;
        atomic_store_explicit(&p->state, FERRY_OFI_PEER_FAILED, memory_order_release);
    }
    while ((op = ferry_ofi_pending_pop(p)) != NULL) {
        op->next = pending;
        pending = op;
    }
    unsigned posted = p->posted;
    uint64_t lane_id = p->lane_id;
    /* rxm was still connecting to it (posts refused, none accepted) */
    int never_connected = p->attempted && !p->connected;
    why = p->why;
    pthread_mutex_unlock(&p->lock);
    if (first && why != FERRY_ERR_CANCELED)
        ferry_warn("ofi: peer %.80s failed (%s); %u operations posted fail", p->endpoint, what,
                   posted);
    if (never_connected && (p->pid == 0 || ferry_ofi_peer_dead(p)))
        ferry_ofi_lane_suspect(p->ofi, lane_id);
    /* Never accepted by the provider: nothing to fence, ours alone. */
    ferry_ofi_ops_finish(p->ofi, pending, why);
    /* Posted ones: only closing the lane stops the provider from touching
     * their buffers, unless the provider reports them itself. */
    if (posted != 0 && !provider_saw_it)
        ferry_ofi_lane_fence(p->ofi, lane_id, what);
}

int ferry_ofi_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key)
{
    ferry_ofi_t *ofi = ctx;
    ferry_ofi_key_t key;
    if (peer == NULL || peer->endpoint == NULL || remote_key == NULL ||
        ferry_ofi_key_parse(remote_key, &key) != FERRY_OK)
        return FERRY_REACH_NO;
    free(key.raw);
    long pid;
    unsigned long long start;
    size_t length;
    void *address = parse_endpoint(ofi, peer->endpoint, &pid, &start, &length);
    if (address == NULL)
        return FERRY_REACH_NO; /* another provider, or not ours at all */
    free(address);
    /* shm only reaches processes on this kernel */
    if (strcmp(ofi->info->fabric_attr->prov_name, "shm") == 0 && !peer->same_host)
        return FERRY_REACH_NO;
    return ofi->software ? FERRY_REACH_FALLBACK : FERRY_REACH_YES;
}

void ferry_ofi_peer_forget(void *ctx, const ferry_peer_t *peer)
{
    ferry_ofi_t *ofi = ctx;
    if (peer == NULL || peer->endpoint == NULL)
        return;
    pthread_mutex_lock(&ofi->lock);
    ferry_ofi_peer_t *p = table_find(ofi, peer->endpoint);
    if (p != NULL && p->generation != peer->generation)
        p = NULL;
    if (p != NULL) {
        p->in_table = 0;
        atomic_store_explicit(&p->forgotten, 1, memory_order_release);
    }
    pthread_mutex_unlock(&ofi->lock);
    /* the table's; its ops keep it until they are finished */
    if (p != NULL)
        ferry_ofi_peer_put(p);
}

ferry_ofi_peer_t **ferry_ofi_peers_busy(ferry_ofi_t *ofi, size_t *count_p)
{
    *count_p = 0;
    pthread_mutex_lock(&ofi->lock);
    size_t n = 0;
    for (ferry_ofi_peer_t *p = ofi->peers; p != NULL; p = p->next)
        n += atomic_load_explicit(&p->busy, memory_order_relaxed) != 0;
    ferry_ofi_peer_t **busy = n ? malloc(n * sizeof(*busy)) : NULL;
    size_t i = 0;
    for (ferry_ofi_peer_t *p = ofi->peers; busy != NULL && p != NULL && i < n; p = p->next) {
        if (atomic_load_explicit(&p->busy, memory_order_relaxed) != 0 && ref_unless_going(p))
            busy[i++] = p;
    }
    pthread_mutex_unlock(&ofi->lock);
    *count_p = i;
    return busy;
}

/* A same-host peer of busy[] whose process is stopped while ops are posted
 * to it, or NULL.  It reads /proc for each such peer: called only when one
 * is late. */
static ferry_ofi_peer_t *stopped_with_ops_posted(ferry_ofi_peer_t **busy, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        ferry_ofi_peer_t *p = busy[i];
        pthread_mutex_lock(&p->lock);
        int accepted = p->posted != 0;
        pthread_mutex_unlock(&p->lock);
        if (accepted && p->pid != 0 && ferry_process_stopped(p->pid))
            return p;
    }
    return NULL;
}

/* The sweep fails the peers found gone and those whose ops were never
 * accepted.  Once a peer with ops posted is silent past the timeout it
 * fences for one peer only: a same-host one whose process is stopped with
 * ops posted if there is one, late or not, else the one silent longest.
 * On shm one stuck peer holds back the write completions of every peer of
 * the lane (one in-order response queue), so the others look silent too,
 * and a bystander can look silent sooner than the stuck one (its ops came
 * later).  Blaming a bystander posted the stopped peer's ops again, and
 * shm posts under a spin lock in the peer's region that a peer stopped at
 * the wrong moment holds: the progress thread spun there until the peer
 * resumed (test_ofi_mr's lane_closed_while_readers_wait_in_its_cq_over_shm
 * with a stopped victim, 1 run in 10 under ASan, when only the late peers
 * were looked at).  A second silent peer is caught a timeout later. */
void ferry_ofi_peers_sweep(ferry_ofi_t *ofi)
{
    if (atomic_load_explicit(&ofi->busy_peers, memory_order_acquire) == 0)
        return;
    pthread_rwlock_rdlock(&ofi->lane_lock);
    int opening = ofi->lane == NULL; /* a fence opens a fresh one: nothing can be posted */
    pthread_rwlock_unlock(&ofi->lane_lock);
    if (opening)
        return;
    size_t count = 0;
    ferry_ofi_peer_t **busy = ferry_ofi_peers_busy(ofi, &count);
    uint64_t now = ferry_ofi_time_ms();
    unsigned timeout = ofi->settings.timeout_ms;
    ferry_ofi_peer_t *silent = NULL;
    uint64_t silent_since = UINT64_MAX;
    char what[96];
    for (size_t i = 0; i < count; i++) {
        ferry_ofi_peer_t *p = busy[i];
        pthread_mutex_lock(&p->lock);
        int ok = p->state == FERRY_OFI_PEER_OK;
        int late = timeout != 0 && p->posted + p->pending != 0 &&
                   now > p->last_activity_ms + timeout;
        int accepted = p->posted != 0;
        uint64_t since = p->last_activity_ms;
        pthread_mutex_unlock(&p->lock);
        if (ok && ofi->silent_deaths && ferry_ofi_peer_dead(p)) {
            /* shm: a killed peer leaves no error entry, only silence.
             * Not looked up on tcp;ofi_rxm, whose reset reports it. */
            ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, "its process is gone", 0);
        } else if (late && !accepted && ok) {
            snprintf(what, sizeof(what), "posts refused for %u ms", timeout);
            ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, what, 0);
        } else if (late && accepted && since < silent_since) {
            /* ok: silent; failed by a CQ error entry: some of its posted
             * ops never came back.  Either way only a fence ends them. */
            silent = p;
            silent_since = since;
        }
    }
    if (silent != NULL) {
        ferry_ofi_peer_t *stopped = stopped_with_ops_posted(busy, count);
        if (stopped != NULL)
            silent = stopped;
        pthread_mutex_lock(&silent->lock);
        int ok = silent->state == FERRY_OFI_PEER_OK;
        uint64_t lane_id = silent->lane_id;
        pthread_mutex_unlock(&silent->lock);
        if (ok) {
            snprintf(what, sizeof(what), "no completion for %u ms", timeout);
            ferry_ofi_peer_fail(silent, FERRY_ERR_PEER_FAILED, what, 0);
        } else {
            snprintf(what, sizeof(what), "a failed peer's operations unanswered for %u ms",
                     timeout);
            ferry_ofi_lane_fence(ofi, lane_id, what);
        }
    }
    for (size_t i = 0; i < count; i++)
        ferry_ofi_peer_put(busy[i]);
    free(busy);
}

void ferry_ofi_peers_close_all(ferry_ofi_t *ofi)
{
    /* The lane is closed: nothing is posted or pending any more. */
    for (;;) {
        pthread_mutex_lock(&ofi->lock);
        ferry_ofi_peer_t *p = ofi->peers;
        while (p != NULL && !p->in_table)
            p = p->next;
        if (p != NULL)
            p->in_table = 0;
        pthread_mutex_unlock(&ofi->lock);
        if (p == NULL)
            break;
        pthread_mutex_lock(&p->lock);
        if (p->state == FERRY_OFI_PEER_OK) {
            p->why = FERRY_ERR_CANCELED;
            atomic_store_explicit(&p->state, FERRY_OFI_PEER_FAILED, memory_order_release);
        }
        pthread_mutex_unlock(&p->lock);
        ferry_ofi_peer_put(p);
    }
}
