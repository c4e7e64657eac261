/*
 * Batches: submit resolves every request first (all or nothing), then
 * slices each request and hands the slices to its transport.  Completion
 * counts down per request and per batch, and only the batch's last
 * completion wakes a waiter, so a batch of many small requests costs one
 * wake-up.
 *
 * A batch is four files around one private header (batch.h): this one,
 * the run record (batch_run.c), launch (batch_launch.c) and completion
 * (batch_complete.c).
 */
#include "batch.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static ferry_batch_t *batch_lookup(ferry_batch_h handle)
{
    return ferry_handle_lookup((uint64_t)(uintptr_t)handle, FERRY_HANDLE_BATCH, NULL);
}

ferry_status_t ferry_batch_create(ferry_engine_h handle, size_t max_requests,
                                  ferry_batch_h *batch_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (max_requests == 0 || max_requests > (1u << 24) || batch_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_batch_t *batch = calloc(1, sizeof(*batch));
    if (batch == NULL ||
        (batch->requests = aligned_alloc(_Alignof(request_state_t),
                                         max_requests * sizeof(request_state_t))) == NULL ||
        (batch->runs = calloc(max_requests, sizeof(request_run_t))) == NULL) {
        if (batch != NULL)
            free(batch->requests);
        free(batch);
        return FERRY_ERR_NO_MEMORY;
    }
    memset(batch->requests, 0, max_requests * sizeof(request_state_t));
    for (size_t i = 0; i < max_requests; i++)
        batch->requests[i].one_slice.owner = &batch->requests[i];
    batch->engine = engine;
    batch->max = max_requests;
    batch->handle = ferry_handle_alloc(FERRY_HANDLE_BATCH, batch, engine);
    if (batch->handle == 0) {
        free(batch->runs);
        free(batch->requests);
        free(batch);
        return FERRY_ERR_NO_RESOURCE;
    }
    pthread_mutex_lock(&engine->batches_lock);
    batch->next = engine->batches;
    engine->batches = batch;
    pthread_mutex_unlock(&engine->batches_lock);
    *batch_p = (ferry_batch_h)(uintptr_t)batch->handle;
    return FERRY_OK;
}

/*
 * The round is the previous one again: one request, the same in every
 * field, to a segment that still shows the descriptor it was resolved with
 * (a ping-pong's write, a flag set again and again).  The slot keeps its
 * descriptor, resolution, slices and the transport's view of the peer;
 * only the handle and the local buffer are looked at again.  Caller holds
 * submit_lock, nothing is in flight and the last round was one request.
 * 0: not such a round, nothing changed.
 */
static int submit_again(ferry_batch_t *batch, const ferry_request_t *in)
{
    request_state_t *req = &batch->requests[0];
    request_run_t *run = req->run; /* the round's only run */
    if (run->desc_version == 0 || !run->peer_made || in->transport != NULL || run->wanted >= 0 ||
        in->opcode != run->opcode || in->local != req->one_slice.local ||
        in->length != req->one_slice.length ||
        in->target_offset != req->one_slice.remote_addr ||
        atomic_load_explicit(&req->state, memory_order_relaxed) != FERRY_XFER_COMPLETED ||
        ferry_handle_lookup((uint64_t)(uintptr_t)in->target, FERRY_HANDLE_SEGMENT,
                            batch->engine) != run->segment ||
        !ferry_segment_still_current(run->segment, run->desc_version))
        return 0;
    /* A completed round left no error, no failure flag and no entry held. */
    ferry_engine_t *engine = batch->engine;
    /* owes nothing */
    if ((run->local_entry = ferry_batch_run_local_entry(engine, req, NULL, NULL)) != NULL)
        batch->kept_entry = run->local_entry;
    run->local_accel = ferry_batch_run_local_memory(engine, run, req->one_slice.local);
    atomic_store_explicit(&run->left, 1, memory_order_relaxed);
    run->submit_ticks = batch->submit_ticks;
    atomic_store_explicit(&batch->pending, 1, memory_order_release);
    ferry_batch_launch(engine, req); /* its slices are relinked, not cut again (prepare_slices) */
    return 1;
}

ferry_status_t ferry_batch_submit(ferry_batch_h handle, const ferry_request_t *requests,
                                  size_t count)
{
    ferry_batch_t *batch = batch_lookup(handle);
    if (batch == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (requests == NULL || count == 0)
        return FERRY_ERR_INVALID_PARAM;
    ferry_engine_t *engine = batch->engine;
    ferry_lock_acquire(&batch->submit_lock);
    batch->submit_ticks = engine->stats.enabled ? ferry_stats_now() : 0;
    if (batch_pending(batch) == 0 && count == 1 && batch->used == 1 &&
        submit_again(batch, requests)) {
        ferry_lock_release(&batch->submit_lock);
        return FERRY_OK;
    }
    if (batch_pending(batch) == 0) {
        /* Everything earlier finished: the batch starts over. */
        if (batch->runs_used > 0 && batch->runs[batch->runs_used - 1].desc_version != 0) {
            request_run_t *last = &batch->runs[batch->runs_used - 1];
            batch->kept_segment = last->segment;
            batch->kept_desc = last->desc;
            batch->kept_version = last->desc_version;
            last->desc = NULL;
        }
        ferry_batch_runs_release(engine, batch->runs, batch->runs_used);
        batch->used = batch->runs_used = 0;
        if (atomic_load_explicit(&batch->any_failed, memory_order_relaxed)) /* no xchg each time */
            atomic_store_explicit(&batch->any_failed, 0, memory_order_relaxed);
    }
    ferry_status_t status = FERRY_OK;
    if (count > batch->max - batch->used) {
        ferry_error("batch of %zu requests: %zu in use, %zu more submitted", batch->max,
                    batch->used, count);
        status = FERRY_ERR_TOO_MANY;
        goto out_unlock;
    }
    request_state_t *reqs = &batch->requests[batch->used];
    size_t first_run = batch->runs_used;
    status = ferry_batch_resolve_all(batch, requests, reqs, count);
    if (status != FERRY_OK)
        goto out_unlock;
    request_run_t *runs = &batch->runs[first_run];
    size_t n_runs = batch->runs_used - first_run;
    for (size_t r = 0; r < n_runs; r++) /* published with pending, below */
        atomic_store_explicit(&runs[r].left, runs[r].n, memory_order_relaxed);
    /* Nothing in flight means nobody else moves the count: no locked add. */
    if (batch->used == 0)
        atomic_store_explicit(&batch->pending, count, memory_order_release);
    else
        atomic_fetch_add(&batch->pending, count);
    batch->used += count;
    ferry_batch_launch_all(engine, reqs, runs, n_runs);
out_unlock:
    if (batch->kept_desc != NULL) { /* not taken */
        ferry_descriptor_unref(batch->kept_desc);
        batch->kept_desc = NULL;
    }
    ferry_lock_release(&batch->submit_lock);
    return status;
}

ferry_status_t ferry_batch_status(ferry_batch_h handle, size_t index,
                                  ferry_xfer_status_t *status_p)
{
    ferry_batch_t *batch = batch_lookup(handle);
    if (batch == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (status_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_lock_acquire(&batch->submit_lock);
    size_t used = batch->used;
    ferry_lock_release(&batch->submit_lock);
    if (index >= used)
        return FERRY_ERR_INVALID_PARAM;
    request_state_t *req = &batch->requests[index];
    status_p->state = atomic_load(&req->state);
    status_p->error = (ferry_status_t)atomic_load(&req->error);
    status_p->transferred = status_p->state == FERRY_XFER_COMPLETED ? req->one_slice.length : 0;
    status_p->transport = transport_name(batch->engine, req->run->transport);
    return FERRY_OK;
}

/* The notify attached to a batch, taken (once) when every request is done;
 * caller holds submit_lock. */
static ferry_descriptor_t *take_attached_notify(ferry_batch_t *batch, void **msg_p,
                                                size_t *length_p)
{
    ferry_descriptor_t *desc = batch->notify_desc;
    *msg_p = batch->notify_msg;
    *length_p = batch->notify_length;
    batch->notify_desc = NULL;
    batch->notify_msg = NULL;
    atomic_store(&batch->notify_attached, 0);
    return desc;
}

/* Looks between two readings of the clock in drive_progress. */
#define LOOKS_PER_CLOCK 8

/* Before sleeping, poll the transports that can progress on our thread: a
 * short request then completes here, without the wakeup of a handoff from
 * the transport's thread (tens of microseconds on a busy host).  The clock
 * is read on every LOOKS_PER_CLOCK-th look, the first time to start the
 * spin: a request done within that many looks (an 8 B write over shm takes
 * a few) reads no clock (~23 ns a reading here, as much as a look), and the
 * spin ends up to twice that many looks past spin_us. */
static void drive_progress(ferry_batch_t *batch, int timeout_ms)
{
    ferry_engine_t *engine = batch->engine;
    uint64_t spin_us = engine->settings.wait_spin_us;
    if (timeout_ms >= 0 && spin_us > (uint64_t)timeout_ms * 1000u)
        spin_us = (uint64_t)timeout_ms * 1000u;
    if (engine->n_progress == 0 || spin_us == 0)
        return;
    uint64_t start = 0;
    for (unsigned looks = 1; batch_pending(batch) > 0; looks++) {
        for (size_t i = 0; i < engine->n_progress; i++)
            engine->progress[i]->ops->progress(engine->progress[i]->ctx);
        if (looks % LOOKS_PER_CLOCK != 0)
            continue;
        uint64_t now = ferry_time_us();
        if (looks == LOOKS_PER_CLOCK)
            start = now;
        else if (now - start >= spin_us)
            break;
    }
}

static int batch_done(void *batch)
{
    return batch_pending(batch) == 0;
}

/*
 * The transport a waiter may block in (its `wait` op), or NULL.  A waiter
 * asleep on the pending word costs a hand-off per completion: the
 * transport's thread takes the event, then wakes the waiter (io_uring: three
 * context switches where a thread asleep in the ring takes one).  Blocking
 * in the transport is right only when every request of the round is that
 * transport's: a request elsewhere (another transport, a local copy) would
 * finish without an event there.  Runs keep their transport once submit
 * returns (a refused launch resolves again inside submit, under
 * submit_lock), so one look per blocking wait, after the spin, suffices;
 * requests finished already count too (conservative, never wrong).
 */
static ferry_transport_instance_t *wait_transport(ferry_batch_t *batch)
{
    ferry_engine_t *engine = batch->engine;
    int transport = -1;
    ferry_lock_acquire(&batch->submit_lock);
    for (size_t r = 0; r < batch->runs_used; r++) {
        int t = batch->runs[r].transport;
        if (t < 0 || (transport >= 0 && t != transport)) {
            transport = -1;
            break;
        }
        transport = t;
    }
    ferry_lock_release(&batch->submit_lock);
    if (transport < 0 || !FERRY_TRANSPORT_OPS_HAS(engine->transports[transport].ops, wait))
        return NULL;
    return &engine->transports[transport];
}

/* Sleep on the pending word until its count is 0 (FERRY_ERR_TIMEOUT at
 * the deadline, unless NULL).  The sleeper bit is set before sleeping, so
 * the finisher that counts down to 0 sees it and wakes us. */
static ferry_status_t sleep_on_word(void *arg, const struct timespec *deadline)
{
    ferry_batch_t *batch = arg;
    unsigned word = atomic_load_explicit(&batch->pending, memory_order_acquire);
    while (PENDING_COUNT(word) > 0) {
        if (!(word & PENDING_SLEEPER) &&
            !atomic_compare_exchange_weak_explicit(&batch->pending, &word,
                                                   word | PENDING_SLEEPER,
                                                   memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* word is the new value */
        if (ferry_futex_wait(&batch->pending, word | PENDING_SLEEPER, deadline) == ETIMEDOUT &&
            batch_pending(batch) > 0)
            return FERRY_ERR_TIMEOUT;
        word = atomic_load_explicit(&batch->pending, memory_order_acquire);
    }
    return FERRY_OK;
}

/* Sleep until the pending count is 0 (FERRY_ERR_TIMEOUT after timeout_ms,
 * unless negative): in the transport that holds the round, where it offers
 * that (its wait op, which may sleep on the word itself), else on the word. */
static ferry_status_t sleep_until_done(ferry_batch_t *batch, int timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        ferry_deadline_after_ms(&deadline, CLOCK_MONOTONIC, (unsigned)timeout_ms);
    const struct timespec *until = timeout_ms >= 0 ? &deadline : NULL;
    ferry_transport_instance_t *waiter = wait_transport(batch);
    if (waiter == NULL)
        return sleep_on_word(batch, until);
    ferry_wait_t wait = {.done = batch_done, .sleep = sleep_on_word, .arg = batch,
                         .deadline = until};
    if (waiter->ops->wait(waiter->ctx, &wait) == FERRY_OK || batch_pending(batch) == 0)
        return FERRY_OK;
    return FERRY_ERR_TIMEOUT;
}

ferry_status_t ferry_batch_wait(ferry_batch_h handle, int timeout_ms)
{
    ferry_batch_t *batch = batch_lookup(handle);
    if (batch == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    /* Finished already (a copy done in submit): no clock, no system call. */
    if (batch_pending(batch) > 0)
        drive_progress(batch, timeout_ms);
    if (batch_pending(batch) > 0) {
        ferry_engine_progress_leave(batch->engine);
        if (sleep_until_done(batch, timeout_ms) != FERRY_OK)
            return FERRY_ERR_TIMEOUT;
    }

    /* All completed and nothing to send: no lock. */
    if (!atomic_load(&batch->any_failed) && !atomic_load(&batch->notify_attached))
        return FERRY_OK;
    ferry_status_t result = FERRY_OK;
    ferry_descriptor_t *notify = NULL;
    void *msg = NULL;
    size_t length = 0;
    ferry_lock_acquire(&batch->submit_lock);
    for (size_t i = 0; i < batch->used && result == FERRY_OK; i++)
        result = (ferry_status_t)atomic_load(&batch->requests[i].error);
    if (result == FERRY_OK && batch->notify_desc != NULL)
        notify = take_attached_notify(batch, &msg, &length);
    ferry_lock_release(&batch->submit_lock);
    if (notify != NULL) {
        result = ferry_engine_send_notify(batch->engine, notify, msg, length);
        ferry_descriptor_unref(notify);
        free(msg);
    }
    return result;
}

ferry_status_t ferry_batch_notify(ferry_batch_h handle, ferry_segment_h segment_handle,
                                  const void *msg, size_t length)
{
    ferry_batch_t *batch = batch_lookup(handle);
    if (batch == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    ferry_engine_t *engine = batch->engine;
    ferry_segment_t *segment = ferry_handle_lookup((uint64_t)(uintptr_t)segment_handle,
                                                   FERRY_HANDLE_SEGMENT, engine);
    if (segment == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if ((msg == NULL && length > 0) || length > FERRY_NOTIFY_MAX)
        return FERRY_ERR_INVALID_PARAM;
    ferry_descriptor_t *desc;
    ferry_status_t status = ferry_segment_descriptor(engine, segment, &desc);
    if (status != FERRY_OK)
        return status;
    void *copy = malloc(length ? length : 1);
    if (copy == NULL) {
        ferry_descriptor_unref(desc);
        return FERRY_ERR_NO_MEMORY;
    }
    if (length)
        memcpy(copy, msg, length);
    ferry_lock_acquire(&batch->submit_lock);
    if (batch->notify_desc)
        ferry_descriptor_unref(batch->notify_desc);
    free(batch->notify_msg);
    batch->notify_desc = desc;
    batch->notify_msg = copy;
    batch->notify_length = length;
    atomic_store(&batch->notify_attached, 1);
    ferry_lock_release(&batch->submit_lock);
    return FERRY_OK;
}

static void batch_free(ferry_batch_t *batch)
{
    ferry_handle_free(batch->handle);
    ferry_batch_runs_release(batch->engine, batch->runs, batch->runs_used);
    for (size_t i = 0; i < batch->max; i++) {
        free(batch->requests[i].many_slices);
        free(batch->requests[i].chunks);
    }
    if (batch->notify_desc)
        ferry_descriptor_unref(batch->notify_desc);
    free(batch->notify_msg);
    free(batch->runs);
    free(batch->requests);
    free(batch);
}

/* What the transports keep for the batch goes back to them (while they
 * still run). */
static void peer_caches_release(ferry_batch_t *batch)
{
    ferry_engine_t *engine = batch->engine;
    for (size_t i = 0; i < engine->n_transports; i++) {
        if (batch->peer_caches[i] != NULL)
            engine->transports[i].ops->peer_cache_release(engine->transports[i].ctx,
                                                          batch->peer_caches[i]);
        batch->peer_caches[i] = NULL;
    }
}

ferry_status_t ferry_batch_destroy(ferry_batch_h handle)
{
    ferry_batch_t *batch = batch_lookup(handle);
    if (batch == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    unsigned pending = batch_pending(batch);
    if (pending > 0) {
        ferry_error("ferry_batch_destroy: %u request(s) still in flight", pending);
        return FERRY_ERR_BUSY;
    }
    ferry_engine_t *engine = batch->engine;
    pthread_mutex_lock(&engine->batches_lock);
    for (ferry_batch_t **p = &engine->batches; *p; p = &(*p)->next) {
        if (*p == batch) {
            *p = batch->next;
            break;
        }
    }
    pthread_mutex_unlock(&engine->batches_lock);
    /* A cancel still inside (batch_cancel.c) let the last request finish
     * while holding submit_lock: it leaves before the batch goes. */
    ferry_lock_acquire(&batch->submit_lock);
    ferry_lock_release(&batch->submit_lock);
    peer_caches_release(batch);
    batch_free(batch);
    return FERRY_OK;
}

/*
 * Under submit_lock: no submit runs, so every request of the round is with
 * its transport or finished, and none of another round can start while the
 * transports take theirs back.  Requests are told apart by their slot's
 * address: the batch's requests[] is the owner range.  Lifetimes:
 * - a transport's completion thread and cancel never both finish a slice:
 *   the transport holds each slice in one place under its lock, and cancel
 *   takes only those it can still keep off the wire (tcp: its queues);
 * - a cancelled request finishes like any other (slices_done): its run's
 *   hold on the local buffer goes back, so an unregister waiting for it
 *   proceeds, and the batch counts down;
 * - completions reported from here may finish the batch, and a waiter may
 *   then start it over (submit waits for submit_lock) or destroy it
 *   (destroy waits for submit_lock before it frees).
 */
ferry_status_t ferry_batch_cancel(ferry_batch_h handle)
{
    ferry_batch_t *batch = batch_lookup(handle);
    if (batch == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    ferry_engine_t *engine = batch->engine;
    ferry_lock_acquire(&batch->submit_lock);
    const void *lo = batch->requests, *hi = batch->requests + batch->max;
    for (size_t i = 0; i < engine->n_transports && batch_pending(batch) > 0; i++) {
        ferry_transport_instance_t *tp = &engine->transports[i];
        if (FERRY_TRANSPORT_OPS_HAS(tp->ops, cancel))
            tp->ops->cancel(tp->ctx, lo, hi);
    }
    ferry_lock_release(&batch->submit_lock);
    return FERRY_OK;
}

void ferry_batch_forget_entry(ferry_engine_t *engine, const ferry_reg_entry_t *entry)
{
    pthread_mutex_lock(&engine->batches_lock);
    for (ferry_batch_t *batch = engine->batches; batch != NULL; batch = batch->next) {
        ferry_lock_acquire(&batch->submit_lock);
        if (batch->kept_entry == entry)
            batch->kept_entry = NULL;
        if (batch->requests[0].slices_entry == entry) /* their handles are the entry's */
            batch->requests[0].slices_made = 0;
        ferry_lock_release(&batch->submit_lock);
    }
    pthread_mutex_unlock(&engine->batches_lock);
}

void ferry_batch_release_peer_caches(ferry_engine_t *engine)
{
    pthread_mutex_lock(&engine->batches_lock);
    for (ferry_batch_t *batch = engine->batches; batch != NULL; batch = batch->next) {
        ferry_lock_acquire(&batch->submit_lock);
        peer_caches_release(batch);
        ferry_lock_release(&batch->submit_lock);
    }
    pthread_mutex_unlock(&engine->batches_lock);
}

void ferry_batch_free_all(ferry_engine_t *engine)
{
    /* Transports are gone, so nothing completes any more. */
    for (ferry_batch_t *batch = engine->batches, *next; batch; batch = next) {
        next = batch->next;
        batch_free(batch);
    }
    engine->batches = NULL;
}
