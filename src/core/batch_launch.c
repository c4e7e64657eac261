/*
 * Launch of a batch's requests (batch.h): a copy for our own segment, or
 * slices cut and handed to the transport, runs to one peer in one submit;
 * a refused submit refreshes and retries request by request.
 */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

/* Our own segment: a bounds-checked copy, done now. */
static void launch_local(ferry_engine_t *engine, request_state_t *req)
{
    const request_run_t *run = req->run;
    ferry_access_t access = run->opcode == FERRY_OP_WRITE ? FERRY_ACCESS_WRITE
                                                          : FERRY_ACCESS_READ;
    void *token;
    ferry_status_t status = ferry_engine_access_acquire(engine, req->one_slice.remote_addr,
                                                        req->one_slice.length,
                                                        access | FERRY_ACCESS_STORAGE, &token);
    const ferry_storage_t *storage = status == FERRY_OK ? ((ferry_reg_entry_t *)token)->storage
                                                        : NULL;
    if (storage != NULL && run->local_accel == NULL) {
        status = ferry_storage_copy(storage, run->opcode, req->one_slice.remote_addr,
                                    req->one_slice.local, req->one_slice.length);
        ferry_engine_access_release(engine, token);
    } else if (storage != NULL) {
        status = ferry_storage_copy_device(engine, storage, run->opcode,
                                           req->one_slice.remote_addr, req->one_slice.local,
                                           req->one_slice.length);
        ferry_engine_access_release(engine, token);
    } else if (status == FERRY_OK) {
        void *remote = (void *)(uintptr_t)req->one_slice.remote_addr;
        void *dst = run->opcode == FERRY_OP_WRITE ? remote : req->one_slice.local;
        const void *src = run->opcode == FERRY_OP_WRITE ? req->one_slice.local : remote;
        /* Device memory on either side: the vendor copies, never the CPU. */
        const ferry_accel_ops_t *accel = ((const ferry_reg_entry_t *)token)->accel;
        if (accel == NULL)
            accel = run->local_accel;
        if (accel != NULL)
            status = accel->copy(dst, src, req->one_slice.length);
        else
            memmove(dst, src, req->one_slice.length);
        ferry_engine_access_release(engine, token);
    }
    if (status == FERRY_OK)
        ferry_batch_request_finish_alone(req);
    else
        ferry_batch_request_fail(req, status);
}

/* Give back the staging buffers the request holds. */
static void unstage(ferry_engine_t *engine, request_state_t *req)
{
    for (size_t i = 0; req->staged && i < req->n_slices; i++) {
        if (req->chunks[i] != NULL)
            ferry_stage_put(engine, req->chunks[i]);
        req->chunks[i] = NULL;
    }
}

/* Slice i of a staged request gets its buffer; a WRITE's bytes come off
 * the device into it now. */
static ferry_status_t stage_slice(ferry_engine_t *engine, request_state_t *req, size_t i,
                                  ferry_slice_t *slice, size_t offset)
{
    const request_run_t *run = req->run;
    req->chunks[i] = ferry_stage_get(engine, run->local_accel);
    if (req->chunks[i] == NULL)
        return FERRY_ERR_NO_MEMORY;
    void *device = (char *)req->one_slice.local + offset;
    slice->local = ferry_stage_buffer(req->chunks[i]);
    slice->local_memh = NULL;
    if (run->opcode == FERRY_OP_WRITE)
        return run->local_accel->copy(slice->local, device, slice->length);
    return FERRY_OK;
}

static ferry_status_t prepare_slices_cut(ferry_engine_t *engine, request_state_t *req,
                                         const slice_plan_t *plan);

/* The request's slices were cut at an earlier launch for its run's
 * resolution and local entry (a request submitted again): relinked, they
 * go out as they are, with no plan read.  Slices kept so are never staged
 * (staged ones are cut anew each launch). */
static inline int slices_ready(const request_state_t *req)
{
    return req->slices_made && req->slices_entry == req->run->local_entry;
}

static inline void slices_relink(request_state_t *req)
{
    req->staged = 0;
    for (size_t i = 0; i < req->n_slices; i++)
        req->slices[i].next = i + 1 < req->n_slices ? &req->slices[i + 1] : NULL;
    atomic_store_explicit(&req->slices_left, req->n_slices, memory_order_release);
}

/* Cut the request into its transport's slices, linked by next (again only
 * the links, when they were cut for this resolution and local entry). */
static inline ferry_status_t prepare_slices(ferry_engine_t *engine, request_state_t *req,
                                            const slice_plan_t *plan)
{
    req->staged = plan->staged;
    if (!plan->staged && (plan->slice_size == 0 || plan->slice_size >= req->one_slice.length) &&
        !req->slices_made) {
        /* The common small request: its one slice is the slot's own. */
        request_run_t *run = req->run;
        run->remote_key = plan->remote_key;
        run->local_memh = plan->local_memh;
        slice_cut_one(req, run);
        return FERRY_OK;
    }
    return prepare_slices_cut(engine, req, plan);
}

static ferry_status_t prepare_slices_cut(ferry_engine_t *engine, request_state_t *req,
                                         const slice_plan_t *plan)
{
    const request_run_t *run = req->run;
    if (slices_ready(req)) {
        slices_relink(req);
        return FERRY_OK;
    }
    size_t slice_size = plan->slice_size;
    if (req->staged && (slice_size == 0 || slice_size > engine->stage.chunk_size))
        slice_size = engine->stage.chunk_size;
    if (slice_size == 0 || slice_size > req->one_slice.length)
        slice_size = req->one_slice.length;
    size_t length = req->one_slice.length;
    size_t count = slice_size == length ? 1 : (length + slice_size - 1) / slice_size;
    /* A staged request's one slice is not one_slice: it points at a
     * staging buffer, and one_slice holds the request's range. */
    if ((count > 1 || req->staged) && count > req->many_cap) {
        ferry_slice_t *grown = realloc(req->many_slices, count * sizeof(*grown));
        if (grown == NULL)
            return FERRY_ERR_NO_MEMORY;
        req->many_slices = grown;
        req->many_cap = count;
    }
    req->slices = count == 1 && !req->staged ? &req->one_slice : req->many_slices;
    if (req->staged && count > req->chunks_cap) {
        ferry_stage_chunk_t **grown = realloc(req->chunks, count * sizeof(*grown));
        if (grown == NULL)
            return FERRY_ERR_NO_MEMORY;
        req->chunks = grown;
        req->chunks_cap = count;
    }
    for (size_t i = 0, offset = 0; i < count; i++, offset += slice_size) {
        ferry_slice_t *slice = &req->slices[i];
        slice->opcode = run->opcode;
        slice->local = (char *)req->one_slice.local + offset;
        slice->remote_addr = req->one_slice.remote_addr + offset;
        slice->length = FERRY_MIN(slice_size, req->one_slice.length - offset);
        slice->remote_key = plan->remote_key;
        slice->local_memh = plan->local_memh;
        slice->local_device = run->local_accel != NULL && !req->staged;
        slice->owner = req;
        slice->next = i + 1 < count ? &req->slices[i + 1] : NULL;
        if (req->staged)
            req->chunks[i] = NULL;
    }
    req->n_slices = count;
    for (size_t i = 0, offset = 0; req->staged && i < count; i++, offset += slice_size) {
        ferry_status_t status = stage_slice(engine, req, i, &req->slices[i], offset);
        if (status != FERRY_OK) {
            ferry_error("staging a %zu-byte %s of device memory failed: %s", req->one_slice.length,
                        run->opcode == FERRY_OP_WRITE ? "write" : "read",
                        ferry_status_string(status));
            unstage(engine, req);
            req->slices_made = 0;
            return status;
        }
    }
    req->slices_entry = run->local_entry;
    /* Staged slices point at buffers that go back when they are done: cut
     * them anew each launch. */
    req->slices_made = !req->staged;
    atomic_store_explicit(&req->slices_left, count, memory_order_release);
    return FERRY_OK;
}

/* Hand first's slices, and whatever is chained behind them, to its run's
 * transport.  Non-OK: nothing was queued. */
static ferry_status_t submit_slices(ferry_engine_t *engine, request_state_t *first)
{
    request_run_t *run = first->run;
    ferry_transport_instance_t *tp = &engine->transports[run->transport];
    if (!run->peer_made) {
        ferry_engine_make_peer(engine, run->desc, run->desc_transport, &run->peer);
        if (FERRY_TRANSPORT_OPS_HAS(tp->ops, peer_cache_release))
            run->peer.cache = &run->batch->peer_caches[run->transport];
        run->peer_made = 1;
    }
    return tp->ops->submit(tp->ctx, &run->peer, first->slices);
}

/* Hand n requests of n_runs runs (consecutive records) to the same peer
 * through the same transport over in one submit, their slices chained:
 * one pass over the requests, what their slices share read once per run.
 * Non-OK: nothing was queued, nothing counted. */
static ferry_status_t submit_run(ferry_engine_t *engine, request_state_t *reqs, size_t n,
                                 size_t n_runs)
{
    request_run_t *first = reqs->run;
    ferry_status_t status = ferry_batch_run_copier_enter(engine, first, n_runs);
    if (status != FERRY_OK)
        return status; /* nothing counted */
    ferry_slice_t **tail = NULL;
    for (size_t i = 0; i < n && status == FERRY_OK;) {
        request_run_t *run = reqs[i].run;
        if (run->cut) { /* its chain is ready */
            if (tail != NULL)
                *tail = run->head;
            tail = &run->tail->next;
            i += run->n;
            continue;
        }
        slice_plan_t plan;
        ferry_batch_run_slice_plan(engine, run, &plan);
        for (; i < n && reqs[i].run == run; i++) {
            status = prepare_slices(engine, &reqs[i], &plan);
            if (status != FERRY_OK)
                break;
            if (tail != NULL)
                *tail = reqs[i].slices;
            tail = &reqs[i].slices[reqs[i].n_slices - 1].next;
        }
    }
    if (status == FERRY_OK)
        status = submit_slices(engine, &reqs[0]);
    if (status != FERRY_OK) {
        if (first->copier >= 0)
            ferry_segment_copier_exit(first->segment, first->copier, (unsigned)n_runs);
        for (size_t r = 0; r < n_runs; r++)
            first[r].copier = -1;
        for (size_t i = 0; i < n; i++)
            unstage(engine, &reqs[i]);
    }
    return status;
}

/* Count the request's run in and hand its slices to the transport; when
 * the segment changed since the request was resolved (its owner
 * invalidated it), resolve anew first, a few times at most.  The run is
 * the request's alone.  Non-OK: nothing queued, nothing counted. */
static ferry_status_t send_request(ferry_engine_t *engine, request_state_t *req)
{
    request_run_t *run = req->run;
    ferry_status_t status = ferry_batch_run_copier_enter(engine, run, 1);
    for (int tries = 0; status == FERRY_ERR_STALE && tries < 3; tries++) {
        status = ferry_batch_run_resolve_refreshed(engine, req);
        if (status == FERRY_OK)
            status = ferry_batch_run_copier_enter(engine, run, 1);
    }
    if (status != FERRY_OK)
        return status;
    if (slices_ready(req)) {
        slices_relink(req);
    } else {
        slice_plan_t plan;
        ferry_batch_run_slice_plan(engine, run, &plan);
        status = prepare_slices(engine, req, &plan);
    }
    if (status == FERRY_OK)
        status = submit_slices(engine, req);
    if (status != FERRY_OK) {
        ferry_batch_run_copier_leave(run);
        unstage(engine, req);
    }
    return status;
}

/* The transport took none of the request's slices (status): FERRY_OK when
 * a retry went out, else why the request FAILED. */
static ferry_status_t launch_refused(ferry_engine_t *engine, request_state_t *req,
                                     ferry_status_t status)
{
    request_run_t *run = req->run;
    if (status == FERRY_ERR_STALE || status == FERRY_ERR_PEER_FAILED ||
        status == FERRY_ERR_CONNECT) {
        /* The peer restarted or its link broke: drop that incarnation's
         * state, refresh the descriptor once and try again. */
        ferry_info("segment \"%s\" via %s: %s; refreshing and retrying once", run->desc->name,
                   transport_name(engine, run->transport), ferry_status_string(status));
        ferry_engine_forget_peer(engine, run->desc);
        ferry_status_t first = status;
        status = ferry_batch_run_resolve_refreshed(engine, req);
        if (status == FERRY_OK && run->transport < 0) {
            launch_local(engine, req);
            return FERRY_OK;
        }
        if (status == FERRY_OK) {
            status = send_request(engine, req);
        } else if (status != FERRY_ERR_OUT_OF_RANGE && status != FERRY_ERR_REMOTE_REFUSED &&
                   status != FERRY_ERR_UNSUPPORTED) {
            /* No fresh descriptor (a dead peer does not answer): what the
             * transport saw is the better reason. */
            ferry_info("segment \"%s\": refresh failed: %s", run->segment->name,
                       ferry_status_string(status));
            status = first;
        }
    }
    if (status != FERRY_OK) {
        ferry_error("request to segment \"%s\" [0x%llx, +%zu) failed: %s",
                    run->segment->name, (unsigned long long)req->one_slice.remote_addr,
                    req->one_slice.length,
                    ferry_status_string(status));
        ferry_batch_request_fail(req, status);
    }
    return status;
}

/* FERRY_OK when the request went out (or finished), else why it FAILED.
 * A request to a transport goes alone only when its run is its own (see
 * ferry_batch_runs_split). */
ferry_status_t ferry_batch_launch(ferry_engine_t *engine, request_state_t *req)
{
    atomic_store_explicit(&req->state, FERRY_XFER_PENDING, memory_order_release);
    if (req->run->transport < 0) {
        launch_local(engine, req);
        return FERRY_OK;
    }
    ferry_status_t status = send_request(engine, req);
    return status == FERRY_OK ? FERRY_OK : launch_refused(engine, req, status);
}

/* Consecutive runs to the same peer through the same transport go to the
 * transport in one submit: one connection lookup, one completion group
 * and one flush for all their requests instead of one per request.  Runs
 * the transport refuses as a whole take the one-by-one path (with its
 * refresh-and-retry), each request with a run of its own. */
static void launch_run(ferry_engine_t *engine, request_state_t *reqs, size_t n, size_t n_runs)
{
    if (submit_run(engine, reqs, n, n_runs) == FERRY_OK)
        return; /* the slices are the transport's now: reqs may finish any time */
    ferry_batch_runs_split(reqs->run->batch, reqs, n);
    for (size_t i = 0; i < n; i++) {
        ferry_status_t status = ferry_batch_launch(engine, &reqs[i]);
        if ((status == FERRY_ERR_PEER_FAILED || status == FERRY_ERR_CONNECT) && i + 1 < n) {
            /* The peer is gone even after a refresh: the rest of the run
             * goes to it too; fail it with one line, not a retry each. */
            ferry_error("%zu more request(s) to segment \"%s\" failed: %s", n - i - 1,
                        reqs[i].run->segment->name, ferry_status_string(status));
            for (size_t j = i + 1; j < n; j++)
                ferry_batch_request_fail(&reqs[j], status);
            return;
        }
    }
}

/* Runs whose requests go to the transport in one submit, counted in as
 * copiers of their segment at once. */
static int same_route(const request_run_t *a, const request_run_t *b)
{
    return a->transport >= 0 && a->transport == b->transport && a->desc == b->desc &&
           a->desc_transport == b->desc_transport && a->segment == b->segment &&
           a->desc_version == b->desc_version;
}

/* Launch the requests of this submit, from reqs on, whose runs are the
 * n_runs records from runs on. */
void ferry_batch_launch_all(ferry_engine_t *engine, request_state_t *reqs, request_run_t *runs,
                            size_t n_runs)
{
    request_state_t *req = reqs;
    for (size_t r = 0; r < n_runs;) {
        size_t n = runs[r].n, k = 1;
        while (r + k < n_runs && same_route(&runs[r], &runs[r + k]))
            n += runs[r + k++].n;
        if (n > 1 && runs[r].transport >= 0) {
            launch_run(engine, req, n, k);
        } else {
            for (size_t i = 0; i < n; i++)
                ferry_batch_launch(engine, &req[i]); /* a local copy, or one request alone */
        }
        req += n;
        r += k;
    }
}
