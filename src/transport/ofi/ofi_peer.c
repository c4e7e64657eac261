/*
 * Peers: one entry per peer incarnation (endpoint string + generation),
 * each with an initiator endpoint, CQ and AV of its own (why: ofi.h), the
 * peer's target address inserted into that AV from the endpoint string.
 *
 * Failure: a CQ error entry (a killed peer: the connection resets) or no
 * completion for FERRY_OFI_TIMEOUT while ops are posted (a frozen peer)
 * fails the peer: its endpoint is closed (the provider lets go of the local
 * buffers of what was posted), its ops FAIL with FERRY_ERR_PEER_FAILED,
 * and submit refuses it (FERRY_ERR_PEER_FAILED) until the engine forgets
 * it and refreshes the descriptor (a restarted peer: new endpoint, new
 * entry).  Other peers' endpoints are not touched.
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

/* Whether closing the peer's endpoint now is safe.  libfabric 1.17's
 * tcp;ofi_rxm crashed (1 run in 5) in fi_close of an endpoint with reads
 * posted to a peer that stopped answering without the provider noticing
 * (frozen, or killed before it saw the reset): such an endpoint is parked
 * instead, never progressed again (data progress is manual, so the
 * provider touches our buffers only inside our calls) and never closed
 * (README.md, "Faults"). */
static int must_park(ferry_ofi_peer_t *p, int provider_saw_it)
{
    if (provider_saw_it || !p->ofi->park_on_silence)
        return 0;
    int reads = 0;
    pthread_mutex_lock(&p->lock);
    for (ferry_ofi_op_t *op = p->ops; op != NULL && !reads; op = op->next)
        reads = op->slice->opcode == FERRY_OP_READ;
    pthread_mutex_unlock(&p->lock);
    return reads;
}

static void close_endpoint(ferry_ofi_peer_t *p, int provider_saw_it)
{
    int park = must_park(p, provider_saw_it);
    pthread_rwlock_wrlock(&p->ep_lock);
    if (park && p->ep != NULL) {
        ferry_ofi_parked_t *parked = calloc(1, sizeof(*parked));
        if (parked != NULL) {
            *parked = (ferry_ofi_parked_t){.ep = p->ep, .cq = p->cq, .av = p->av};
            pthread_mutex_lock(&p->ofi->lock);
            parked->next = p->ofi->parked;
            p->ofi->parked = parked;
            pthread_mutex_unlock(&p->ofi->lock);
            ferry_warn("ofi: the endpoint to %.80s is parked, not closed (reads were posted; "
                       "libfabric 1.17's rxm may crash closing it)", p->endpoint);
            p->ep = NULL;
            p->av = NULL;
            p->cq = NULL;
        }
    }
    struct fid *fids[] = {p->ep ? &p->ep->fid : NULL, p->av ? &p->av->fid : NULL,
                          p->cq ? &p->cq->fid : NULL};
    for (size_t i = 0; i < FERRY_OFI_ARRAY_SIZE(fids); i++) {
        int ret = fids[i] ? fi_close(fids[i]) : 0;
        if (ret != 0)
            ferry_warn("ofi: closing the endpoint to %s: %s", p->endpoint, fi_strerror(-ret));
    }
    p->ep = NULL;
    p->av = NULL;
    p->cq = NULL;
    pthread_rwlock_unlock(&p->ep_lock);
}

static ferry_status_t open_endpoint(ferry_ofi_t *ofi, ferry_ofi_peer_t *p, const void *address)
{
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE,
                                 .size = ofi->window * 2};
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = 1};
    const char *step = "fi_cq_open";
    int ret = fi_cq_open(ofi->domain, &cq_attr, &p->cq, NULL);
    if (ret != 0)
        goto err;
    step = "fi_av_open";
    if ((ret = fi_av_open(ofi->domain, &av_attr, &p->av, NULL)) != 0)
        goto err;
    step = "fi_endpoint";
    if ((ret = fi_endpoint(ofi->domain, ofi->info, &p->ep, NULL)) != 0)
        goto err;
    step = "fi_ep_bind";
    if ((ret = fi_ep_bind(p->ep, &p->av->fid, 0)) != 0 ||
        (ret = fi_ep_bind(p->ep, &p->cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
        goto err;
    step = "fi_setname";
    if ((ret = ferry_ofi_name_endpoint(ofi, p->ep)) != 0)
        goto err;
    step = "fi_enable";
    if ((ret = fi_enable(p->ep)) != 0)
        goto err;
    step = "fi_av_insert";
    ret = fi_av_insert(p->av, address, 1, &p->addr, 0, NULL);
    if (ret != 1) {
        ret = ret < 0 ? ret : -FI_EADDRNOTAVAIL;
        goto err;
    }
    return FERRY_OK;
err:
    ferry_error("ofi: %s (endpoint to %s): %s", step, p->endpoint, fi_strerror(-ret));
    close_endpoint(p, 1);
    return FERRY_ERR_CONNECT;
}

static void peer_free(ferry_ofi_peer_t *p)
{
    close_endpoint(p, 1); /* already closed or parked, unless it never had ops */
    if (p->pidfd >= 0)
        close(p->pidfd);
    pthread_rwlock_destroy(&p->ep_lock);
    pthread_mutex_destroy(&p->lock);
    free(p->endpoint);
    free(p);
}

void ferry_ofi_peer_put(ferry_ofi_peer_t *p)
{
    if (p != NULL && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1) {
        /* nobody can post any more: what is still posted fails with the close */
        ferry_ofi_peer_fail(p, FERRY_ERR_CANCELED, "closed", 0);
        peer_free(p);
    }
}

static ferry_ofi_peer_t *table_find(ferry_ofi_t *ofi, const char *endpoint)
{
    for (ferry_ofi_peer_t *p = ofi->peers; p != NULL; p = p->next)
        if (strcmp(p->endpoint, endpoint) == 0)
            return p;
    return NULL;
}

/* Whether a same-host peer's process is gone.  Through its pidfd (one
 * poll, cheap enough before every post: see ferry_ofi_peer_dead's use in
 * ofi_xfer.c), else a look in /proc at most every FERRY_OFI_LIVENESS_MS. */
int ferry_ofi_peer_dead(ferry_ofi_peer_t *p)
{
    if (p->pid == 0)
        return 0;
    if (p->pidfd >= 0) {
        struct pollfd fd = {.fd = p->pidfd, .events = POLLIN};
        return poll(&fd, 1, 0) > 0;
    }
    uint64_t now = ferry_ofi_time_ms();
    uint64_t checked = atomic_load_explicit(&p->checked_ms, memory_order_relaxed);
    if (now - checked < FERRY_OFI_LIVENESS_MS)
        return 0;
    atomic_store_explicit(&p->checked_ms, now, memory_order_relaxed);
    return !ferry_process_alive(p->pid, p->start_time);
}

static ferry_status_t peer_state(ferry_ofi_peer_t *p)
{
    pthread_mutex_lock(&p->lock);
    ferry_status_t status = p->state == FERRY_OFI_PEER_OK ? FERRY_OK : FERRY_ERR_PEER_FAILED;
    pthread_mutex_unlock(&p->lock);
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
    if (p != NULL)
        atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
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
    pthread_rwlock_init(&fresh->ep_lock, NULL);
    pthread_mutex_init(&fresh->lock, NULL);
    /* The pidfd names the process itself: opened, then the start time
     * checked, it cannot name a stranger that reused the pid. */
    fresh->pidfd = fresh->pid != 0 ? (int)syscall(SYS_pidfd_open, (pid_t)fresh->pid, 0) : -1;
    if (fresh->pid != 0 && !ferry_process_alive(fresh->pid, fresh->start_time)) {
        free(address);
        peer_free(fresh);
        return FERRY_ERR_PEER_FAILED; /* never connect to a dead incarnation */
    }
    atomic_init(&fresh->checked_ms, ferry_ofi_time_ms());
    ferry_status_t status = open_endpoint(ofi, fresh, address);
    free(address);
    if (status != FERRY_OK) {
        peer_free(fresh);
        return status;
    }
    pthread_mutex_lock(&ofi->lock);
    p = table_find(ofi, peer->endpoint);
    if (p == NULL) {
        fresh->next = ofi->peers;
        ofi->peers = fresh;
    } else {
        atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
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

void ferry_ofi_peer_fail(ferry_ofi_peer_t *p, ferry_status_t why, const char *what,
                         int provider_saw_it)
{
    pthread_mutex_lock(&p->lock);
    int first = p->state == FERRY_OFI_PEER_OK;
    if (first) {
        p->state = FERRY_OFI_PEER_FAILED;
        p->why = why;
    }
    unsigned posted = p->posted;
    pthread_mutex_unlock(&p->lock);
    if (first && why != FERRY_ERR_CANCELED)
        ferry_warn("ofi: peer %.80s failed (%s); %u operations posted fail", p->endpoint, what,
                   posted);
    /* Closing (or parking) is what stops the provider from touching our
     * buffers; then nothing can complete the ops it caught: they fail here. */
    close_endpoint(p, provider_saw_it);
    ferry_ofi_op_t *op;
    while ((op = ferry_ofi_op_pop(p)) != NULL)
        ferry_ofi_op_complete(op, p->why);
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
    ferry_ofi_peer_t **link = &ofi->peers, *p = NULL;
    for (; *link != NULL; link = &(*link)->next) {
        if (strcmp((*link)->endpoint, peer->endpoint) == 0 &&
            (*link)->generation == peer->generation) {
            p = *link;
            *link = p->next;
            p->next = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&ofi->lock);
    if (p != NULL)
        ferry_ofi_peer_put(p); /* the table's; the last user closes it */
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
        if (atomic_load_explicit(&p->busy, memory_order_relaxed) != 0) {
            atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
            busy[i++] = p;
        }
    }
    pthread_mutex_unlock(&ofi->lock);
    *count_p = i;
    return busy;
}

void ferry_ofi_peers_sweep(ferry_ofi_t *ofi)
{
    if (ofi->settings.timeout_ms == 0 ||
        atomic_load_explicit(&ofi->busy_peers, memory_order_acquire) == 0)
        return;
    size_t count = 0;
    ferry_ofi_peer_t **busy = ferry_ofi_peers_busy(ofi, &count);
    uint64_t now = ferry_ofi_time_ms();
    for (size_t i = 0; i < count; i++) {
        ferry_ofi_peer_t *p = busy[i];
        pthread_mutex_lock(&p->lock);
        int late = p->state == FERRY_OFI_PEER_OK && p->posted != 0 &&
                   now > p->last_activity_ms + ofi->settings.timeout_ms;
        pthread_mutex_unlock(&p->lock);
        if (!late && ofi->silent_deaths && ferry_ofi_peer_dead(p)) {
            /* shm: a killed peer leaves no error entry, only silence.
             * Not on tcp;ofi_rxm, whose reset reports it: closing an rxm
             * endpoint while rxm has not yet seen its connection reset
             * crashed libfabric 1.17 (1 run in 5, README.md, "Faults"). */
            ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, "its process is gone", 0);
        } else if (late) {
            char what[96];
            snprintf(what, sizeof(what), "no completion for %u ms", ofi->settings.timeout_ms);
            ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, what, 0);
        }
        ferry_ofi_peer_put(p);
    }
    free(busy);
}

void ferry_ofi_peers_close_all(ferry_ofi_t *ofi)
{
    pthread_mutex_lock(&ofi->lock);
    ferry_ofi_peer_t *list = ofi->peers;
    ofi->peers = NULL;
    pthread_mutex_unlock(&ofi->lock);
    while (list != NULL) {
        ferry_ofi_peer_t *p = list;
        list = p->next;
        p->next = NULL;
        ferry_ofi_peer_fail(p, FERRY_ERR_CANCELED, "engine stops", 0);
        ferry_ofi_peer_put(p);
    }
}
