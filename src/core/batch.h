/*
 * The batch's private header: the batch, its request slots and its run
 * records, shared by the files that make up a batch:
 * - batch.c: the batch itself (create, submit, status, wait, notify,
 *   destroy) and its teardown;
 * - batch_run.c: the run record (request_run_t): resolving requests into
 *   runs, the references a run holds and their release;
 * - batch_launch.c: cutting requests into slices and handing them to the
 *   transports (or copying them, for our own segment);
 * - batch_complete.c: completion, the countdown of requests, runs and
 *   batch.
 * Locks: submit_lock guards what struct ferry_batch says; completion
 * touches only atomics (see settle_t).
 */
#ifndef FERRY_CORE_BATCH_H
#define FERRY_CORE_BATCH_H

#include "core.h"

#include <stddef.h>

/*
 * What a run of requests shares.  Its first request resolves it; the next
 * requests of the same submit join it (resolve_in_run); a request whose
 * transport refused its run, and which then goes alone, gets a record of
 * its own first (ferry_batch_runs_split), so that a refresh or a retry changes the
 * resolution of that one request only.  What it holds, once for the run:
 * - desc: one reference, from resolve until the batch starts over or goes
 *   (ferry_batch_runs_release);
 * - local_entry: one hold, until the run's last request finishes
 *   (ferry_batch_run_settle) or its submit fails (ferry_batch_runs_release);
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
    uint64_t submit_ticks;
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
    uint64_t submit_ticks; /* submit_lock: the current submit's start, for its runs */
    /* The local registry entry of the last request resolved, unreferenced:
     * unregistering clears it (ferry_batch_forget_entry) before the entry
     * can go, so while it is set it points at a live entry. */
    ferry_reg_entry_t *kept_entry;
    /* submit_lock: what each transport keeps for this batch's next submit
     * (ferry_peer_t.cache), released through peer_cache_release. */
    void *peer_caches[FERRY_MAX_TRANSPORTS];
    struct ferry_batch *next;   /* engine->batches_lock */
};

static inline const char *transport_name(const ferry_engine_t *engine, int transport)
{
    return transport < 0 ? FERRY_LOCAL_TRANSPORT_NAME : engine->transports[transport].plugin->name;
}

#define PENDING_SLEEPER 0x80000000u
#define PENDING_COUNT(word) ((word) & ~PENDING_SLEEPER)

static inline unsigned batch_pending(ferry_batch_t *batch)
{
    return PENDING_COUNT(atomic_load_explicit(&batch->pending, memory_order_acquire));
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

/* What a run owes while a submit resolves (batch_run.c). */
typedef struct owed owed_t;

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

/* ---------------- batch_run.c: the run record ---------------- */

/* Resolve the count requests of a submit into the slots from reqs on and
 * runs from the batch's runs_used on, all or nothing: when one fails, the
 * runs made are released and runs_used is as it was. */
ferry_status_t ferry_batch_resolve_all(ferry_batch_t *batch, const ferry_request_t *requests,
                                       request_state_t *reqs, size_t count);
ferry_reg_entry_t *ferry_batch_run_local_entry(ferry_engine_t *engine, const request_state_t *req,
                                               const request_run_t *prev, owed_t *owed);
const ferry_accel_ops_t *ferry_batch_run_local_memory(const ferry_engine_t *engine,
                                                      const request_run_t *run, void *local);
ferry_status_t ferry_batch_run_resolve_refreshed(ferry_engine_t *engine, request_state_t *req);
void ferry_batch_run_slice_plan(const ferry_engine_t *engine, const request_run_t *run,
                                slice_plan_t *plan);
ferry_status_t ferry_batch_run_copier_enter(ferry_engine_t *engine, request_run_t *run,
                                            size_t n);
void ferry_batch_run_copier_leave(request_run_t *run);
void ferry_batch_run_settle(settle_t *s);
void ferry_batch_runs_release(ferry_engine_t *engine, request_run_t *runs, size_t count);
void ferry_batch_runs_split(ferry_batch_t *batch, request_state_t *reqs, size_t n);

/* ---------------- batch_launch.c: slices to the transports ---------------- */

ferry_status_t ferry_batch_launch(ferry_engine_t *engine, request_state_t *req);
void ferry_batch_launch_all(ferry_engine_t *engine, request_state_t *reqs, request_run_t *runs,
                            size_t n_runs);

/* ---------------- batch_complete.c: completion ---------------- */

void ferry_batch_request_finish_alone(request_state_t *req);
void ferry_batch_request_fail(request_state_t *req, ferry_status_t status);

#endif
