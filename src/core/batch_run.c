/*
 * The run record of a batch (batch.h).
 *
 * Consecutive requests of one submit to one buffer of a segment, by one
 * route, from one registered local buffer, form a run: they point at one
 * record (request_run_t) that holds their resolution and its references
 * once.  Resolving a request that continues a run writes its range and
 * little more; launch reads what the slices share once per run; completion
 * counts the run down and gives its holds back when it reaches zero.
 */
#include "batch.h"

#include <stdint.h>

/* The run no longer counts among its segment's copiers (see
 * ferry_batch_run_copier_enter). */
void ferry_batch_run_copier_leave(request_run_t *run)
{
    if (run->copier >= 0)
        ferry_segment_copier_exit(run->segment, run->copier, 1);
    run->copier = -1;
}

/* s's run_done requests of s's run finished: the run's last ones give
 * back what the run holds. */
void ferry_batch_run_settle(settle_t *s)
{
    request_run_t *run = s->run;
    unsigned done = s->run_done;
    if (done == 0)
        return;
    s->run_done = 0;
    /* Before the run's countdown: past it a waiter may reuse the record. */
    if (run->stats != NULL)
        ferry_stats_count(run->stats, run->transport, done, s->run_failed, s->run_bytes,
                          run->submit_ticks);
    s->run_failed = 0;
    s->run_bytes = 0;
    /* Holding the last requests left, nobody else counts down: no locked
     * instruction (a run finished by one completion call). */
    if (atomic_load_explicit(&run->left, memory_order_acquire) != done &&
        atomic_fetch_sub_explicit(&run->left, done, memory_order_acq_rel) != done)
        return;
    if (run->local_entry != NULL)
        ferry_registry_release(&run->batch->engine->registry, run->local_entry);
    run->local_entry = NULL;
    ferry_batch_run_copier_leave(run);
}

/* Find the target buffer of [remote_addr, +length) and a transport in the
 * run's descriptor; FERRY_ERR_OUT_OF_RANGE if the range is not there, so
 * the caller can refresh once. */
static ferry_status_t resolve_in(ferry_engine_t *engine, request_run_t *run,
                                 uint64_t remote_addr, size_t length)
{
    const ferry_descriptor_t *desc = run->desc;
    run->buffer = ferry_descriptor_find(desc, remote_addr, length);
    if (run->buffer == NULL)
        return FERRY_ERR_OUT_OF_RANGE;
    unsigned need = run->opcode == FERRY_OP_WRITE ? FERRY_REG_REMOTE_WRITE
                                                  : FERRY_REG_REMOTE_READ;
    if ((run->buffer->access & need) == 0) {
        ferry_error("segment \"%s\" buffer 0x%llx is not remote-%s", desc->name,
                    (unsigned long long)run->buffer->addr,
                    need == FERRY_REG_REMOTE_WRITE ? "writable" : "readable");
        return FERRY_ERR_REMOTE_REFUSED;
    }
    if (run->segment->is_local) {
        run->transport = -1;
        run->desc_transport = -1;
        return FERRY_OK;
    }
    if (run->wanted >= 0) {
        /* The request named its transport: that one or none (a fallback
         * reach counts, the caller asked for it). */
        int reach;
        const char *why = ferry_engine_transport_reach(engine, (size_t)run->wanted, desc,
                                                       run->buffer, &reach,
                                                       &run->desc_transport);
        if (why != NULL) {
            ferry_error("segment \"%s\" buffer 0x%llx: the request asks for transport %s, "
                        "but %s", desc->name, (unsigned long long)run->buffer->addr,
                        transport_name(engine, run->wanted), why);
            return FERRY_ERR_UNSUPPORTED;
        }
        run->transport = run->wanted;
        return FERRY_OK;
    }
    atomic_int *route = &((ferry_desc_buffer_t *)run->buffer)->route;
    int known = atomic_load_explicit(route, memory_order_relaxed);
    if (known != 0) {
        run->transport = (known & 0xffff) - 1;
        run->desc_transport = (known >> 16) - 1;
        return FERRY_OK;
    }
    run->transport = ferry_engine_select_transport(engine, desc, run->buffer,
                                                   &run->desc_transport);
    if (run->transport >= 0)
        atomic_store_explicit(route, (run->transport + 1) | (run->desc_transport + 1) << 16,
                              memory_order_relaxed);
    if (run->transport < 0) {
        ferry_error("segment \"%s\": no transport enabled on both sides reaches buffer 0x%llx",
                    desc->name, (unsigned long long)run->buffer->addr);
        return FERRY_ERR_UNSUPPORTED;
    }
    return FERRY_OK;
}


/*
 * The references a new run takes on what it shares with the run before it
 * (its descriptor, its local registry entry), owed while resolving and
 * taken with one atomic per sequence of runs that share them.  The first
 * of them holds a real reference meanwhile, so what is owed cannot go
 * before it is taken; owed_take runs before anything could drop a
 * reference (a refresh, an error's cleanup) and before launch.
 */
typedef struct owed {
    ferry_descriptor_t *desc;
    unsigned desc_refs;
    ferry_reg_entry_t *entry;
    unsigned entry_holds;
} owed_t;

static void owed_take(owed_t *owed)
{
    if (owed->desc_refs > 0) /* the run's first request holds it */
        ferry_descriptor_ref_n(owed->desc, owed->desc_refs);
    if (owed->entry_holds > 0)
        ferry_reg_entry_hold_more(owed->entry, owed->entry_holds);
    owed->desc_refs = owed->entry_holds = 0;
}

static void owe_desc(owed_t *owed, ferry_descriptor_t *desc)
{
    if (owed->desc_refs > 0 && owed->desc != desc)
        owed_take(owed);
    owed->desc = desc;
    owed->desc_refs++;
}

static void owe_entry(owed_t *owed, ferry_reg_entry_t *entry)
{
    if (owed->entry_holds > 0 && owed->entry != entry)
        owed_take(owed);
    owed->entry = entry;
    owed->entry_holds++;
}

/* Re-read the segment's descriptor (refreshing it once) and resolve the
 * request's run again; the run is the request's alone. */
ferry_status_t ferry_batch_run_resolve_refreshed(ferry_engine_t *engine, request_state_t *req)
{
    request_run_t *run = req->run;
    ferry_status_t status = ferry_segment_refetch(engine, run->segment, run->desc);
    if (status != FERRY_OK)
        return status;
    ferry_descriptor_unref(run->desc);
    run->desc = NULL;
    req->slices_made = run->peer_made = 0;
    status = ferry_segment_descriptor_versioned(engine, run->segment, &run->desc,
                                                &run->desc_version);
    if (status != FERRY_OK)
        return status;
    return resolve_in(engine, run, req->one_slice.remote_addr, req->one_slice.length);
}

/* Whether [addr, +length) lies inside [start, +size). */
static int range_within(uint64_t addr, uint64_t length, uint64_t start, uint64_t size)
{
    return addr >= start && length <= size && addr - start <= size - length;
}

/* The local buffer's registry entry when the previous run's does not
 * hold it: the batch's last one (see kept_entry) if it does, so that a
 * ping-pong's every write needs no lookup and no lock; else a lookup. */
static ferry_reg_entry_t *local_entry_found(ferry_engine_t *engine, const request_state_t *req)
{
    uintptr_t addr = (uintptr_t)req->one_slice.local;
    ferry_reg_entry_t *entry = req->run->batch->kept_entry;
    if (entry != NULL && range_within(addr, req->one_slice.length, entry->addr, entry->length) &&
        ferry_reg_entry_hold(entry))
        return entry;
    return ferry_registry_acquire(&engine->registry, addr, req->one_slice.length, 0);
}

/* The local buffer's registry entry, held for the request's run: the
 * previous run's when it holds this range too (its hold keeps the entry
 * alive; ours is owed), so that runs from one buffer need no lookup, no
 * lock and no atomic each. */
ferry_reg_entry_t *ferry_batch_run_local_entry(ferry_engine_t *engine, const request_state_t *req,
                                               const request_run_t *prev, owed_t *owed)
{
    ferry_reg_entry_t *entry = prev ? prev->local_entry : NULL;
    /* As ferry_reg_entry_hold: no new hold once unregister began. */
    if (entry != NULL &&
        range_within((uintptr_t)req->one_slice.local, req->one_slice.length, entry->addr,
                     entry->length) &&
        !(atomic_load_explicit(&entry->holds, memory_order_relaxed) & FERRY_REG_DYING)) {
        owe_entry(owed, entry);
        return entry;
    }
    return local_entry_found(engine, req);
}

/* The vendor of the local buffer's device memory, NULL for host memory:
 * its registration says, else (when accelerators are in use) its pointer. */
const ferry_accel_ops_t *ferry_batch_run_local_memory(const ferry_engine_t *engine,
                                                      const request_run_t *run, void *local)
{
    if (run->local_entry != NULL)
        return run->local_entry->accel;
    ferry_accel_range_t range;
    return engine->n_accel ? ferry_engine_accel_query(engine, local, &range) : NULL;
}

/* The previous run's resolution holds for this one too (same descriptor,
 * operation and choice of transport, a range inside the same buffer): no
 * search, no selection. */
static int resolve_as_prev(request_run_t *run, const request_state_t *req,
                           const request_run_t *prev)
{
    if (prev == NULL || prev->desc != run->desc || prev->buffer == NULL ||
        prev->opcode != run->opcode || prev->wanted != run->wanted ||
        !range_within(req->one_slice.remote_addr, req->one_slice.length, prev->buffer->addr,
                      prev->buffer->length))
        return 0;
    run->buffer = prev->buffer;
    run->transport = prev->transport;
    run->desc_transport = prev->desc_transport;
    return 1;
}

/* Whether the run's local buffer is device memory its transport does not
 * take (it is staged). */
static int needs_staging(const ferry_engine_t *engine, const request_run_t *run)
{
    if (run->local_accel == NULL)
        return 0;
    unsigned takes = engine->transports[run->transport].local_device;
    for (size_t a = 0; a < engine->n_accel; a++)
        if (engine->accel[a] == run->local_accel)
            return (takes & (1u << a)) == 0;
    return 1;
}

void ferry_batch_run_slice_plan(const ferry_engine_t *engine, const request_run_t *run,
                                slice_plan_t *plan)
{
    plan->staged = needs_staging(engine, run);
    plan->slice_size = engine->transports[run->transport].slice_size;
    plan->remote_key = run->buffer->keys[run->desc_transport];
    plan->local_memh = run->local_entry ? run->local_entry->memh[run->transport] : NULL;
}

/* A run to a transport whose requests are each one slice, not staged,
 * has them cut while resolving (the first one now, each that joins the
 * run as it does), chained in order: launch then hands the chain over
 * without another pass over the requests. */
static void run_plan_cut(const ferry_engine_t *engine, request_run_t *run, request_state_t *req)
{
    if (run->transport < 0)
        return;
    slice_plan_t plan;
    ferry_batch_run_slice_plan(engine, run, &plan);
    if (plan.staged || (plan.slice_size != 0 && plan.slice_size < req->one_slice.length))
        return;
    run->cut = 1;
    run->cut_max = plan.slice_size != 0 ? plan.slice_size : SIZE_MAX;
    run->remote_key = plan.remote_key;
    run->local_memh = plan.local_memh;
    slice_cut_one(req, run);
    run->head = run->tail = &req->one_slice;
}

/*
 * The request continues run (the previous request's): the same segment
 * handle, operation and choice of transport, its target range inside the
 * run's buffer and its local range inside the run's registered buffer.  It
 * joins the run: it writes its range and its state, and shares the run's
 * resolution and references (no lookup, no search, no atomic).  0: it does
 * not (or the run has no registry entry to share), nothing written;
 * resolve's steps decide.
 */
static inline int resolve_in_run(const ferry_request_t *in, request_state_t *req,
                                 request_run_t *run)
{
    const ferry_desc_buffer_t *buffer = run->buffer;
    ferry_reg_entry_t *entry = run->local_entry;
    /* range_within also rules a zero length or a wrap-around out: both
     * ranges end inside a buffer that does not wrap. */
    if (run->desc == NULL || buffer == NULL || entry == NULL || in->opcode != run->opcode ||
        in->transport != NULL || run->wanted >= 0 || in->local == NULL || in->length == 0 ||
        !range_within(in->target_offset, in->length, buffer->addr, buffer->length) ||
        !range_within((uintptr_t)in->local, in->length, entry->addr, entry->length) ||
        /* As ferry_reg_entry_hold: no run joined once unregister began. */
        (atomic_load_explicit(&entry->holds, memory_order_relaxed) & FERRY_REG_DYING) ||
        (run->cut && in->length > run->cut_max))
        return 0;
    run->n++;
    req->run = run;
    atomic_init(&req->error, 0);
    /* PENDING from here: ferry_batch_status sees the request only once the
     * submit, its launch included, released submit_lock. */
    atomic_init(&req->state, FERRY_XFER_PENDING);
    req->staged = 0;
    req->one_slice.local = in->local;
    req->one_slice.remote_addr = in->target_offset;
    req->one_slice.length = in->length;
    if (run->cut) {
        slice_cut_one(req, run);
        run->tail->next = &req->one_slice;
        run->tail = &req->one_slice;
    } else {
        req->slices_made = 0; /* cut at launch, as anew */
    }
    return 1;
}

/* A new run record, nothing resolved, nothing held. */
static request_run_t *run_new(ferry_batch_t *batch)
{
    request_run_t *run = &batch->runs[batch->runs_used++];
    run->batch = batch;
    run->n = 1;
    run->desc = NULL; /* with local_entry: what ferry_batch_runs_release reads */
    run->desc_version = 0;
    run->buffer = NULL;
    run->local_entry = NULL;
    run->local_accel = NULL;
    run->transport = run->desc_transport = -1;
    run->wanted = -1;
    run->copier = -1;
    run->peer_made = 0;
    run->cut = 0;
    run->stats = NULL; /* resolve sets it with the segment */
    run->submit_ticks = batch->submit_ticks;
    return run;
}

/* prev: the run of the request resolved just before in the same submit,
 * or NULL; same_target: in names prev's segment handle again. */
static ferry_status_t resolve(ferry_batch_t *batch, const ferry_request_t *in,
                              request_state_t *req, request_run_t *prev, int same_target,
                              owed_t *owed)
{
    if (same_target && prev != NULL && resolve_in_run(in, req, prev))
        return FERRY_OK;
    ferry_engine_t *engine = batch->engine;
    /* Field by field (the rest are set below before use), not a memset:
     * many_slices and chunks stay, they are the slot's. */
    request_run_t *run = run_new(batch);
    req->run = run;
    atomic_init(&req->slices_left, 0);
    atomic_init(&req->error, 0);
    atomic_init(&req->state, FERRY_XFER_PENDING); /* see resolve_in_run */
    req->staged = 0;
    req->slices_made = 0;
    if ((in->opcode != FERRY_OP_READ && in->opcode != FERRY_OP_WRITE) || in->local == NULL ||
        in->length == 0 || in->target_offset + in->length < in->target_offset) {
        ferry_error("request: bad opcode, NULL local buffer, zero length or wrap-around");
        return FERRY_ERR_INVALID_PARAM;
    }
    /* The handle prev's lookup validated, named again: the same segment. */
    run->segment = same_target && prev != NULL
                       ? prev->segment
                       : ferry_handle_lookup((uint64_t)(uintptr_t)in->target,
                                             FERRY_HANDLE_SEGMENT, engine);
    if (run->segment == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    run->stats = run->segment->stats;
    run->opcode = in->opcode;
    req->one_slice.local = in->local;
    req->one_slice.remote_addr = in->target_offset;
    req->one_slice.length = in->length;
    if (in->transport != NULL &&
        (run->wanted = ferry_engine_transport_index(engine, in->transport)) < 0) {
        ferry_error("request: transport \"%s\" is not enabled in this engine", in->transport);
        return FERRY_ERR_UNSUPPORTED;
    }
    /* One submit sees one descriptor per segment: runs to one segment
     * share the first one's (no segment lock per run, one reference count
     * for them), and the first one takes the previous round's if the
     * segment still shows it (no lock, no reference counting: a
     * ping-pong's every write). */
    ferry_status_t status = FERRY_OK;
    if (prev != NULL && prev->segment == run->segment && prev->desc != NULL) {
        run->desc = prev->desc;
        run->desc_version = prev->desc_version;
        owe_desc(owed, run->desc);
    } else if (prev == NULL && batch->kept_desc != NULL && batch->kept_segment == run->segment &&
               ferry_segment_still_current(run->segment, batch->kept_version)) {
        run->desc = batch->kept_desc;
        run->desc_version = batch->kept_version;
        batch->kept_desc = NULL;
    } else {
        status = ferry_segment_descriptor_versioned(engine, run->segment, &run->desc,
                                                    &run->desc_version);
    }
    if (status != FERRY_OK)
        return status;
    if (!resolve_as_prev(run, req, prev))
        status = resolve_in(engine, run, req->one_slice.remote_addr, req->one_slice.length);
    if (status == FERRY_ERR_OUT_OF_RANGE) {
        owed_take(owed); /* the refresh drops this run's reference */
        status = ferry_batch_run_resolve_refreshed(engine, req);
    }
    if (status == FERRY_ERR_OUT_OF_RANGE)
        ferry_error("segment \"%s\" has no buffer holding [0x%llx, +%zu)", run->segment->name,
                    (unsigned long long)req->one_slice.remote_addr, req->one_slice.length);
    if (status == FERRY_OK &&
        (run->local_entry = ferry_batch_run_local_entry(engine, req, prev, owed)) != NULL)
        batch->kept_entry = run->local_entry;
    if (status == FERRY_OK) {
        run->local_accel = ferry_batch_run_local_memory(engine, run, req->one_slice.local);
        run_plan_cut(engine, run, req);
    }
    return status;
}

/* Drop what count runs hold (a run whose requests all finished holds its
 * descriptor only): one atomic per sequence of runs that share a
 * descriptor. */
void ferry_batch_runs_release(ferry_engine_t *engine, request_run_t *runs, size_t count)
{
    ferry_descriptor_t *desc = NULL;
    unsigned refs = 0;
    for (size_t i = 0; i <= count; i++) {
        ferry_descriptor_t *next = i < count ? runs[i].desc : NULL;
        if (next != desc && refs > 0) {
            ferry_descriptor_unref_n(desc, refs);
            refs = 0;
        }
        if (i == count)
            break;
        desc = next;
        refs += next != NULL;
        if (runs[i].local_entry)
            ferry_registry_release(&engine->registry, runs[i].local_entry);
        runs[i].local_entry = NULL;
        runs[i].desc = NULL;
    }
}

ferry_status_t ferry_batch_resolve_all(ferry_batch_t *batch, const ferry_request_t *requests,
                                       request_state_t *reqs, size_t count)
{
    size_t first_run = batch->runs_used;
    owed_t owed = {0};
    for (size_t i = 0; i < count; i++) {
        ferry_status_t status = resolve(batch, &requests[i], &reqs[i],
                                        i > 0 ? reqs[i - 1].run : NULL,
                                        i > 0 && requests[i].target == requests[i - 1].target,
                                        &owed);
        if (status != FERRY_OK) {
            owed_take(&owed);
            ferry_batch_runs_release(batch->engine, &batch->runs[first_run],
                                     batch->runs_used - first_run);
            batch->runs_used = first_run;
            return status;
        }
    }
    owed_take(&owed);
    return FERRY_OK;
}

/* A one-sided transport copies with no check by the target: runs count
 * among their segment's copiers, so that an invalidation by the owner
 * waits for them, and go out only while the descriptor they were resolved
 * with is still the segment's (FERRY_ERR_STALE: resolve again, nothing
 * counted).  n runs of one route from run on (same_route): one count each,
 * entered at once. */
ferry_status_t ferry_batch_run_copier_enter(ferry_engine_t *engine, request_run_t *run, size_t n)
{
    if (!engine->transports[run->transport].one_sided)
        return FERRY_OK;
    ferry_status_t status = ferry_segment_copier_enter(run->segment, run->desc_version,
                                                       (unsigned)n, &run->copier);
    for (size_t i = 1; i < n && status == FERRY_OK; i++)
        run[i].copier = run->copier;
    return status;
}

/*
 * n requests (whole runs, none of them in flight) go alone: each gets a
 * run of its own, so that a refresh or a retry changes that request's
 * resolution only.  Each new record takes its
 * own references (the request's share of the run's); the first request of
 * a run keeps the record.  A request gets at most one new record and only
 * when it shared one, so the batch never has more records than requests.
 */
void ferry_batch_runs_split(ferry_batch_t *batch, request_state_t *reqs, size_t n)
{
    /* From the end: reqs[i - 1].run is still the shared record. */
    for (size_t i = n - 1; i > 0; i--) {
        request_run_t *shared = reqs[i].run;
        if (shared != reqs[i - 1].run)
            continue;
        request_run_t *own = &batch->runs[batch->runs_used++];
        *own = *shared;
        own->n = 1;
        own->peer_made = 0;
        own->cut = shared->cut = 0; /* each request is launched alone, relinked */
        atomic_init(&own->left, 1);
        ferry_descriptor_ref_n(own->desc, 1);
        if (own->local_entry != NULL)
            ferry_reg_entry_hold_more(own->local_entry, 1);
        shared->n--;
        atomic_store_explicit(&shared->left, shared->n, memory_order_relaxed);
        reqs[i].run = own;
    }
}
