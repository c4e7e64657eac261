/*
 * Batches: submit resolves every request first (all or nothing), then
 * slices each request and hands the slices to its transport.  Completion
 * counts down per request and per batch, and only the batch's last
 * completion wakes a waiter, so a batch of many small requests costs one
 * wake-up.
 *
 * Consecutive requests of one submit to one buffer of a segment, by one
 * route, from one registered local buffer, form a run: they point at one
 * record (request_run_t) that holds their resolution and its references
 * once.  Resolving a request that continues a run writes its range and
 * little more; launch reads what the slices share once per run; completion
 * counts the run down and gives its holds back when it reaches zero.
 */
#include "core.h"

#include <errno.h>
#include <stddef.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/*
 * What a run of requests shares.  Its first request resolves it; the next
 * requests of the same submit join it (resolve_in_run); a request whose
 * transport refused its run, and which then goes alone, gets a record of
 * its own first (runs_split), so that a refresh or a retry changes the
 * resolution of that one request only.  What it holds, once for the run:
 * - desc: one reference, from resolve until the batch starts over or goes
 *   (runs_release);
 * - local_entry: one hold, until the run's last request finishes
 *   (settle_run) or its submit fails (runs_release);
 * - copier: one count in the segment's copiers, from launch until the
 *   run's last request finishes (or its launch is refused).
 * The records are the batch's (runs[], never more than its requests, in
 * the order of the requests) and are reused when it starts over, which it
 * does only when every request finished.
 */
typedef struct request_run {
    struct ferry_batch *batch;
    atomic_uint left;                  /* requests of the run not finished */
    unsigned n;                        /* requests in the run */
    ferry_segment_t *segment;
    ferry_descriptor_t *desc;
    uint64_t desc_version;             /* the segment's, with desc (0: none) */
    const ferry_desc_buffer_t *buffer; /* inside desc */
    ferry_opcode_t opcode;
    int transport;                     /* engine transport index, -1: local copy */
    int desc_transport;                /* index in desc->transports */
    int wanted;                        /* the requests' own transport, -1: none */
    int copier;                        /* counted in at segment (epoch), -1: not */
    int peer_made;                     /* peer: made at the run's first launch */
    /* Each request of the run is one slice, cut while it was resolved and
     * chained from head to tail (run_plan_cut): launch hands the chain
     * over as it is.  0: launch cuts them. */
    int cut;
    size_t cut_max;                    /* the longest request cut so */
    const char *remote_key;            /* what each cut slice has: the buffer's key */
    void *local_memh;                  /* and the local entry's handle */
    ferry_slice_t *head, *tail;
    ferry_reg_entry_t *local_entry;    /* NULL: unregistered local memory */
    /* The local buffer is device memory of this vendor (NULL: host).  When
     * the transport takes host memory only, each slice goes through a
     * staging buffer (the request's staged). */
    const ferry_accel_ops_t *local_accel;
    ferry_peer_t peer;                 /* the transport's view of the target */
    /* Statistics (stats.c): where its finished requests count (the
     * segment's peer entry, the engine's: it outlives the run; NULL: not
     * counted) and when its submit began. */
    ferry_peer_stats_t *stats;
    uint64_t submit_ns;
} request_run_t;

typedef struct request_state {
    /* What resolve writes and completion reads, in two cache lines (the
     * slot is aligned to them): one_slice first, as it holds the request's
     * own range (opcode aside, which is its run's), and the request's one
     * slice when it is one (a small request: no allocation); a staged
     * request's slices are many_slices, whatever their number.  owner is
     * the slot, set once. */
    _Alignas(64) ferry_slice_t one_slice;
    request_run_t *run;
    atomic_size_t slices_left;
    atomic_int error;      /* first failure, 0 if none */
    atomic_int state;      /* ferry_xfer_state_t */
    /* Each slice goes through a staging buffer: chunks[i] is slice i's,
     * from launch until its slice is done (or a refused submit gives it
     * back). */
    int staged;
    /* The slices stay with the slot while it holds the same resolution (a
     * request submitted again, submit_again): cut for slices_entry's
     * handles at the first launch; resolving anew clears it. */
    int slices_made;
    ferry_slice_t *slices; /* one_slice or many_slices */
    ferry_reg_entry_t *slices_entry;    /* compared, never dereferenced */
    size_t n_slices;
    ferry_slice_t *many_slices;         /* kept across submits of this slot */
    size_t many_cap;
    ferry_stage_chunk_t **chunks;
    size_t chunks_cap;
} request_state_t;
_Static_assert(offsetof(request_state_t, n_slices) + sizeof(size_t) <= 128,
               "what resolve and completion touch spans two cache lines");

struct ferry_batch {
    uint64_t handle;
    ferry_engine_t *engine;
    size_t max;
    request_state_t *requests;  /* [max] */
    size_t used;                /* submit_lock */
    request_run_t *runs;        /* [max] */
    size_t runs_used;           /* submit_lock; <= used */
    /* Submitted requests not finished (PENDING_COUNT) and PENDING_SLEEPER:
     * a thread in ferry_batch_wait may sleep on this word (a futex).  One
     * word, so that the countdown which finishes the batch is the
     * finisher's last touch of it: a caller that sees the count at 0 may
     * destroy the batch at once (the wake that may follow reads nothing). */
    atomic_uint pending;
    ferry_lock_t submit_lock;   /* used, requests[] and runs[] setup, notify fields */
    ferry_descriptor_t *notify_desc; /* attached notify, sent once the batch completes */
    /* What ferry_batch_wait needs to know without submit_lock: a request of
     * this round failed; a notify is attached. */
    atomic_int any_failed;
    atomic_int notify_attached;
    void *notify_msg;
    size_t notify_length;
    /* During a submit (submit_lock): the previous round's last descriptor,
     * kept for the first request if its segment still shows it. */
    ferry_segment_t *kept_segment; /* compared, never dereferenced */
    ferry_descriptor_t *kept_desc;
    uint64_t kept_version;
    uint64_t submit_ns; /* submit_lock: the current submit's start, for its runs */
    /* The local registry entry of the last request resolved, unreferenced:
     * unregistering clears it (ferry_batch_forget_entry) before the entry
     * can go, so while it is set it points at a live entry. */
    ferry_reg_entry_t *kept_entry;
    /* submit_lock: what each transport keeps for this batch's next submit
     * (ferry_peer_t.cache), released through peer_cache_release. */
    void *peer_caches[FERRY_MAX_TRANSPORTS];
    struct ferry_batch *next;   /* engine->batches_lock */
};

static const char *transport_name(const ferry_engine_t *engine, int transport)
{
    return transport < 0 ? FERRY_LOCAL_TRANSPORT_NAME : engine->transports[transport].plugin->name;
}

#define PENDING_SLEEPER 0x80000000u
#define PENDING_COUNT(word) ((word) & ~PENDING_SLEEPER)

static unsigned batch_pending(ferry_batch_t *batch)
{
    return PENDING_COUNT(atomic_load_explicit(&batch->pending, memory_order_acquire));
}

/* The run no longer counts among its segment's copiers (see
 * copier_enter). */
static void copier_leave(request_run_t *run)
{
    if (run->copier >= 0)
        ferry_segment_copier_exit(run->segment, run->copier, 1);
    run->copier = -1;
}

/*
 * Requests finished by one completion call, settled together: the
 * requests of one run count the run down with one move, and the batch's
 * pending count moves once for all of its requests.  The batch's countdown
 * comes last: it is the finisher's last touch of the batch and of its runs
 * (a waiter that sees it reach 0 may destroy it or start it over).
 */
typedef struct settle {
    ferry_batch_t *batch;
    unsigned pending;
    request_run_t *run;
    unsigned run_done;
    unsigned run_failed;  /* of run_done: for the statistics */
    uint64_t run_bytes;   /* moved by the others */
} settle_t;

/* s's run_done requests of s's run finished: the run's last ones give
 * back what the run holds. */
static void settle_run(settle_t *s)
{
    request_run_t *run = s->run;
    unsigned done = s->run_done;
    if (done == 0)
        return;
    s->run_done = 0;
    /* Before the run's countdown: past it a waiter may reuse the record. */
    if (run->stats != NULL)
        ferry_stats_count(run->stats, run->transport, done, s->run_failed, s->run_bytes,
                          run->submit_ns);
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
    copier_leave(run);
}

static void settle_all(settle_t *s)
{
    settle_run(s);
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
        if (s->batch != run->batch) {
            settle_all(s);
            s->batch = run->batch;
        } else {
            settle_run(s);
        }
        s->run = run;
    }
    s->run_done++;
    int error = atomic_load_explicit(&req->error, memory_order_relaxed);
    s->run_failed += error != 0;
    s->run_bytes += error ? 0 : req->one_slice.length;
    /* Plain (release) stores, no locked instruction: the countdown of
     * pending in settle_all publishes them to whoever sees it reach 0. */
    atomic_store_explicit(&req->state, error ? FERRY_XFER_FAILED : FERRY_XFER_COMPLETED,
                          memory_order_release);
    if (error)
        atomic_store_explicit(&run->batch->any_failed, 1, memory_order_release);
    s->pending++;
}

/* A request that finishes alone (a local copy, a failure in submit). */
static void request_finish_alone(request_state_t *req)
{
    settle_t s = {0};
    request_finish(req, &s);
    settle_all(&s);
}

static void request_fail(request_state_t *req, ferry_status_t status)
{
    int expected = 0;
    atomic_compare_exchange_strong(&req->error, &expected, (int)status);
    request_finish_alone(req);
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
            if (result != FERRY_OK) {
                int expected = 0;
                atomic_compare_exchange_strong(&req->error, &expected, (int)result);
            }
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
static ferry_status_t resolve_refreshed(ferry_engine_t *engine, request_state_t *req)
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
static inline ferry_reg_entry_t *local_entry(ferry_engine_t *engine, const request_state_t *req,
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
static const ferry_accel_ops_t *local_memory(const ferry_engine_t *engine,
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

/* The request's one slice, the slot's own storage (no allocation), cut
 * for the run's resolution and local entry (slices_made). */
static inline void slice_cut_one(request_state_t *req, const request_run_t *run)
{
    ferry_slice_t *slice = &req->one_slice; /* its range is the request's already */
    slice->opcode = run->opcode;
    slice->remote_key = run->remote_key;
    slice->local_memh = run->local_memh;
    slice->local_device = run->local_accel != NULL;
    slice->next = NULL;
    req->slices = slice;
    req->n_slices = 1;
    req->slices_entry = run->local_entry;
    req->slices_made = 1;
    atomic_store_explicit(&req->slices_left, 1, memory_order_relaxed);
}

/* What a run's slices share, read once per run at launch. */
typedef struct slice_plan {
    int staged;        /* the local buffer is device memory the transport does not take */
    size_t slice_size; /* the transport's, 0: no slicing */
    const char *remote_key;
    void *local_memh;
} slice_plan_t;

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

static void slice_plan_of(const ferry_engine_t *engine, const request_run_t *run,
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
    slice_plan_of(engine, run, &plan);
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
    run->desc = NULL; /* with local_entry: what runs_release reads */
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
    run->submit_ns = batch->submit_ns;
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
        status = resolve_refreshed(engine, req);
    }
    if (status == FERRY_ERR_OUT_OF_RANGE)
        ferry_error("segment \"%s\" has no buffer holding [0x%llx, +%zu)", run->segment->name,
                    (unsigned long long)req->one_slice.remote_addr, req->one_slice.length);
    if (status == FERRY_OK && (run->local_entry = local_entry(engine, req, prev, owed)) != NULL)
        batch->kept_entry = run->local_entry;
    if (status == FERRY_OK) {
        run->local_accel = local_memory(engine, run, req->one_slice.local);
        run_plan_cut(engine, run, req);
    }
    return status;
}

/* Drop what count runs hold (a run whose requests all finished holds its
 * descriptor only): one atomic per sequence of runs that share a
 * descriptor. */
static void runs_release(ferry_engine_t *engine, request_run_t *runs, size_t count)
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

/* Our own segment: a bounds-checked copy, done now. */
static void launch_local(ferry_engine_t *engine, request_state_t *req)
{
    const request_run_t *run = req->run;
    ferry_access_t access = run->opcode == FERRY_OP_WRITE ? FERRY_ACCESS_WRITE
                                                          : FERRY_ACCESS_READ;
    void *token;
    ferry_status_t status = ferry_engine_access_acquire(engine, req->one_slice.remote_addr,
                                                        req->one_slice.length, access, &token);
    if (status == FERRY_OK) {
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
        request_finish_alone(req);
    else
        request_fail(req, status);
}

/* A one-sided transport copies with no check by the target: runs count
 * among their segment's copiers, so that an invalidation by the owner
 * waits for them, and go out only while the descriptor they were resolved
 * with is still the segment's (FERRY_ERR_STALE: resolve again, nothing
 * counted).  n runs of one route from run on (same_route): one count each,
 * entered at once. */
static ferry_status_t copier_enter(ferry_engine_t *engine, request_run_t *run, size_t n)
{
    if (!engine->transports[run->transport].one_sided)
        return FERRY_OK;
    ferry_status_t status = ferry_segment_copier_enter(run->segment, run->desc_version,
                                                       (unsigned)n, &run->copier);
    for (size_t i = 1; i < n && status == FERRY_OK; i++)
        run[i].copier = run->copier;
    return status;
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
    if (req->slices_made && req->slices_entry == run->local_entry) {
        for (size_t i = 0; i < req->n_slices; i++)
            req->slices[i].next = i + 1 < req->n_slices ? &req->slices[i + 1] : NULL;
        atomic_store_explicit(&req->slices_left, req->n_slices, memory_order_release);
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
    ferry_status_t status = copier_enter(engine, first, n_runs);
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
        slice_plan_of(engine, run, &plan);
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
    ferry_status_t status = copier_enter(engine, run, 1);
    for (int tries = 0; status == FERRY_ERR_STALE && tries < 3; tries++) {
        status = resolve_refreshed(engine, req);
        if (status == FERRY_OK)
            status = copier_enter(engine, run, 1);
    }
    if (status != FERRY_OK)
        return status;
    slice_plan_t plan;
    slice_plan_of(engine, run, &plan);
    status = prepare_slices(engine, req, &plan);
    if (status == FERRY_OK)
        status = submit_slices(engine, req);
    if (status != FERRY_OK) {
        copier_leave(run);
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
        status = resolve_refreshed(engine, req);
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
        request_fail(req, status);
    }
    return status;
}

/* FERRY_OK when the request went out (or finished), else why it FAILED.
 * A request to a transport goes alone only when its run is its own (see
 * runs_split). */
static ferry_status_t launch(ferry_engine_t *engine, request_state_t *req)
{
    atomic_store_explicit(&req->state, FERRY_XFER_PENDING, memory_order_release);
    if (req->run->transport < 0) {
        launch_local(engine, req);
        return FERRY_OK;
    }
    ferry_status_t status = send_request(engine, req);
    return status == FERRY_OK ? FERRY_OK : launch_refused(engine, req, status);
}

/*
 * n requests (whole runs, none of them in flight) go alone: each gets a
 * run of its own, so that a refresh or a retry changes that request's
 * resolution only.  Each new record takes its
 * own references (the request's share of the run's); the first request of
 * a run keeps the record.  A request gets at most one new record and only
 * when it shared one, so the batch never has more records than requests.
 */
static void runs_split(ferry_batch_t *batch, request_state_t *reqs, size_t n)
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

/* Consecutive runs to the same peer through the same transport go to the
 * transport in one submit: one connection lookup, one completion group
 * and one flush for all their requests instead of one per request.  Runs
 * the transport refuses as a whole take the one-by-one path (with its
 * refresh-and-retry), each request with a run of its own. */
static void launch_run(ferry_engine_t *engine, request_state_t *reqs, size_t n, size_t n_runs)
{
    if (submit_run(engine, reqs, n, n_runs) == FERRY_OK)
        return; /* the slices are the transport's now: reqs may finish any time */
    runs_split(reqs->run->batch, reqs, n);
    for (size_t i = 0; i < n; i++) {
        ferry_status_t status = launch(engine, &reqs[i]);
        if ((status == FERRY_ERR_PEER_FAILED || status == FERRY_ERR_CONNECT) && i + 1 < n) {
            /* The peer is gone even after a refresh: the rest of the run
             * goes to it too; fail it with one line, not a retry each. */
            ferry_error("%zu more request(s) to segment \"%s\" failed: %s", n - i - 1,
                        reqs[i].run->segment->name, ferry_status_string(status));
            for (size_t j = i + 1; j < n; j++)
                request_fail(&reqs[j], status);
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
static void launch_all(ferry_engine_t *engine, request_state_t *reqs, request_run_t *runs,
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
                launch(engine, &req[i]); /* a local copy, or one request alone */
        }
        req += n;
        r += k;
    }
}

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
    if ((run->local_entry = local_entry(engine, req, NULL, NULL)) != NULL) /* owes nothing */
        batch->kept_entry = run->local_entry;
    run->local_accel = local_memory(engine, run, req->one_slice.local);
    atomic_store_explicit(&run->left, 1, memory_order_relaxed);
    run->submit_ns = batch->submit_ns;
    atomic_store_explicit(&batch->pending, 1, memory_order_release);
    launch(engine, req); /* its slices are relinked, not cut again (prepare_slices) */
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
    batch->submit_ns = engine->stats.enabled ? ferry_stats_now_ns() : 0;
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
        runs_release(engine, batch->runs, batch->runs_used);
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
    owed_t owed = {0};
    for (size_t i = 0; i < count; i++) {
        status = resolve(batch, &requests[i], &reqs[i], i > 0 ? reqs[i - 1].run : NULL,
                         i > 0 && requests[i].target == requests[i - 1].target, &owed);
        if (status != FERRY_OK) {
            owed_take(&owed);
            runs_release(engine, &batch->runs[first_run], batch->runs_used - first_run);
            batch->runs_used = first_run;
            goto out_unlock;
        }
    }
    owed_take(&owed);
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
    launch_all(engine, reqs, runs, n_runs);
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

/* Before sleeping, poll the transports that can progress on our thread: a
 * short request then completes here, without the wakeup of a handoff from
 * the transport's thread (tens of microseconds on a busy host). */
static void drive_progress(ferry_batch_t *batch, int timeout_ms)
{
    ferry_engine_t *engine = batch->engine;
    uint64_t spin_us = engine->settings.wait_spin_us;
    if (engine->n_progress == 0 || spin_us == 0)
        return;
    if (timeout_ms >= 0 && spin_us > (uint64_t)timeout_ms * 1000u)
        spin_us = (uint64_t)timeout_ms * 1000u;
    uint64_t start = ferry_time_us();
    while (batch_pending(batch) > 0 && ferry_time_us() - start < spin_us)
        for (size_t i = 0; i < engine->n_progress; i++)
            engine->progress[i]->ops->progress(engine->progress[i]->ctx);
}

/* Sleep on the pending word until its count is 0 (FERRY_ERR_TIMEOUT after
 * timeout_ms, unless negative).  The sleeper bit is set before sleeping, so
 * the finisher that counts down to 0 sees it and wakes us. */
static ferry_status_t sleep_until_done(ferry_batch_t *batch, int timeout_ms)
{
    struct timespec deadline;
    if (timeout_ms >= 0)
        ferry_deadline_after_ms(&deadline, CLOCK_MONOTONIC, (unsigned)timeout_ms);
    unsigned word = atomic_load_explicit(&batch->pending, memory_order_acquire);
    while (PENDING_COUNT(word) > 0) {
        if (!(word & PENDING_SLEEPER) &&
            !atomic_compare_exchange_weak_explicit(&batch->pending, &word,
                                                   word | PENDING_SLEEPER,
                                                   memory_order_acquire,
                                                   memory_order_acquire))
            continue; /* word is the new value */
        if (ferry_futex_wait(&batch->pending, word | PENDING_SLEEPER,
                             timeout_ms >= 0 ? &deadline : NULL) == ETIMEDOUT &&
            batch_pending(batch) > 0)
            return FERRY_ERR_TIMEOUT;
        word = atomic_load_explicit(&batch->pending, memory_order_acquire);
    }
    return FERRY_OK;
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
    runs_release(batch->engine, batch->runs, batch->runs_used);
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
    peer_caches_release(batch);
    batch_free(batch);
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
