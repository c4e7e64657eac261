/*
 * Completion of a batch's requests (batch.h): transports report slices
 * done, requests finish, their runs and the batch count down.
 */
#include "batch.h"

#include <limits.h>

static void settle_all(settle_t *s)
{
    ferry_batch_run_settle(s);
    if (s->pending == 0)
        return;
    atomic_uint *pending = &s->batch->pending;
    unsigned n = s->pending;
    s->pending = 0;
    /* From here on the batch may be gone: the wake reads nothing. */
    if (atomic_fetch_sub_explicit(pending, n, memory_order_acq_rel) == (PENDING_SLEEPER | n))
        ferry_futex_wake(pending, INT_MAX);
}

/* The request is done: its state is published and it joins s. */
static inline void request_finish(request_state_t *req, settle_t *s)
{
    request_run_t *run = req->run;
    if (s->run != run) {
        if (s->run == NULL) { /* the call's first request: nothing to settle yet */
            s->batch = run->batch;
        } else if (s->batch != run->batch) {
            settle_all(s);
            s->batch = run->batch;
        } else {
            ferry_batch_run_settle(s);
        }
        s->run = run;
    }
    s->run_done++;
    int error = atomic_load_explicit(&req->error, memory_order_relaxed);
    s->run_bytes += req->one_slice.length; /* for the statistics; taken back below */
    /* Plain (release) stores, no locked instruction: the countdown of
     * pending in settle_all publishes them to whoever sees it reach 0. */
    atomic_store_explicit(&req->state,
                          !error ? FERRY_XFER_COMPLETED
                          : error == FERRY_ERR_CANCELED ? FERRY_XFER_CANCELLED
                                                        : FERRY_XFER_FAILED,
                          memory_order_release);
    if (error) {
        atomic_store_explicit(&run->batch->any_failed, 1, memory_order_release);
        s->run_failed++;
        s->run_bytes -= req->one_slice.length;
    }
    s->pending++;
}

/* A request that finishes alone (a local copy, a failure in submit). */
void ferry_batch_request_finish_alone(request_state_t *req)
{
    settle_t s = {0};
    request_finish(req, &s);
    settle_all(&s);
}

void ferry_batch_request_fail(request_state_t *req, ferry_status_t status)
{
    int expected = 0;
    atomic_compare_exchange_strong(&req->error, &expected, (int)status);
    ferry_batch_request_finish_alone(req);
}

/* A staged slice is done: a READ's bytes go on to the device; its buffer
 * goes back. */
static ferry_status_t unstage_slice(request_state_t *req, ferry_slice_t *slice,
                                    ferry_status_t status)
{
    const request_run_t *run = req->run;
    size_t i = (size_t)(slice - req->slices);
    void *device = (char *)req->one_slice.local + (slice->remote_addr - req->one_slice.remote_addr);
    if (status == FERRY_OK && run->opcode == FERRY_OP_READ)
        status = run->local_accel->copy(device, slice->local, slice->length);
    ferry_stage_put(run->batch->engine, req->chunks[i]);
    req->chunks[i] = NULL;
    return status;
}

/* The request's error: the first failure, except that a failure after a
 * cancellation replaces it (the failed part's bytes may still land, so the
 * request cannot be reported CANCELLED). */
static void note_error(request_state_t *req, ferry_status_t result)
{
    int expected = 0;
    if (atomic_compare_exchange_strong(&req->error, &expected, (int)result) ||
        result == FERRY_ERR_CANCELED)
        return;
    expected = FERRY_ERR_CANCELED;
    atomic_compare_exchange_strong(&req->error, &expected, (int)result);
}

void ferry_batch_slices_done(ferry_slice_t *slices, ferry_status_t status)
{
    settle_t s = {0};
    for (ferry_slice_t *slice = slices; slice != NULL;) {
        /* The slices of one request that follow each other in the chain
         * count down together.  Each next is read before the request can
         * finish: after that the slices may be reused. */
        request_state_t *req = slice->owner;
        unsigned done = 0;
        do {
            ferry_slice_t *next = slice->next; /* relinked at the next launch */
            ferry_status_t result = req->staged ? unstage_slice(req, slice, status) : status;
            if (result != FERRY_OK)
                note_error(req, result);
            done++;
            slice = next;
        } while (slice != NULL && slice->owner == req);
        /* Holding the last slices left, nobody else counts down: no locked
         * instruction (a request of one slice, every slice of a run). */
        if (atomic_load_explicit(&req->slices_left, memory_order_acquire) == done ||
            atomic_fetch_sub(&req->slices_left, done) == done)
            request_finish(req, &s);
    }
    settle_all(&s);
}

void ferry_batch_slice_done(ferry_slice_t *slice, ferry_status_t status)
{
    slice->next = NULL;
    ferry_batch_slices_done(slice, status);
}
