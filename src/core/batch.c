/*
 * Batches: submit resolves every request first (all or nothing), then
 * slices each request and hands the slices to its transport.  Completion
 * counts down per request and per batch, and only the batch's last
 * completion wakes a waiter, so a batch of many small requests costs one
 * wake-up.
 */
#include "core.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct request_state {
    /* What completion reads comes first, in one cache line; then what
     * resolve and launch use. */
    struct ferry_batch *batch;
    atomic_size_t slices_left;
    atomic_int error;      /* first failure, 0 if none */
    atomic_int state;      /* ferry_xfer_state_t */
    int staged;            /* see local_accel */
    int copier;            /* counted in at segment (epoch), -1: not */
    ferry_reg_entry_t *local_entry;     /* held if the local buffer is registered */
    ferry_segment_t *segment;
    ferry_opcode_t opcode;
    int transport;                      /* engine transport index, -1: local copy */
    void *local;
    uint64_t remote_addr;
    size_t length;
    ferry_descriptor_t *desc;           /* held while the request lives */
    uint64_t desc_version;              /* the segment's, with desc (0: none) */
    const ferry_desc_buffer_t *buffer;  /* inside desc */
    int wanted;                         /* the request's own transport, -1: none */
    int desc_transport;                 /* index in desc->transports */
    /* The local buffer is device memory of this vendor (NULL: host).  When
     * the transport takes host memory only, each slice goes through a
     * staging buffer (staged): chunks[i] is slice i's, from launch until
     * its slice is done (or until a refused submit gives it back). */
    const ferry_accel_ops_t *local_accel;
    /* The request's slices: one_slice when it is one (a small request:
     * the slot's own storage, no allocation), else many_slices. */
    ferry_slice_t *slices;
    size_t n_slices;
    /* What stays with the slot while it holds the same resolution (a
     * request submitted again, submit_again): its slices, cut for
     * local_entry's handles (slices_entry), and the transport's view of the
     * target, both made at the first launch; resolving anew clears them. */
    int slices_made;
    int peer_made;
    ferry_slice_t one_slice;
    ferry_slice_t *many_slices;         /* kept across submits of this slot */
    size_t many_cap;
    ferry_stage_chunk_t **chunks;
    size_t chunks_cap;
    ferry_reg_entry_t *slices_entry;    /* compared, never dereferenced */
    ferry_peer_t peer;
} request_state_t;

struct ferry_batch {
    uint64_t handle;
    ferry_engine_t *engine;
    size_t max;
    request_state_t *requests;  /* [max] */
    size_t used;                /* submit_lock */
    /* Submitted requests not finished (PENDING_COUNT) and PENDING_SLEEPER:
     * a thread in ferry_batch_wait may sleep on this word (a futex).  One
     * word, so that the countdown which finishes the batch is the
     * finisher's last touch of it: a caller that sees the count at 0 may
     * destroy the batch at once (the wake that may follow reads nothing). */
    atomic_uint pending;
    ferry_lock_t submit_lock;   /* used, requests[] setup, notify fields */
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

/* The request no longer counts among its segment's copiers (see
 * copier_enter). */
static void copier_leave(request_state_t *req)
{
    if (req->copier >= 0)
        ferry_segment_copier_exit(req->segment, req->copier, 1);
    req->copier = -1;
}

/*
 * Requests finished by one completion call, settled together: each hold
 * that a run of them shares (the local registry entry, the segment's
 * copier count, the batch's pending count) is given back with one atomic
 * for the run, not one per request.  The batch's countdown comes last: it
 * is the finisher's last touch of the batch (a waiter that sees it reach 0
 * may destroy it).
 */
typedef struct settle {
    ferry_batch_t *batch;
    unsigned pending;
    ferry_reg_entry_t *entry;
    unsigned entry_holds;
    ferry_segment_t *segment;
    int epoch;
    unsigned copiers;
} settle_t;

static void settle_holds(settle_t *s)
{
    if (s->entry_holds > 0)
        ferry_registry_release_n(&s->batch->engine->registry, s->entry, s->entry_holds);
    if (s->copiers > 0)
        ferry_segment_copier_exit(s->segment, s->epoch, s->copiers);
    s->entry_holds = s->copiers = 0;
}

static void settle_all(settle_t *s)
{
    settle_holds(s);
    if (s->pending == 0)
        return;
    atomic_uint *pending = &s->batch->pending;
    unsigned n = s->pending;
    s->pending = 0;
    /* From here on the batch may be gone: the wake reads nothing. */
    if (atomic_fetch_sub_explicit(pending, n, memory_order_acq_rel) == (PENDING_SLEEPER | n))
        ferry_futex_wake(pending, INT_MAX);
}

/* The request is done: its state is published and its holds join s. */
static inline void request_finish(request_state_t *req, settle_t *s)
{
    ferry_batch_t *batch = req->batch;
    if (s->batch != batch) {
        settle_all(s);
        s->batch = batch;
    }
    if (req->local_entry != NULL) {
        if (s->entry_holds > 0 && s->entry != req->local_entry)
            settle_holds(s);
        s->entry = req->local_entry;
        s->entry_holds++;
        req->local_entry = NULL;
    }
    if (req->copier >= 0) {
        if (s->copiers > 0 && (s->segment != req->segment || s->epoch != req->copier))
            settle_holds(s);
        s->segment = req->segment;
        s->epoch = req->copier;
        s->copiers++;
        req->copier = -1;
    }
    int error = atomic_load_explicit(&req->error, memory_order_relaxed);
    /* Plain (release) stores, no locked instruction: the countdown of
     * pending in settle_all publishes them to whoever sees it reach 0. */
    atomic_store_explicit(&req->state, error ? FERRY_XFER_FAILED : FERRY_XFER_COMPLETED,
                          memory_order_release);
    if (error)
        atomic_store_explicit(&batch->any_failed, 1, memory_order_release);
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
    size_t i = (size_t)(slice - req->slices);
    void *device = (char *)req->local + (slice->remote_addr - req->remote_addr);
    if (status == FERRY_OK && req->opcode == FERRY_OP_READ)
        status = req->local_accel->copy(device, slice->local, slice->length);
    ferry_stage_put(req->batch->engine, req->chunks[i]);
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

/* Find the target buffer and a transport in desc; FERRY_ERR_OUT_OF_RANGE if
 * the range is not there, so the caller can refresh once. */
static ferry_status_t resolve_in(ferry_engine_t *engine, request_state_t *req)
{
    const ferry_descriptor_t *desc = req->desc;
    req->buffer = ferry_descriptor_find(desc, req->remote_addr, req->length);
    if (req->buffer == NULL)
        return FERRY_ERR_OUT_OF_RANGE;
    unsigned need = req->opcode == FERRY_OP_WRITE ? FERRY_REG_REMOTE_WRITE
                                                  : FERRY_REG_REMOTE_READ;
    if ((req->buffer->access & need) == 0) {
        ferry_error("segment \"%s\" buffer 0x%llx is not remote-%s", desc->name,
                    (unsigned long long)req->buffer->addr,
                    need == FERRY_REG_REMOTE_WRITE ? "writable" : "readable");
        return FERRY_ERR_REMOTE_REFUSED;
    }
    if (req->segment->is_local) {
        req->transport = -1;
        req->desc_transport = -1;
        return FERRY_OK;
    }
    if (req->wanted >= 0) {
        /* The request named its transport: that one or none (a fallback
         * reach counts, the caller asked for it). */
        int reach;
        const char *why = ferry_engine_transport_reach(engine, (size_t)req->wanted, desc, req->buffer,
                                          &reach, &req->desc_transport);
        if (why != NULL) {
            ferry_error("segment \"%s\" buffer 0x%llx: the request asks for transport %s, "
                        "but %s", desc->name, (unsigned long long)req->buffer->addr,
                        transport_name(engine, req->wanted), why);
            return FERRY_ERR_UNSUPPORTED;
        }
        req->transport = req->wanted;
        return FERRY_OK;
    }
    atomic_int *route = &((ferry_desc_buffer_t *)req->buffer)->route;
    int known = atomic_load_explicit(route, memory_order_relaxed);
    if (known != 0) {
        req->transport = (known & 0xffff) - 1;
        req->desc_transport = (known >> 16) - 1;
        return FERRY_OK;
    }
    req->transport = ferry_engine_select_transport(engine, desc, req->buffer, &req->desc_transport);
    if (req->transport >= 0)
        atomic_store_explicit(route, (req->transport + 1) | (req->desc_transport + 1) << 16,
                              memory_order_relaxed);
    if (req->transport < 0) {
        ferry_error("segment \"%s\": no transport enabled on both sides reaches buffer 0x%llx",
                    desc->name, (unsigned long long)req->buffer->addr);
        return FERRY_ERR_UNSUPPORTED;
    }
    return FERRY_OK;
}

/*
 * The references a submit's requests take on what they share with the
 * request before them (its descriptor, its local registry entry), owed
 * while resolving and taken with one atomic per run of requests that share
 * them.  The first of a run holds a real reference meanwhile, so what is
 * owed cannot go before it is taken; owed_take runs before anything could
 * drop a reference (a refresh, an error's cleanup) and before launch.
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

/* Re-read the segment's descriptor (refreshing it once) and resolve again. */
static ferry_status_t resolve_refreshed(ferry_engine_t *engine, request_state_t *req)
{
    ferry_status_t status = ferry_segment_refetch(engine, req->segment, req->desc);
    if (status != FERRY_OK)
        return status;
    ferry_descriptor_unref(req->desc);
    req->desc = NULL;
    req->slices_made = req->peer_made = 0;
    status = ferry_segment_descriptor_versioned(engine, req->segment, &req->desc,
                                                &req->desc_version);
    return status == FERRY_OK ? resolve_in(engine, req) : status;
}

/* Whether [addr, +length) lies inside [start, +size). */
static int range_within(uint64_t addr, uint64_t length, uint64_t start, uint64_t size)
{
    return addr >= start && length <= size && addr - start <= size - length;
}

/* The local buffer's registry entry when the previous request's does not
 * hold it: the batch's last one (see kept_entry) if it does, so that a
 * ping-pong's every write needs no lookup and no lock; else a lookup. */
static ferry_reg_entry_t *local_entry_found(ferry_engine_t *engine, const request_state_t *req)
{
    uintptr_t addr = (uintptr_t)req->local;
    ferry_reg_entry_t *entry = req->batch->kept_entry;
    if (entry != NULL && range_within(addr, req->length, entry->addr, entry->length) &&
        ferry_reg_entry_hold(entry))
        return entry;
    return ferry_registry_acquire(&engine->registry, addr, req->length, 0);
}

/* The local buffer's registry entry: the previous request's when it holds
 * this range too (its hold keeps the entry alive; ours is owed), so that a
 * run of requests from one buffer needs no lookup, no lock and no atomic
 * each. */
static inline ferry_reg_entry_t *local_entry(ferry_engine_t *engine, const request_state_t *req,
                                             const request_state_t *prev, owed_t *owed)
{
    ferry_reg_entry_t *entry = prev ? prev->local_entry : NULL;
    /* As ferry_reg_entry_hold: no new hold once unregister began. */
    if (entry != NULL &&
        range_within((uintptr_t)req->local, req->length, entry->addr, entry->length) &&
        !(atomic_load_explicit(&entry->holds, memory_order_relaxed) & FERRY_REG_DYING)) {
        owe_entry(owed, entry);
        return entry;
    }
    return local_entry_found(engine, req);
}

/* The vendor of the local buffer's device memory, NULL for host memory:
 * its registration says, else (when accelerators are in use) its pointer. */
static const ferry_accel_ops_t *local_memory(const ferry_engine_t *engine,
                                             const request_state_t *req)
{
    if (req->local_entry != NULL)
        return req->local_entry->accel;
    ferry_accel_range_t range;
    return engine->n_accel ? ferry_engine_accel_query(engine, req->local, &range) : NULL;
}

/* The previous request's resolution holds for this one too (same
 * descriptor, operation and choice of transport, a range inside the same
 * buffer): no search, no selection. */
static int resolve_as_prev(request_state_t *req, const request_state_t *prev)
{
    if (prev == NULL || prev->desc != req->desc || prev->buffer == NULL ||
        prev->opcode != req->opcode || prev->wanted != req->wanted ||
        !range_within(req->remote_addr, req->length, prev->buffer->addr, prev->buffer->length))
        return 0;
    req->buffer = prev->buffer;
    req->transport = prev->transport;
    req->desc_transport = prev->desc_transport;
    return 1;
}

/*
 * The request continues prev's run: the same segment handle, operation and
 * choice of transport, its target range inside prev's buffer and its local
 * range inside prev's registered buffer.  It then takes prev's resolution
 * over as it stands, checked in one place, with its references owed (the
 * run's first request holds real ones); no lookup, no search, and nothing
 * stored twice.  0: it does not (or prev has no registry entry to share),
 * nothing written; resolve's steps decide.
 */
static inline int resolve_in_run(const ferry_request_t *in, request_state_t *req,
                                 const request_state_t *prev, owed_t *owed)
{
    const ferry_desc_buffer_t *buffer = prev->buffer;
    ferry_reg_entry_t *entry = prev->local_entry;
    /* range_within also rules a zero length or a wrap-around out: both
     * ranges end inside a buffer that does not wrap. */
    if (prev->desc == NULL || buffer == NULL || entry == NULL || in->opcode != prev->opcode ||
        in->transport != NULL || prev->wanted >= 0 || in->local == NULL || in->length == 0 ||
        !range_within(in->target_offset, in->length, buffer->addr, buffer->length) ||
        !range_within((uintptr_t)in->local, in->length, entry->addr, entry->length) ||
        /* As ferry_reg_entry_hold: no new hold once unregister began. */
        (atomic_load_explicit(&entry->holds, memory_order_relaxed) & FERRY_REG_DYING))
        return 0;
    req->batch = prev->batch;
    atomic_init(&req->error, 0);
    atomic_init(&req->state, FERRY_XFER_WAITING);
    req->staged = 0;
    req->copier = -1;
    req->slices_made = req->peer_made = 0; /* cut and made at launch, as anew */
    req->segment = prev->segment;
    req->opcode = prev->opcode;
    req->local = in->local;
    req->remote_addr = in->target_offset;
    req->length = in->length;
    req->wanted = -1;
    req->desc = prev->desc;
    req->desc_version = prev->desc_version;
    req->buffer = buffer;
    req->transport = prev->transport;
    req->desc_transport = prev->desc_transport;
    req->local_entry = entry; /* batch->kept_entry is it already: prev's */
    req->local_accel = prev->local_accel; /* local_memory: the entry's */
    owe_desc(owed, req->desc);
    owe_entry(owed, entry);
    return 1;
}

/* prev: the request resolved just before in the same submit, or NULL;
 * same_target: in names prev's segment handle again. */
static ferry_status_t resolve(ferry_batch_t *batch, const ferry_request_t *in,
                              request_state_t *req, const request_state_t *prev,
                              int same_target, owed_t *owed)
{
    if (same_target && prev != NULL && resolve_in_run(in, req, prev, owed))
        return FERRY_OK;
    ferry_engine_t *engine = batch->engine;
    /* Field by field (the rest are set below before use), not a memset: a
     * rep stos of the whole state costs more than a small request's resolve
     * otherwise does.  many_slices and chunks stay: they are the slot's. */
    req->batch = batch;
    atomic_init(&req->slices_left, 0);
    atomic_init(&req->error, 0);
    atomic_init(&req->state, FERRY_XFER_WAITING);
    req->desc = NULL; /* with local_entry: what requests_release reads */
    req->desc_version = 0;
    req->local_entry = NULL;
    req->staged = 0;
    req->copier = -1;
    req->slices_made = req->peer_made = 0;
    if ((in->opcode != FERRY_OP_READ && in->opcode != FERRY_OP_WRITE) || in->local == NULL ||
        in->length == 0 || in->target_offset + in->length < in->target_offset) {
        ferry_error("request: bad opcode, NULL local buffer, zero length or wrap-around");
        return FERRY_ERR_INVALID_PARAM;
    }
    /* The handle prev's lookup validated, named again: the same segment. */
    req->segment = same_target && prev != NULL
                       ? prev->segment
                       : ferry_handle_lookup((uint64_t)(uintptr_t)in->target,
                                             FERRY_HANDLE_SEGMENT, engine);
    if (req->segment == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    req->opcode = in->opcode;
    req->local = in->local;
    req->remote_addr = in->target_offset;
    req->length = in->length;
    req->wanted = -1;
    if (in->transport != NULL && (req->wanted = ferry_engine_transport_index(engine, in->transport)) < 0) {
        ferry_error("request: transport \"%s\" is not enabled in this engine", in->transport);
        return FERRY_ERR_UNSUPPORTED;
    }
    /* One submit sees one descriptor per segment: a run of requests to one
     * segment shares the first one's (no segment lock per request, one
     * reference count for the run), and the first one takes the previous
     * round's if the segment still shows it (no lock, no reference
     * counting: a ping-pong's every write). */
    ferry_status_t status = FERRY_OK;
    if (prev != NULL && prev->segment == req->segment && prev->desc != NULL) {
        req->desc = prev->desc;
        req->desc_version = prev->desc_version;
        owe_desc(owed, req->desc);
    } else if (prev == NULL && batch->kept_desc != NULL && batch->kept_segment == req->segment &&
               ferry_segment_still_current(req->segment, batch->kept_version)) {
        req->desc = batch->kept_desc;
        req->desc_version = batch->kept_version;
        batch->kept_desc = NULL;
    } else {
        status = ferry_segment_descriptor_versioned(engine, req->segment, &req->desc,
                                                    &req->desc_version);
    }
    if (status != FERRY_OK)
        return status;
    if (!resolve_as_prev(req, prev))
        status = resolve_in(engine, req);
    if (status == FERRY_ERR_OUT_OF_RANGE) {
        owed_take(owed); /* the refresh drops this request's reference */
        status = resolve_refreshed(engine, req);
    }
    if (status == FERRY_ERR_OUT_OF_RANGE)
        ferry_error("segment \"%s\" has no buffer holding [0x%llx, +%zu)", req->segment->name,
                    (unsigned long long)req->remote_addr, req->length);
    if (status == FERRY_OK && (req->local_entry = local_entry(engine, req, prev, owed)) != NULL)
        batch->kept_entry = req->local_entry;
    if (status == FERRY_OK)
        req->local_accel = local_memory(engine, req);
    return status;
}

/* Drop the references of count requests, one atomic per run of requests
 * that share a descriptor. */
static void requests_release(ferry_engine_t *engine, request_state_t *reqs, size_t count)
{
    ferry_descriptor_t *desc = NULL;
    unsigned refs = 0;
    for (size_t i = 0; i <= count; i++) {
        ferry_descriptor_t *next = i < count ? reqs[i].desc : NULL;
        if (next != desc && refs > 0) {
            ferry_descriptor_unref_n(desc, refs);
            refs = 0;
        }
        if (i == count)
            break;
        desc = next;
        refs += next != NULL;
        if (reqs[i].local_entry)
            ferry_registry_release(&engine->registry, reqs[i].local_entry);
        reqs[i].local_entry = NULL;
        reqs[i].desc = NULL;
    }
}

/* Our own segment: a bounds-checked copy, done now. */
static void launch_local(ferry_engine_t *engine, request_state_t *req)
{
    ferry_access_t access = req->opcode == FERRY_OP_WRITE ? FERRY_ACCESS_WRITE
                                                          : FERRY_ACCESS_READ;
    void *token;
    ferry_status_t status = ferry_engine_access_acquire(engine, req->remote_addr, req->length,
                                                        access, &token);
    if (status == FERRY_OK) {
        void *remote = (void *)(uintptr_t)req->remote_addr;
        void *dst = req->opcode == FERRY_OP_WRITE ? remote : req->local;
        const void *src = req->opcode == FERRY_OP_WRITE ? req->local : remote;
        /* Device memory on either side: the vendor copies, never the CPU. */
        const ferry_accel_ops_t *accel = ((const ferry_reg_entry_t *)token)->accel;
        if (accel == NULL)
            accel = req->local_accel;
        if (accel != NULL)
            status = accel->copy(dst, src, req->length);
        else
            memmove(dst, src, req->length);
        ferry_engine_access_release(engine, token);
    }
    if (status == FERRY_OK)
        request_finish_alone(req);
    else
        request_fail(req, status);
}

/* A one-sided transport copies with no check by the target: the requests
 * count among their segment's copiers, so that an invalidation by the
 * owner waits for them, and go out only while the descriptor they were
 * resolved with is still the segment's (FERRY_ERR_STALE: resolve again,
 * nothing counted).  n requests of one route (same_route): one count. */
static ferry_status_t copier_enter(ferry_engine_t *engine, request_state_t *reqs, size_t n)
{
    if (!engine->transports[reqs->transport].one_sided)
        return FERRY_OK;
    return ferry_segment_copier_enter(reqs->segment, reqs->desc_version, (unsigned)n,
                                      &reqs->copier); /* the others' set by the caller */
}

/* Whether the request's local buffer is device memory its transport does
 * not take (it is staged). */
static int needs_staging(const ferry_engine_t *engine, const request_state_t *req)
{
    if (req->local_accel == NULL)
        return 0;
    unsigned takes = engine->transports[req->transport].local_device;
    for (size_t a = 0; a < engine->n_accel; a++)
        if (engine->accel[a] == req->local_accel)
            return (takes & (1u << a)) == 0;
    return 1;
}

/* Slice i of a staged request gets its buffer; a WRITE's bytes come off
 * the device into it now. */
static ferry_status_t stage_slice(ferry_engine_t *engine, request_state_t *req, size_t i,
                                  ferry_slice_t *slice, size_t offset)
{
    req->chunks[i] = ferry_stage_get(engine, req->local_accel);
    if (req->chunks[i] == NULL)
        return FERRY_ERR_NO_MEMORY;
    void *device = (char *)req->local + offset;
    slice->local = ferry_stage_buffer(req->chunks[i]);
    slice->local_memh = NULL;
    if (req->opcode == FERRY_OP_WRITE)
        return req->local_accel->copy(slice->local, device, slice->length);
    return FERRY_OK;
}

static ferry_status_t prepare_slices_cut(ferry_engine_t *engine, request_state_t *req);

/* Cut the request into its transport's slices, linked by next (again only
 * the links, when they were cut for this resolution and local entry). */
static inline ferry_status_t prepare_slices(ferry_engine_t *engine, request_state_t *req)
{
    req->staged = needs_staging(engine, req);
    size_t slice_size = engine->transports[req->transport].slice_size;
    if (!req->staged && (slice_size == 0 || slice_size >= req->length) && !req->slices_made) {
        /* The common small request: its one slice is the slot's own. */
        ferry_slice_t *slice = &req->one_slice;
        slice->opcode = req->opcode;
        slice->local = req->local;
        slice->remote_addr = req->remote_addr;
        slice->length = req->length;
        slice->remote_key = req->buffer->keys[req->desc_transport];
        slice->local_memh = req->local_entry ? req->local_entry->memh[req->transport] : NULL;
        slice->local_device = req->local_accel != NULL;
        slice->owner = req;
        slice->next = NULL;
        req->slices = slice;
        req->n_slices = 1;
        req->slices_entry = req->local_entry;
        req->slices_made = 1;
        atomic_store_explicit(&req->slices_left, 1, memory_order_release);
        return FERRY_OK;
    }
    return prepare_slices_cut(engine, req);
}

static ferry_status_t prepare_slices_cut(ferry_engine_t *engine, request_state_t *req)
{
    if (req->slices_made && req->slices_entry == req->local_entry) {
        for (size_t i = 0; i < req->n_slices; i++)
            req->slices[i].next = i + 1 < req->n_slices ? &req->slices[i + 1] : NULL;
        atomic_store_explicit(&req->slices_left, req->n_slices, memory_order_release);
        return FERRY_OK;
    }
    size_t slice_size = engine->transports[req->transport].slice_size;
    if (req->staged && (slice_size == 0 || slice_size > engine->stage.chunk_size))
        slice_size = engine->stage.chunk_size;
    if (slice_size == 0 || slice_size > req->length)
        slice_size = req->length;
    size_t count = slice_size == req->length ? 1 : (req->length + slice_size - 1) / slice_size;
    if (count > 1 && count > req->many_cap) {
        ferry_slice_t *grown = realloc(req->many_slices, count * sizeof(*grown));
        if (grown == NULL)
            return FERRY_ERR_NO_MEMORY;
        req->many_slices = grown;
        req->many_cap = count;
    }
    req->slices = count == 1 ? &req->one_slice : req->many_slices;
    if (req->staged && count > req->chunks_cap) {
        ferry_stage_chunk_t **grown = realloc(req->chunks, count * sizeof(*grown));
        if (grown == NULL)
            return FERRY_ERR_NO_MEMORY;
        req->chunks = grown;
        req->chunks_cap = count;
    }
    const char *key = req->buffer->keys[req->desc_transport];
    void *memh = req->local_entry ? req->local_entry->memh[req->transport] : NULL;
    for (size_t i = 0, offset = 0; i < count; i++, offset += slice_size) {
        ferry_slice_t *slice = &req->slices[i];
        slice->opcode = req->opcode;
        slice->local = (char *)req->local + offset;
        slice->remote_addr = req->remote_addr + offset;
        slice->length = FERRY_MIN(slice_size, req->length - offset);
        slice->remote_key = key;
        slice->local_memh = memh;
        slice->local_device = req->local_accel != NULL && !req->staged;
        slice->owner = req;
        slice->next = i + 1 < count ? &req->slices[i + 1] : NULL;
        if (req->staged)
            req->chunks[i] = NULL;
    }
    req->n_slices = count;
    for (size_t i = 0, offset = 0; req->staged && i < count; i++, offset += slice_size) {
        ferry_status_t status = stage_slice(engine, req, i, &req->slices[i], offset);
        if (status != FERRY_OK) {
            ferry_error("staging a %zu-byte %s of device memory failed: %s", req->length,
                        req->opcode == FERRY_OP_WRITE ? "write" : "read",
                        ferry_status_string(status));
            unstage(engine, req);
            req->slices_made = 0;
            return status;
        }
    }
    req->slices_entry = req->local_entry;
    /* Staged slices point at buffers that go back when they are done: cut
     * them anew each launch. */
    req->slices_made = !req->staged;
    atomic_store_explicit(&req->slices_left, count, memory_order_release);
    return FERRY_OK;
}

/* Hand first's slices, and whatever is chained behind them, to its
 * transport.  Non-OK: nothing was queued. */
static ferry_status_t submit_slices(ferry_engine_t *engine, request_state_t *first)
{
    ferry_transport_instance_t *tp = &engine->transports[first->transport];
    if (!first->peer_made) {
        ferry_engine_make_peer(engine, first->desc, first->desc_transport, &first->peer);
        if (FERRY_TRANSPORT_OPS_HAS(tp->ops, peer_cache_release))
            first->peer.cache = &first->batch->peer_caches[first->transport];
        first->peer_made = 1;
    }
    return tp->ops->submit(tp->ctx, &first->peer, first->slices);
}

/* Hand n requests to the same peer through the same transport over in one
 * submit, their slices chained.  Non-OK: nothing was queued. */
static ferry_status_t submit_run(ferry_engine_t *engine, request_state_t *reqs, size_t n)
{
    ferry_slice_t **tail = NULL;
    ferry_status_t status = copier_enter(engine, reqs, n);
    if (status != FERRY_OK)
        return status; /* nothing counted */
    for (size_t i = 0; i < n && status == FERRY_OK; i++) {
        reqs[i].copier = reqs->copier;
        atomic_store_explicit(&reqs[i].state, FERRY_XFER_PENDING, memory_order_release);
        status = prepare_slices(engine, &reqs[i]);
        if (status != FERRY_OK)
            break;
        if (tail != NULL)
            *tail = reqs[i].slices;
        tail = &reqs[i].slices[reqs[i].n_slices - 1].next;
    }
    if (status == FERRY_OK)
        status = submit_slices(engine, &reqs[0]);
    if (status != FERRY_OK) {
        if (reqs->copier >= 0)
            ferry_segment_copier_exit(reqs->segment, reqs->copier, (unsigned)n);
        for (size_t i = 0; i < n; i++) {
            reqs[i].copier = -1;
            unstage(engine, &reqs[i]);
        }
    }
    return status;
}

/* Count the request in and hand its slices to the transport; when the
 * segment changed since the request was resolved (its owner invalidated
 * it), resolve anew first, a few times at most.  Non-OK: nothing queued,
 * nothing counted. */
static ferry_status_t send_request(ferry_engine_t *engine, request_state_t *req)
{
    ferry_status_t status = copier_enter(engine, req, 1);
    for (int tries = 0; status == FERRY_ERR_STALE && tries < 3; tries++) {
        status = resolve_refreshed(engine, req);
        if (status == FERRY_OK)
            status = copier_enter(engine, req, 1);
    }
    if (status != FERRY_OK)
        return status;
    status = prepare_slices(engine, req);
    if (status == FERRY_OK)
        status = submit_slices(engine, req);
    if (status != FERRY_OK) {
        copier_leave(req);
        unstage(engine, req);
    }
    return status;
}

/* The transport took none of the request's slices (status): FERRY_OK when
 * a retry went out, else why the request FAILED. */
static ferry_status_t launch_refused(ferry_engine_t *engine, request_state_t *req,
                                     ferry_status_t status)
{
    if (status == FERRY_ERR_STALE || status == FERRY_ERR_PEER_FAILED ||
        status == FERRY_ERR_CONNECT) {
        /* The peer restarted or its link broke: drop that incarnation's
         * state, refresh the descriptor once and try again. */
        ferry_info("segment \"%s\" via %s: %s; refreshing and retrying once", req->desc->name,
                   transport_name(engine, req->transport), ferry_status_string(status));
        ferry_engine_forget_peer(engine, req->desc);
        ferry_status_t first = status;
        status = resolve_refreshed(engine, req);
        if (status == FERRY_OK && req->transport < 0) {
            launch_local(engine, req);
            return FERRY_OK;
        }
        if (status == FERRY_OK) {
            status = send_request(engine, req);
        } else if (status != FERRY_ERR_OUT_OF_RANGE && status != FERRY_ERR_REMOTE_REFUSED &&
                   status != FERRY_ERR_UNSUPPORTED) {
            /* No fresh descriptor (a dead peer does not answer): what the
             * transport saw is the better reason. */
            ferry_info("segment \"%s\": refresh failed: %s", req->segment->name,
                       ferry_status_string(status));
            status = first;
        }
    }
    if (status != FERRY_OK) {
        ferry_error("request to segment \"%s\" [0x%llx, +%zu) failed: %s",
                    req->segment->name, (unsigned long long)req->remote_addr, req->length,
                    ferry_status_string(status));
        request_fail(req, status);
    }
    return status;
}

/* FERRY_OK when the request went out (or finished), else why it FAILED. */
static ferry_status_t launch(ferry_engine_t *engine, request_state_t *req)
{
    atomic_store_explicit(&req->state, FERRY_XFER_PENDING, memory_order_release);
    if (req->transport < 0) {
        launch_local(engine, req);
        return FERRY_OK;
    }
    ferry_status_t status = send_request(engine, req);
    return status == FERRY_OK ? FERRY_OK : launch_refused(engine, req, status);
}

/* Consecutive requests to the same peer through the same transport go to
 * the transport in one submit: one connection lookup, one completion group
 * and one flush for the run instead of one per request.  A run the
 * transport refuses as a whole takes the one-by-one path (with its
 * refresh-and-retry). */
static void launch_run(ferry_engine_t *engine, request_state_t *reqs, size_t n)
{
    if (submit_run(engine, reqs, n) == FERRY_OK)
        return; /* the slices are the transport's now: reqs may finish any time */
    for (size_t i = 0; i < n; i++) {
        ferry_status_t status = launch(engine, &reqs[i]);
        if ((status == FERRY_ERR_PEER_FAILED || status == FERRY_ERR_CONNECT) && i + 1 < n) {
            /* The peer is gone even after a refresh: the rest of the run
             * goes to it too; fail it with one line, not a retry each. */
            ferry_error("%zu more request(s) to segment \"%s\" failed: %s", n - i - 1,
                        reqs[i].segment->name, ferry_status_string(status));
            for (size_t j = i + 1; j < n; j++)
                request_fail(&reqs[j], status);
            return;
        }
    }
}

/* Requests that go to the transport in one submit, counted in as copiers
 * of their segment at once. */
static int same_route(const request_state_t *a, const request_state_t *b)
{
    return a->transport >= 0 && a->transport == b->transport && a->desc == b->desc &&
           a->desc_transport == b->desc_transport && a->segment == b->segment &&
           a->desc_version == b->desc_version;
}

static void launch_all(ferry_engine_t *engine, request_state_t *reqs, size_t count)
{
    for (size_t i = 0; i < count;) {
        size_t n = 1;
        while (i + n < count && same_route(&reqs[i], &reqs[i + n]))
            n++;
        if (n == 1)
            launch(engine, &reqs[i]);
        else
            launch_run(engine, &reqs[i], n);
        i += n;
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
    if (batch == NULL || (batch->requests = calloc(max_requests, sizeof(request_state_t))) ==
                             NULL) {
        free(batch);
        return FERRY_ERR_NO_MEMORY;
    }
    batch->engine = engine;
    batch->max = max_requests;
    batch->handle = ferry_handle_alloc(FERRY_HANDLE_BATCH, batch, engine);
    if (batch->handle == 0) {
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
    if (req->desc_version == 0 || !req->peer_made || in->transport != NULL || req->wanted >= 0 ||
        in->opcode != req->opcode || in->local != req->local || in->length != req->length ||
        in->target_offset != req->remote_addr ||
        atomic_load_explicit(&req->state, memory_order_relaxed) != FERRY_XFER_COMPLETED ||
        ferry_handle_lookup((uint64_t)(uintptr_t)in->target, FERRY_HANDLE_SEGMENT,
                            batch->engine) != req->segment ||
        !ferry_segment_still_current(req->segment, req->desc_version))
        return 0;
    /* A completed round left no error, no failure flag and no entry held. */
    ferry_engine_t *engine = batch->engine;
    if ((req->local_entry = local_entry(engine, req, NULL, NULL)) != NULL) /* owes nothing */
        batch->kept_entry = req->local_entry;
    req->local_accel = local_memory(engine, req);
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
    if (batch_pending(batch) == 0 && count == 1 && batch->used == 1 &&
        submit_again(batch, requests)) {
        ferry_lock_release(&batch->submit_lock);
        return FERRY_OK;
    }
    if (batch_pending(batch) == 0) {
        /* Everything earlier finished: the batch starts over. */
        if (batch->used > 0 && batch->requests[batch->used - 1].desc_version != 0) {
            request_state_t *last = &batch->requests[batch->used - 1];
            batch->kept_segment = last->segment;
            batch->kept_desc = last->desc;
            batch->kept_version = last->desc_version;
            last->desc = NULL;
        }
        requests_release(engine, batch->requests, batch->used);
        batch->used = 0;
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
    owed_t owed = {0};
    for (size_t i = 0; i < count; i++) {
        status = resolve(batch, &requests[i], &reqs[i], i > 0 ? &reqs[i - 1] : NULL,
                         i > 0 && requests[i].target == requests[i - 1].target, &owed);
        if (status != FERRY_OK) {
            owed_take(&owed);
            requests_release(engine, reqs, i + 1);
            goto out_unlock;
        }
    }
    owed_take(&owed);
    /* Nothing in flight means nobody else moves the count: no locked add. */
    if (batch->used == 0)
        atomic_store_explicit(&batch->pending, count, memory_order_release);
    else
        atomic_fetch_add(&batch->pending, count);
    batch->used += count;
    launch_all(engine, reqs, count);
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
    status_p->transferred = status_p->state == FERRY_XFER_COMPLETED ? req->length : 0;
    status_p->transport = transport_name(batch->engine, req->transport);
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
    requests_release(batch->engine, batch->requests, batch->used);
    for (size_t i = 0; i < batch->max; i++) {
        free(batch->requests[i].many_slices);
        free(batch->requests[i].chunks);
    }
    if (batch->notify_desc)
        ferry_descriptor_unref(batch->notify_desc);
    free(batch->notify_msg);
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
