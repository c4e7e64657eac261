/*
 * ucx transfers: submit posts one ucp_put_nbx/ucp_get_nbx per slice and an
 * endpoint flush behind them, all in the caller's thread.  The slices of
 * one submit form a group, finished together (slice_done) once UCX
 * completed every operation and the flush: a WRITE is then in the target's
 * memory, a READ in ours.  What UCX completes inline (CMA, shared memory)
 * finishes before submit returns; the rest in the worker's progress thread.
 */
#include "ucx.h"

#include <stdlib.h>
#include <string.h>

ferry_ucx_group_t *ferry_ucx_group_new(ferry_ucx_ep_t *ep)
{
    ferry_ucx_group_t *group = calloc(1, sizeof(*group));
    if (group == NULL)
        return NULL;
    group->ep = ep;
    atomic_fetch_add(&ep->refs, 1);
    atomic_init(&group->pending, 1); /* the poster's */
    atomic_init(&group->status, UCS_OK);
    /* The deadline counts from the first request after an idle spell, not
     * from whenever the endpoint last completed something. */
    if (atomic_fetch_add(&ep->outstanding, 1) == 0)
        atomic_store(&ep->last_activity_ms, ferry_ucx_time_ms());
    atomic_fetch_add(&ep->worker->busy, 1);
    return group;
}

static void waiter_unref(ferry_ucx_waiter_t *waiter)
{
    if (atomic_fetch_sub(&waiter->refs, 1) != 1)
        return;
    pthread_cond_destroy(&waiter->cond);
    pthread_mutex_destroy(&waiter->lock);
    free(waiter);
}

/* What a slice reports: a failed endpoint's reason first, so a cancelled
 * request of a dead peer reads FERRY_ERR_PEER_FAILED. */
static ferry_status_t group_result(ferry_ucx_group_t *group, ucs_status_t status)
{
    if (status == UCS_OK)
        return FERRY_OK;
    int failed = atomic_load(&group->ep->failed);
    if (failed != 0)
        return (ferry_status_t)failed;
    return status == UCS_ERR_CANCELED ? FERRY_ERR_CANCELED : ferry_ucx_status(status);
}

void ferry_ucx_slices_finish(const ferry_transport_services_t *svc, ferry_slice_t *slices,
                             ferry_status_t status)
{
    ferry_transport_slices_done(svc, slices, status);
}

static void group_finish(ferry_ucx_group_t *group)
{
    ferry_ucx_ep_t *ep = group->ep;
    ucs_status_t status = (ucs_status_t)atomic_load(&group->status);
    ferry_status_t result = group_result(group, status);
    atomic_store(&ep->last_activity_ms, ferry_ucx_time_ms());
    atomic_fetch_sub(&ep->outstanding, 1);
    atomic_fetch_sub(&ep->worker->busy, 1);
    ferry_ucx_slices_finish(&ep->ucx->svc, group->slices, result);
    if (group->waiter != NULL) {
        ferry_ucx_waiter_t *waiter = group->waiter;
        pthread_mutex_lock(&waiter->lock);
        waiter->done = 1;
        waiter->status = status;
        pthread_cond_signal(&waiter->cond);
        pthread_mutex_unlock(&waiter->lock);
        waiter_unref(waiter);
    }
    free(group->payload);
    ferry_ucx_ep_unref(ep);
    free(group);
}

/* Undo a group nothing was posted for; its slices stay the caller's. */
static void group_abandon(ferry_ucx_group_t *group)
{
    ferry_ucx_ep_t *ep = group->ep;
    atomic_fetch_sub(&ep->outstanding, 1);
    atomic_fetch_sub(&ep->worker->busy, 1);
    ferry_ucx_ep_unref(ep);
    free(group->payload);
    free(group);
}

void ferry_ucx_group_fail(ferry_ucx_group_t *group, ucs_status_t status)
{
    int expected = UCS_OK;
    atomic_compare_exchange_strong(&group->status, &expected, (int)status);
}

void ferry_ucx_group_unref_op(ferry_ucx_group_t *group, ucs_status_t status)
{
    if (status != UCS_OK)
        ferry_ucx_group_fail(group, status);
    if (atomic_fetch_sub(&group->pending, 1) == 1)
        group_finish(group);
}

void ferry_ucx_op_done(void *request, ucs_status_t status, void *user_data)
{
    ferry_ucx_group_t *group = user_data;
    ucp_request_free(request);
    atomic_store_explicit(&group->ep->last_activity_ms, ferry_ucx_time_ms(),
                          memory_order_relaxed);
    ferry_ucx_group_unref_op(group, status);
}

/* Account for an operation UCX accepted: done now, failed now, or later
 * through ferry_ucx_op_done.  Returns the immediate error, if any. */
static ucs_status_t track(ferry_ucx_group_t *group, ucs_status_ptr_t request)
{
    if (UCS_PTR_IS_PTR(request))
        return UCS_OK;
    ucs_status_t status = UCS_PTR_STATUS(request);
    ferry_ucx_group_unref_op(group, status);
    return status;
}

/* ---------------- flushes ---------------- */

typedef struct flush_batch {
    ferry_ucx_ep_t *ep;
    ferry_ucx_group_t *groups; /* linked by flush_next */
} flush_batch_t;

static void flush_done(void *request, ucs_status_t status, void *user_data);

/* Groups waiting for a flush, or NULL (then no flush is in flight any more). */
static ferry_ucx_group_t *flush_take_waiting(ferry_ucx_ep_t *ep)
{
    pthread_mutex_lock(&ep->flush_lock);
    ferry_ucx_group_t *groups = ep->flush_waiting;
    ep->flush_waiting = ep->flush_waiting_tail = NULL;
    if (groups == NULL)
        ep->flush_inflight = 0;
    pthread_mutex_unlock(&ep->flush_lock);
    return groups;
}

static void flush_release(ferry_ucx_group_t *groups, ucs_status_t status)
{
    for (ferry_ucx_group_t *g = groups, *next; g != NULL; g = next) {
        next = g->flush_next;
        g->flush_next = NULL;
        ferry_ucx_group_unref_op(g, status);
    }
}

/*
 * Flush the endpoint for these groups, then for whoever queued up meanwhile,
 * until a flush stays in flight (its callback carries on) or nobody waits.
 * Caller holds ep->lock (so the endpoint stays open) and a reference on ep.
 */
static void flush_run(ferry_ucx_ep_t *ep, ferry_ucx_group_t *groups)
{
    while (groups != NULL) {
        ucp_ep_h handle = atomic_load(&ep->ep);
        ucs_status_t status = UCS_ERR_CANCELED;
        flush_batch_t *batch = handle ? malloc(sizeof(*batch)) : NULL;
        if (handle != NULL && batch == NULL)
            status = UCS_ERR_NO_MEMORY;
        if (batch != NULL) {
            *batch = (flush_batch_t){.ep = ep, .groups = groups};
            ucp_request_param_t param = {
                .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                .cb.send = flush_done,
                .user_data = batch,
            };
            ucs_status_ptr_t request = ucp_ep_flush_nbx(handle, &param);
            if (UCS_PTR_IS_PTR(request))
                return;
            status = UCS_PTR_STATUS(request);
            free(batch);
        }
        ferry_ucx_group_t *next = flush_take_waiting(ep);
        flush_release(groups, status);
        groups = next;
    }
}

static void flush_done(void *request, ucs_status_t status, void *user_data)
{
    flush_batch_t *batch = user_data;
    ferry_ucx_ep_t *ep = batch->ep;
    ferry_ucx_group_t *groups = batch->groups;
    ucp_request_free(request);
    free(batch);
    pthread_mutex_lock(&ep->flush_lock);
    int waiting = ep->flush_waiting != NULL;
    if (!waiting)
        ep->flush_inflight = 0;
    pthread_mutex_unlock(&ep->flush_lock);
    if (waiting) {
        /* Posting from inside a UCX callback can leave the new flush
         * unprogressed: the worker's thread posts it on its next turn. */
        ferry_ucx_worker_t *w = ep->worker;
        pthread_mutex_lock(&w->lock);
        if (!ep->flush_queued) {
            ep->flush_queued = 1;
            atomic_fetch_add(&ep->refs, 1);
            ep->flush_queue_next = w->flush_queue;
            w->flush_queue = ep;
            atomic_store(&w->close_pending, 1);
        }
        pthread_mutex_unlock(&w->lock);
        if (atomic_load(&w->sleeping))
            ucp_worker_signal(w->worker);
    }
    flush_release(groups, status);
}

void ferry_ucx_flush_waiting(ferry_ucx_ep_t *ep)
{
    ferry_lock_acquire(&ep->lock);
    ferry_ucx_group_t *groups = flush_take_waiting(ep);
    if (ep->closed) {
        ferry_lock_release(&ep->lock);
        flush_release(groups, UCS_ERR_CANCELED);
        return;
    }
    flush_run(ep, groups);
    ferry_lock_release(&ep->lock);
}

void ferry_ucx_group_post_flush(ferry_ucx_group_t *group)
{
    ferry_ucx_ep_t *ep = group->ep;
    atomic_fetch_add(&group->pending, 1); /* released by the flush that covers it */
    pthread_mutex_lock(&ep->flush_lock);
    int queued = ep->flush_inflight;
    if (queued) {
        /* The flush in flight may precede our operations: wait for the next. */
        group->flush_next = NULL;
        if (ep->flush_waiting_tail != NULL)
            ep->flush_waiting_tail->flush_next = group;
        else
            ep->flush_waiting = group;
        ep->flush_waiting_tail = group;
    } else {
        ep->flush_inflight = 1;
    }
    pthread_mutex_unlock(&ep->flush_lock);
    if (!queued) {
        group->flush_next = NULL;
        flush_run(ep, group);
    }
}

static ucs_status_t post_slice(ferry_ucx_group_t *group, const ferry_slice_t *slice,
                               ucp_rkey_h rkey)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = ferry_ucx_op_done,
        .user_data = group,
    };
    if (slice->local_memh != NULL) {
        /* The local buffer is registered: UCX skips its own lookup (and any
         * registration) for it. */
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        param.memh = ferry_ucx_memh(slice->local_memh);
    }
    atomic_fetch_add(&group->pending, 1);
    ucs_status_ptr_t request =
        slice->opcode == FERRY_OP_WRITE
            ? ucp_put_nbx(group->ep->ep, slice->local, slice->length, slice->remote_addr, rkey,
                          &param)
            : ucp_get_nbx(group->ep->ep, slice->local, slice->length, slice->remote_addr, rkey,
                          &param);
    return track(group, request);
}

/* Wake a sleeping hybrid progress thread, so that it polls while the
 * operations are in flight instead of waking only when they completed. */
static void kick_progress(ferry_ucx_worker_t *w)
{
    if (w->ucx->progress_mode != FERRY_UCX_PROGRESS_HYBRID)
        return;
    atomic_store_explicit(&w->last_activity_us, ferry_ucx_time_us(), memory_order_relaxed);
    if (atomic_load(&w->sleeping))
        ucp_worker_signal(w->worker);
}

/* ---------------- copies into attached memory ---------------- */

/* Slices whose remote memory UCX attached here (a same-host peer's
 * ferry_alloc buffer): what UCX's own rkey_ptr protocol does, minus its
 * request, its worker lock and the flush.  The first ones, up to
 * FERRY_UCX_LOCKED_COPY_MAX bytes, are copied at once under ep->lock (which
 * keeps the rkeys, the attachments, from a flush) and chained in `copied`;
 * the rest are resolved under it and copied after it (copies), so that
 * threads writing to one peer copy large runs in parallel. */
typedef struct direct_copies {
    ferry_slice_t *copied, **copied_tail;
    size_t copied_bytes;
    size_t count, capacity;
    ferry_slice_t **slices;
    ferry_copy_item_t *copies; /* copies[i] is slices[i]'s */
    ferry_slice_t *inline_slices[64];
    ferry_copy_item_t inline_copies[64];
} direct_copies_t;

static void direct_copies_init(direct_copies_t *c)
{
    c->copied = NULL;
    c->copied_tail = &c->copied;
    c->copied_bytes = c->count = 0;
    c->capacity = FERRY_UCX_ARRAY_SIZE(c->inline_slices);
    c->slices = c->inline_slices;
    c->copies = c->inline_copies;
}

/* Copy the slice now if the bytes copied under the lock allow it (1), else
 * leave it to direct_copies_add (0).  Caller holds ep->lock. */
static int direct_copy_now(direct_copies_t *c, ferry_slice_t *slice, void *remote)
{
    if (c->count > 0 || slice->length > FERRY_UCX_LOCKED_COPY_MAX - c->copied_bytes)
        return 0; /* from the first one left for later on, all are: in order */
    ferry_ucx_direct_copy(slice, remote);
    c->copied_bytes += slice->length;
    *c->copied_tail = slice;
    c->copied_tail = &slice->next;
    return 1;
}

static void direct_copies_release(direct_copies_t *c)
{
    if (c->slices != c->inline_slices) {
        free(c->slices);
        free(c->copies);
    }
}

static ferry_status_t direct_copies_add(direct_copies_t *c, ferry_slice_t *slice, void *remote)
{
    if (c->count == c->capacity) {
        ferry_slice_t **slices = malloc(2 * c->capacity * sizeof(*slices));
        ferry_copy_item_t *copies = malloc(2 * c->capacity * sizeof(*copies));
        if (slices == NULL || copies == NULL) {
            free(slices);
            free(copies);
            return FERRY_ERR_NO_MEMORY;
        }
        memcpy(slices, c->slices, c->count * sizeof(*slices));
        memcpy(copies, c->copies, c->count * sizeof(*copies));
        direct_copies_release(c);
        c->slices = slices;
        c->copies = copies;
        c->capacity *= 2;
    }
    int write = slice->opcode == FERRY_OP_WRITE;
    c->slices[c->count] = slice;
    c->copies[c->count++] = (ferry_copy_item_t){.dst = write ? remote : slice->local,
                                                .src = write ? slice->local : remote,
                                                .length = slice->length,
                                                .to_peer = write};
    return FERRY_OK;
}

/* No fence after the copies: ferry_copy_to_peer ends its non-temporal
 * stores with one, and plain stores are ordered before the completion by
 * the release that publishes it (slices_done's countdown).  A large run is
 * shared with the copy helpers (FERRY_COPY_THREADS), which release their
 * share to us before ferry_copy_many returns. */
static void direct_copies_run(direct_copies_t *c)
{
    ferry_copy_many(c->copies, c->count);
}

/* One chain, one call: the engine settles the run's requests together. */
static void direct_copies_finish(direct_copies_t *c, const ferry_transport_services_t *svc)
{
    *c->copied_tail = c->count > 0 ? c->slices[0] : NULL;
    for (size_t i = 0; i < c->count; i++)
        c->slices[i]->next = i + 1 < c->count ? c->slices[i + 1] : NULL;
    ferry_transport_slices_done(svc, c->copied, FERRY_OK);
}

/*
 * The short path: one small slice into attached memory of the batch's last
 * peer (a ping-pong's write, a flag set again and again) is a bounds check
 * and a copy under the endpoint's lock, none of the lists below.  0: not
 * such a submit, nothing done (keys the peer let go, failures and the
 * reasons a slice is refused are the full path's).
 */
static int submit_short(ferry_ucx_t *ucx, const ferry_peer_t *peer, ferry_slice_t *slice)
{
    ferry_ucx_peer_cache_t *cache = ferry_ucx_peer_cache_of(peer);
    if (cache == NULL || slice->next != NULL || slice->length == 0 ||
        slice->length > FERRY_UCX_LOCKED_COPY_MAX || slice->local == NULL ||
        slice->remote_key == NULL ||
        (slice->opcode != FERRY_OP_WRITE && slice->opcode != FERRY_OP_READ))
        return 0;
    ferry_ucx_ep_t *ep = cache->ep;
    ferry_lock_acquire(&ep->lock);
    void *remote = NULL;
    if (ep->closed || atomic_load(&ep->failed) != 0 || ep->n_rkeys > ucx->settings.rkey_cache ||
        atomic_load(&ep->keys_stale))
        goto not_short;
    if (ferry_ucx_peer_cache_holds_key(cache, peer, ep, slice->remote_key) &&
        cache->direct_addr == slice->remote_addr && cache->direct_length == slice->length) {
        remote = cache->direct_ptr; /* the last copy's place again (a ping-pong's) */
    } else {
        ferry_ucx_rkey_t *entry;
        if (ferry_ucx_rkey_find(peer, ep, slice->remote_key, &entry) != FERRY_OK ||
            !entry->direct ||
            (remote = ferry_ucx_direct_ptr(entry, slice->remote_addr, slice->length)) == NULL)
            goto not_short;
        cache->direct_addr = slice->remote_addr;
        cache->direct_length = slice->length;
        cache->direct_ptr = remote;
    }
    ferry_ucx_direct_copy(slice, remote);
    /* The liveness look comes after the copy, off the path a ping-pong
     * waits on (its clock alone took 7 ns): a copy into a dead peer's
     * memory lands where nobody reads (we keep it mapped), and the request
     * fails all the same. */
    int due = ferry_ucx_ep_liveness_due(ep);
    ferry_lock_release(&ep->lock);
    ucx->svc.slice_done(slice, due ? ferry_ucx_ep_liveness_look(ep) : FERRY_OK);
    return 1;
not_short:
    ferry_lock_release(&ep->lock);
    return 0;
}

ferry_status_t ferry_ucx_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices)
{
    ferry_ucx_t *ucx = ctx;
    if (slices == NULL)
        return FERRY_ERR_INVALID_PARAM;
    if (submit_short(ucx, peer, slices))
        return FERRY_OK;
    /* A batch's submit to the peer of its last one (a ping-pong's every
     * write) looks nothing up and takes no reference: its cache holds one. */
    ferry_ucx_ep_t *ep = ferry_ucx_ep_lock_cached(peer);
    int ref = ep == NULL;
    ferry_status_t result = FERRY_OK;
    if (ref) {
        if ((result = ferry_ucx_ep_get(ucx, peer, &ep)) != FERRY_OK)
            return result;
        ferry_ucx_ep_cache(peer, ep);
        ferry_lock_acquire(&ep->lock);
    }
    ferry_ucx_worker_t *worker = ep->worker;
    if (ep->closed || atomic_load(&ep->failed) != 0) {
        ferry_lock_release(&ep->lock);
        if (ref)
            ferry_ucx_ep_unref(ep);
        return FERRY_ERR_PEER_FAILED;
    }
    ferry_ucx_eager_run_t eager = FERRY_UCX_EAGER_RUN_INIT;
    if ((ep->n_rkeys > ucx->settings.rkey_cache || atomic_load(&ep->keys_stale)) &&
        atomic_load(&ep->outstanding) == 0) {
        /* Nothing in flight uses one (copies into attached memory count as
         * outstanding too): drop them, and with them the attachments of
         * memory the peer let go. */
        ferry_ucx_rkeys_flush(ep);
        atomic_store(&ep->keys_stale, 0);
    }

    /* Three lists out of the caller's, in one pass: slices to copy here
     * (into memory UCX attached), slices posted to UCX (the group's), and
     * the rest, which an error kept from going out -- a malformed slice
     * among them: it and those after it fail, those before it went out (a
     * first one malformed: nothing went out, the submit is refused). */
    direct_copies_t copies;
    direct_copies_init(&copies);
    ferry_ucx_group_t *group = NULL;
    ferry_slice_t *posts = NULL, **posts_tail = &posts, *rest = NULL;
    const char *key = NULL;
    ferry_ucx_rkey_t *entry = NULL;
    ucs_status_t status = UCS_OK;
    int posted = 0, puts = 0;
    for (ferry_slice_t *s = slices, *next; s != NULL; s = next) {
        next = s->next;
        if (s->length == 0 || s->local == NULL || s->remote_key == NULL ||
            (s->opcode != FERRY_OP_READ && s->opcode != FERRY_OP_WRITE)) {
            ferry_error("ucx: a malformed slice (length %zu, opcode %d) to %s", s->length,
                        (int)s->opcode, ep->name);
            result = FERRY_ERR_INVALID_PARAM;
            rest = s;
            break;
        }
        if (key == NULL || (s->remote_key != key && strcmp(s->remote_key, key) != 0)) {
            result = ferry_ucx_rkey_find(peer, ep, s->remote_key, &entry);
            if (result != FERRY_OK) {
                rest = s;
                break;
            }
            key = s->remote_key;
        }
        if (entry->direct) {
            void *remote = ferry_ucx_direct_ptr(entry, s->remote_addr, s->length);
            if (remote == NULL) {
                ferry_error("ucx: [0x%llx, +%zu) of %s is outside the memory its key maps",
                            (unsigned long long)s->remote_addr, s->length, ep->name);
                result = FERRY_ERR_OUT_OF_RANGE;
                rest = s;
                break;
            }
            if (direct_copy_now(&copies, s, remote))
                continue;
            if ((result = direct_copies_add(&copies, s, remote)) != FERRY_OK) {
                rest = s;
                break;
            }
            continue;
        }
        if (group == NULL) {
            if ((group = ferry_ucx_group_new(ep)) == NULL) {
                result = FERRY_ERR_NO_MEMORY;
                rest = s;
                break;
            }
            ferry_ucx_posting_begin(worker); /* its thread keeps off the worker meanwhile */
        }
        if (ferry_ucx_eager_fits(ep, s)) {
            status = ferry_ucx_eager_post(&eager, group, s);
        } else {
            status = post_slice(group, s, entry->rkey);
            puts++;
        }
        *posts_tail = s; /* failed to post: it fails with the group */
        posts_tail = &s->next;
        if (status != UCS_OK) {
            rest = next;
            break;
        }
        posted++;
    }
    *posts_tail = NULL;
    ferry_ucx_eager_run_end(&eager, group);
    if (group != NULL)
        ferry_ucx_posting_end(worker);
    int direct = copies.copied != NULL || copies.count > 0;
    if (posted == 0 && !direct) {
        /* Nothing went out: no slice is queued, the engine may retry. */
        ferry_lock_release(&ep->lock);
        if (group != NULL) /* its own reference keeps ep alive through this */
            group_abandon(group);
        direct_copies_release(&copies);
        if (ref)
            ferry_ucx_ep_unref(ep);
        return result != FERRY_OK ? result : ferry_ucx_status(status);
    }
    /* The copies left for after the lock count as outstanding meanwhile,
     * which keeps their rkeys (attachments) from a flush. */
    if (copies.count > 0)
        atomic_fetch_add(&ep->outstanding, 1);
    if (posted > 0) {
        if (rest != NULL) {
            /* Later slices of this submit cannot go: they fail with the group. */
            *posts_tail = rest;
            rest = NULL;
            ferry_ucx_group_fail(group, UCS_ERR_INVALID_PARAM);
        }
        group->slices = posts;
        if (puts > 0) /* eager writes complete by their acknowledgement, no flush */
            ferry_ucx_group_post_flush(group);
        ferry_lock_release(&ep->lock);
        if (atomic_load(&group->pending) > 1)
            kick_progress(worker);
        ferry_ucx_group_unref_op(group, UCS_OK); /* may finish the slices right here */
    } else {
        ferry_lock_release(&ep->lock);
        if (group != NULL)
            group_abandon(group);
        if (posts != NULL) { /* a post UCX refused at once fails with the rest */
            *posts_tail = rest;
            rest = posts;
        }
    }
    if (copies.count > 0) {
        direct_copies_run(&copies);
        /* A group's deadline counts from the first request after an
         * idle spell: ours kept the count up, so restart the clock. */
        atomic_store_explicit(&ep->last_activity_ms, ferry_ucx_time_ms(), memory_order_relaxed);
        atomic_fetch_sub(&ep->outstanding, 1);
    }
    if (direct)
        direct_copies_finish(&copies, &ucx->svc);
    direct_copies_release(&copies);
    ferry_ucx_slices_finish(&ucx->svc, rest,
                            result != FERRY_OK   ? result
                            : status != UCS_OK   ? ferry_ucx_status(status)
                                                 : FERRY_ERR_INVALID_PARAM);
    if (ref)
        ferry_ucx_ep_unref(ep);
    return FERRY_OK;
}
