/*
 * The data path.  Submit turns each slice into an op on the peer's pending
 * queue and posts what the window allows; whoever progresses (the thread,
 * ferry_batch_wait's spin through the progress op) reads the lane's CQ,
 * finishes what completed and posts more of the pending ops of the peers
 * it finished ops of (ferry_ofi_peer_pump).  Submit never waits for room:
 * a full window or a provider answering -FI_EAGAIN leaves ops pending, and
 * the sweep's deadline (ofi_peer.c) covers pending ops as well as posted.
 *
 * Writes ask for FI_DELIVERY_COMPLETE (FERRY_OFI_COMPLETION=transmit for
 * FI_TRANSMIT_COMPLETE): with libfabric 1.17, transmit-complete reports a
 * write to a deregistered key as a success on tcp;ofi_rxm, and the data is
 * only known to be in the target's memory at delivery.
 *
 * Submit checks every slice's key before it queues anything: a key that
 * does not parse, or a slice outside the buffer the key names, refuses
 * the whole submit (the engine has already checked the range against the
 * owner-confirmed descriptor; this is the transport's own look).
 */
#include "ofi.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The lists alone (caller holds p->lock); the counters busy_peers and
 * busy are the callers'. */
static void posted_push(ferry_ofi_peer_t *p, ferry_ofi_op_t *op)
{
    op->prev = NULL;
    op->next = p->posted_ops;
    if (p->posted_ops != NULL)
        p->posted_ops->prev = op;
    p->posted_ops = op;
    p->posted++;
}

static ferry_ofi_op_t *pending_take_head(ferry_ofi_peer_t *p)
{
    ferry_ofi_op_t *op = p->pending_head;
    p->pending_head = op->next;
    if (p->pending_head == NULL)
        p->pending_tail = NULL;
    op->next = NULL;
    p->pending--;
    return op;
}

void ferry_ofi_posted_link(ferry_ofi_peer_t *p, ferry_ofi_op_t *op)
{
    if (p->posted + p->pending == 0)
        atomic_fetch_add_explicit(&p->ofi->busy_peers, 1, memory_order_release);
    posted_push(p, op);
    atomic_store_explicit(&p->busy, p->posted + p->pending, memory_order_relaxed);
}

void ferry_ofi_posted_unlink(ferry_ofi_peer_t *p, ferry_ofi_op_t *op)
{
    if (op->prev != NULL)
        op->prev->next = op->next;
    else
        p->posted_ops = op->next;
    if (op->next != NULL)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
    p->posted--;
    if (p->posted + p->pending == 0)
        atomic_fetch_sub_explicit(&p->ofi->busy_peers, 1, memory_order_release);
    atomic_store_explicit(&p->busy, p->posted + p->pending, memory_order_relaxed);
}

/* Pending ops are singly linked by next, head first.  Returns the time it
 * read when the peer was idle (its new last activity), else 0. */
static uint64_t pending_append(ferry_ofi_peer_t *p, ferry_ofi_op_t *first, ferry_ofi_op_t *last,
                               unsigned count)
{
    uint64_t now_ms = 0;
    if (p->posted + p->pending == 0) {
        now_ms = p->last_activity_ms = ferry_ofi_time_ms();
        atomic_fetch_add_explicit(&p->ofi->busy_peers, 1, memory_order_release);
    }
    if (p->pending_tail != NULL)
        p->pending_tail->next = first;
    else
        p->pending_head = first;
    p->pending_tail = last;
    p->pending += count;
    atomic_fetch_add_explicit(&p->ofi->pending_ops, count, memory_order_release);
    atomic_store_explicit(&p->busy, p->posted + p->pending, memory_order_relaxed);
    return now_ms;
}

void ferry_ofi_pending_push_front(ferry_ofi_peer_t *p, ferry_ofi_op_t *op)
{
    if (p->posted + p->pending == 0)
        atomic_fetch_add_explicit(&p->ofi->busy_peers, 1, memory_order_release);
    op->prev = NULL;
    op->next = p->pending_head;
    p->pending_head = op;
    if (p->pending_tail == NULL)
        p->pending_tail = op;
    p->pending++;
    atomic_fetch_add_explicit(&p->ofi->pending_ops, 1, memory_order_release);
    atomic_store_explicit(&p->busy, p->posted + p->pending, memory_order_relaxed);
}

ferry_ofi_op_t *ferry_ofi_pending_pop(ferry_ofi_peer_t *p)
{
    if (p->pending_head == NULL)
        return NULL;
    ferry_ofi_op_t *op = pending_take_head(p);
    atomic_fetch_sub_explicit(&p->ofi->pending_ops, 1, memory_order_release);
    if (p->posted + p->pending == 0)
        atomic_fetch_sub_explicit(&p->ofi->busy_peers, 1, memory_order_release);
    atomic_store_explicit(&p->busy, p->posted + p->pending, memory_order_relaxed);
    return op;
}

/* A chain of up to want ops from the cache (linked by next); the caller
 * callocs the rest. */
static ferry_ofi_op_t *op_cache_take(ferry_ofi_t *ofi, unsigned want)
{
    if (want == 0)
        return NULL;
    pthread_mutex_lock(&ofi->op_cache_lock);
    ferry_ofi_op_t *first = ofi->op_cache, *last = NULL;
    unsigned taken = 0;
    for (ferry_ofi_op_t *op = first; op != NULL && taken < want; op = op->next) {
        last = op;
        taken++;
    }
    if (last != NULL) {
        ofi->op_cache = last->next;
        last->next = NULL;
        ofi->op_cache_count -= taken;
    }
    pthread_mutex_unlock(&ofi->op_cache_lock);
    return last != NULL ? first : NULL;
}

static void free_chain(ferry_ofi_op_t *ops)
{
    while (ops != NULL) {
        ferry_ofi_op_t *next = ops->next;
        free(ops);
        ops = next;
    }
}

/* Give finished ops back (linked by next, count of them); what the cache
 * has no room for is freed. */
static void op_cache_give(ferry_ofi_t *ofi, ferry_ofi_op_t *ops, ferry_ofi_op_t *last,
                          unsigned count)
{
    if (ops == NULL)
        return;
    pthread_mutex_lock(&ofi->op_cache_lock);
    if (ofi->op_cache_count + count <= FERRY_OFI_OP_CACHE) {
        last->next = ofi->op_cache;
        ofi->op_cache = ops;
        ofi->op_cache_count += count;
        ops = NULL;
    }
    pthread_mutex_unlock(&ofi->op_cache_lock);
    free_chain(ops);
}

void ferry_ofi_op_cache_free(ferry_ofi_t *ofi)
{
    free_chain(ofi->op_cache);
    ofi->op_cache = NULL;
    ofi->op_cache_count = 0;
}

void ferry_ofi_ops_finish(ferry_ofi_t *ofi, ferry_ofi_op_t *ops, ferry_status_t status)
{
    ferry_ofi_op_t *recycled = NULL, *recycled_last = NULL;
    unsigned recycled_count = 0;
    ferry_slice_t *done = NULL, **tail = &done;
    ferry_ofi_peer_t *peers[FERRY_OFI_CQ_BATCH];
    unsigned counts[FERRY_OFI_CQ_BATCH], distinct = 0;
    for (ferry_ofi_op_t *op = ops, *next; op != NULL; op = next) {
        next = op->next;
        ferry_ofi_op_release_mr(ofi, op);
        *tail = op->slice;
        tail = &op->slice->next;
        /* one put per peer and run, after the slices are done */
        if (distinct > 0 && peers[distinct - 1] == op->peer) {
            counts[distinct - 1]++;
        } else {
            if (distinct == FERRY_OFI_CQ_BATCH) {
                for (unsigned i = 0; i < distinct; i++)
                    while (counts[i]-- > 0)
                        ferry_ofi_peer_put(peers[i]);
                distinct = 0;
            }
            peers[distinct] = op->peer;
            counts[distinct++] = 1;
        }
        op->next = recycled;
        recycled = op;
        if (recycled_last == NULL)
            recycled_last = op;
        recycled_count++;
    }
    *tail = NULL;
    ferry_transport_slices_done(&ofi->svc, done, status);
    for (unsigned i = 0; i < distinct; i++)
        while (counts[i]-- > 0)
            ferry_ofi_peer_put(peers[i]);
    op_cache_give(ofi, recycled, recycled_last, recycled_count);
}

/* Post one op on the lane (caller holds lane_lock for reading). */
static int post(ferry_ofi_t *ofi, ferry_ofi_lane_t *lane, fi_addr_t addr, ferry_ofi_op_t *op)
{
    ferry_slice_t *slice = op->slice;
    void *desc = NULL;
    ferry_status_t status = ferry_ofi_local_desc(ofi, op, lane->ep, &desc);
    if (status != FERRY_OK)
        return -FI_ENOMEM;
    struct iovec iov = {.iov_base = slice->local, .iov_len = slice->length};
    struct fi_rma_iov rma = {.addr = op->rma_addr, .len = slice->length, .key = op->rkey};
    struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = addr,
                             .rma_iov = &rma, .rma_iov_count = 1, .context = &op->context};
    op->lane_id = lane->id;
    if (slice->opcode == FERRY_OP_WRITE)
        return (int)fi_writemsg(lane->ep, &msg, FI_COMPLETION | ofi->write_flags);
    return (int)fi_readmsg(lane->ep, &msg, FI_COMPLETION);
}

/* Ops taken off the pending queue under the peer's lock and posted after
 * it is dropped: one lock round trip per run instead of one per op. */
#define PUMP_RUN 16

/* The first pending op moved to the posted list (caller holds p->lock and
 * takes it off ofi->pending_ops).  posted + pending stays the same, so
 * busy_peers and busy are not touched: a pop and a link took an idle
 * peer's share of busy_peers from 1 to 0 and back, two atomic operations
 * on a word the progress threads read, for each op of an 8 B write. */
static ferry_ofi_op_t *pending_to_posted(ferry_ofi_peer_t *p)
{
    ferry_ofi_op_t *op = pending_take_head(p);
    posted_push(p, op);
    return op;
}

/* After a post of a run failed at run[failed_at]: the ops after it were
 * never posted; back to the front of the pending queue, in order (caller
 * holds p->lock; the peer is OK). */
static void unpost_rest(ferry_ofi_peer_t *p, ferry_ofi_op_t **run, unsigned from, unsigned n)
{
    for (unsigned i = n; i-- > from;) {
        ferry_ofi_posted_unlink(p, run[i]);
        ferry_ofi_pending_push_front(p, run[i]);
    }
}

/* The pump with lane_lock read-held and p->lock held by the caller; both
 * are released on return.  Submit enters here with the ops it has just
 * queued, so that queueing and posting them take the peer's lock once
 * between them (they took it twice before: 57 instructions of an 8 B
 * write's ~1,800 in the module, doc/performance.md "ofi, fifth round").
 * looked: the caller has just looked whether the peer's process is gone
 * (submit, through ferry_ofi_peer_get_cached), so the pump does not look
 * again (a second look was ~50 instructions of an 8 B write, between a
 * completion and the next post). */
static unsigned pump_locked(ferry_ofi_t *ofi, ferry_ofi_peer_t *p, uint64_t now_ms, int looked)
{
    ferry_ofi_op_t *failed = NULL;
    ferry_status_t failed_status = FERRY_OK;
    int gone = 0, refused = 0;
    unsigned count = 0;
    ferry_ofi_lane_t *lane = ofi->lane;
    if (lane == NULL || p->pumping || p->pending == 0 || p->state != FERRY_OFI_PEER_OK ||
        p->posted >= ofi->window) {
        pthread_mutex_unlock(&p->lock);
        pthread_rwlock_unlock(&ofi->lane_lock);
        return 0;
    }
    int ret = ferry_ofi_lane_address(ofi, lane, p);
    if (ret != 0) {
        refused = ret;
        pthread_mutex_unlock(&p->lock);
        pthread_rwlock_unlock(&ofi->lane_lock);
        ferry_error("ofi: fi_av_insert (%.80s): %s", p->endpoint, fi_strerror(-ret));
        ferry_ofi_peer_fail(p, FERRY_ERR_CONNECT, "the provider refused its address", 1);
        return 0;
    }
    p->pumping = 1;
    /* shm (libfabric 1.17) posts under a spin lock inside the peer's
     * region: a look at the peer's pidfd first keeps us from posting to a
     * peer already dead (once per pump, not per op). */
    gone = ofi->silent_deaths && !looked && ferry_ofi_peer_dead(p);
    int again = 0;
    while (!gone && !again && p->state == FERRY_OFI_PEER_OK && p->pending != 0 &&
           p->posted < ofi->window) {
        /* Linked as posted before the post, so that a fence or a failure
         * meanwhile counts them (as it counted the single op before). */
        ferry_ofi_op_t *run[PUMP_RUN];
        unsigned n = 0;
        int was_idle = p->posted == 0;
        while (n < PUMP_RUN && p->pending != 0 && p->posted < ofi->window)
            run[n++] = pending_to_posted(p);
        atomic_fetch_sub_explicit(&ofi->pending_ops, n, memory_order_release);
        p->attempted = 1;
        fi_addr_t addr = p->addr;
        pthread_mutex_unlock(&p->lock);
        unsigned posted = 0;
        atomic_fetch_add_explicit(&ofi->lane_posting, 1, memory_order_relaxed);
        while (posted < n && (ret = post(ofi, lane, addr, run[posted])) == 0)
            posted++; /* each op posted may be finished already: not touched again */
        atomic_fetch_sub_explicit(&ofi->lane_posting, 1, memory_order_relaxed);
        pthread_mutex_lock(&p->lock);
        if (posted != 0) {
            /* now_ms: submit read the clock as it queued for an idle peer */
            if (!p->connected || was_idle)
                p->last_activity_ms = now_ms != 0 ? now_ms : ferry_ofi_time_ms();
            p->connected = 1;
            count += posted;
        }
        if (posted == n)
            continue;
        ferry_ofi_op_t *op = run[posted];
        ferry_ofi_posted_unlink(p, op);
        if (p->state == FERRY_OFI_PEER_OK) {
            unpost_rest(p, run, posted + 1, n);
            if (ret == -FI_EAGAIN) {
                ferry_ofi_pending_push_front(p, op); /* the sweep's deadline bounds it */
                break;
            }
        } else {
            /* the peer failed meanwhile: its pending ops are failed
             * already, so these would stay pending for good */
            for (unsigned i = posted + 1; i < n; i++) {
                ferry_ofi_posted_unlink(p, run[i]);
                ferry_ofi_op_release_local(run[i]);
                run[i]->next = failed;
                failed = run[i];
            }
            again = 1;
        }
        /* refused; or the peer failed meanwhile */
        ferry_ofi_op_release_local(op);
        op->next = failed;
        failed = op;
        failed_status = p->state != FERRY_OFI_PEER_OK ? p->why : ferry_ofi_status(ret);
        if (ret != -FI_EAGAIN)
            refused = ret;
    }
    p->pumping = 0;
    pthread_mutex_unlock(&p->lock);
    pthread_rwlock_unlock(&ofi->lane_lock);
    if (refused != 0)
        ferry_error("ofi: posting to %.80s: %s", p->endpoint, fi_strerror(-refused));
    if (failed != NULL)
        ferry_ofi_ops_finish(ofi, failed, failed_status);
    if (gone)
        ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, "its process is gone", 0);
    return count;
}

unsigned ferry_ofi_peer_pump(ferry_ofi_peer_t *p)
{
    ferry_ofi_t *ofi = p->ofi;
    if (atomic_load_explicit(&p->busy, memory_order_relaxed) == 0)
        return 0;
    pthread_rwlock_rdlock(&ofi->lane_lock);
    pthread_mutex_lock(&p->lock);
    return pump_locked(ofi, p, 0, 0);
}

/* What a CQ error entry means for the rest of the peer's ops: a refused
 * key or range is that op's alone; anything else (reset, timeout, the
 * peer gone) is the link's. */
static int error_is_the_ops_alone(int err)
{
    return err == FI_EACCES || err == FI_EKEYREJECTED || err == FI_EPERM;
}

/* An error entry read under the CQ's claim: the op (NULL when the entry names
 * none), taken off its peer's list, and what the provider said. */
typedef struct lane_error {
    ferry_ofi_op_t *op;
    int code;
    char message[256];
} lane_error_t;

static void read_error(struct fid_cq *cq, lane_error_t *e)
{
    struct fi_cq_err_entry err = {0};
    e->op = NULL;
    if (fi_cq_readerr(cq, &err, 0) != 1)
        return;
    e->code = err.err < 0 ? -err.err : err.err; /* shm gave a negative one once */
    const char *text = fi_cq_strerror(cq, err.prov_errno, err.err_data, NULL, 0);
    snprintf(e->message, sizeof(e->message), "%s; provider: %s", fi_strerror(e->code),
             text ? text : "?");
    e->op = err.op_context;
    if (e->op == NULL) {
        /* seen once on shm: nothing to finish; a silent peer's ops are
         * bounded by the sweep */
        ferry_warn("ofi: an error entry without an operation: %s", e->message);
        return;
    }
    ferry_ofi_peer_t *p = e->op->peer;
    pthread_mutex_lock(&p->lock);
    ferry_ofi_posted_unlink(p, e->op);
    p->last_activity_ms = ferry_ofi_time_ms();
    pthread_mutex_unlock(&p->lock);
}

/* The op fails; a link error fails its peer too.  No lock held. */
static void finish_error(ferry_ofi_t *ofi, lane_error_t *e)
{
    ferry_ofi_op_t *op = e->op;
    if (op == NULL)
        return;
    ferry_ofi_peer_t *p = op->peer;
    ferry_status_t status = ferry_ofi_status(-e->code);
    int alone = error_is_the_ops_alone(e->code);
    if (alone)
        ferry_error("ofi: %s %zu bytes at 0x%llx of %.80s: %s",
                    op->slice->opcode == FERRY_OP_WRITE ? "write of" : "read of",
                    op->slice->length, (unsigned long long)op->slice->remote_addr, p->endpoint,
                    e->message);
    else
        status = FERRY_ERR_PEER_FAILED;
    ferry_ofi_peer_ref(p, 1); /* past the op's own reference */
    op->next = NULL;
    ferry_ofi_ops_finish(ofi, op, status);
    if (!alone)
        ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, e->message, 1);
    ferry_ofi_peer_put(p);
}

/*
 * One reader of a CQ at a time.  The caller's progress op (ferry_batch_wait's
 * spin) and the progress thread both read the lane's CQ, and both read the
 * target's; under FI_THREAD_SAFE the provider serializes them on its CQ and
 * endpoint locks, and on tcp;ofi_rxm a CQ read is an epoll_wait and the
 * socket I/O behind it, so the second reader slept on the lock (a futex
 * wait and two context switches) about once per ten 64 KiB writes.  It has
 * nothing to do there: the reader inside finishes every op it finds,
 * whoever posted it.  So a second reader returns at once, as from an empty
 * CQ, and looks again on its next turn.  The same while a run of posts is
 * under way on the lane (pump_locked): a post over tcp;ofi_rxm sends
 * inline under the endpoint's lock, and the thread's CQ read waited there
 * behind the caller's submit of a window of 64 KiB writes.
 */
static int cq_claim(atomic_int *reading)
{
    return atomic_load_explicit(reading, memory_order_relaxed) == 0 &&
           atomic_exchange_explicit(reading, 1, memory_order_acquire) == 0;
}

static void cq_release(atomic_int *reading)
{
    atomic_store_explicit(reading, 0, memory_order_release);
}

/* Readers take the claim again a few instructions after they drop it:
 * callers spinning in ferry_batch_wait kept a yielding fence out of the
 * lane for the whole of a 20 s wait in test_ofi_mr's
 * lane_closed_while_readers_wait_in_its_cq_over_shm.  So the fence (the
 * one claimer under the write lock) raises lane_wanted first, readers
 * claim nothing while it is up, and it waits for the one inside at most. */
void ferry_ofi_lane_claim(ferry_ofi_t *ofi)
{
    atomic_store_explicit(&ofi->lane_wanted, 1, memory_order_seq_cst);
    while (!cq_claim(&ofi->lane_reading))
        sched_yield(); /* a reader inside one fi_cq_read and the unlinks after it */
}

void ferry_ofi_lane_unclaim(ferry_ofi_t *ofi)
{
    cq_release(&ofi->lane_reading);
    atomic_store_explicit(&ofi->lane_wanted, 0, memory_order_release);
}

unsigned ferry_ofi_lane_progress(ferry_ofi_t *ofi)
{
    struct fi_cq_entry entries[FERRY_OFI_CQ_BATCH];
    lane_error_t error; /* read_error fills it (its 256 B zeroed on each look cost 38
                           instructions of an empty one) */
    if (atomic_load_explicit(&ofi->lane_posting, memory_order_relaxed) ||
        atomic_load_explicit(&ofi->lane_wanted, memory_order_relaxed) ||
        !cq_claim(&ofi->lane_reading))
        return 0;
    ferry_ofi_lane_t *lane = ofi->lane; /* stays while claimed (ofi.h, "Lane references") */
    if (lane == NULL) {
        cq_release(&ofi->lane_reading);
        return 0;
    }
    ssize_t n = fi_cq_read(lane->cq, entries, FERRY_OFI_CQ_BATCH);
    ferry_ofi_op_t *done = NULL, **tail = &done;
    if (n > 0) {
        uint64_t now = ferry_ofi_time_ms();
        ferry_ofi_peer_t *locked = NULL;
        for (ssize_t i = 0; i < n; i++) {
            ferry_ofi_op_t *op = entries[i].op_context;
            if (op == NULL)
                continue;
            if (op->peer != locked) {
                if (locked != NULL)
                    pthread_mutex_unlock(&locked->lock);
                locked = op->peer;
                pthread_mutex_lock(&locked->lock);
                locked->last_activity_ms = now;
            }
            ferry_ofi_posted_unlink(locked, op);
            *tail = op;
            tail = &op->next;
        }
        if (locked != NULL)
            pthread_mutex_unlock(&locked->lock);
        *tail = NULL;
    } else if (n == -FI_EAVAIL) {
        read_error(lane->cq, &error);
    }
    cq_release(&ofi->lane_reading);
    if (n == -FI_EAVAIL) {
        finish_error(ofi, &error);
        return 1;
    }
    if (n <= 0)
        return 0;
    /* Refill the windows of the peers that finished ops (each op's
     * reference keeps its peer until ops_finish). */
    ferry_ofi_peer_t *last = NULL;
    for (ferry_ofi_op_t *op = done; op != NULL; op = op->next) {
        if (op->peer != last) {
            last = op->peer;
            ferry_ofi_peer_pump(last);
        }
    }
    ferry_ofi_ops_finish(ofi, done, FERRY_OK);
    return (unsigned)n;
}

/* Whether the target served a peer's RMA in a look whose CQ read (begun
 * at read_us, read only without a counter) found no entry: the counter
 * moved, or without one the read took FERRY_OFI_SERVED_US.  Called by the
 * CQ's reader (cq_claim): the counter's last value needs no locked
 * exchange. */
static unsigned target_served(ferry_ofi_t *ofi, uint64_t read_us)
{
    if (ofi->target_cntr == NULL)
        return ferry_ofi_time_us() - read_us >= FERRY_OFI_SERVED_US;
    uint64_t served = fi_cntr_read(ofi->target_cntr);
    uint64_t seen = atomic_load_explicit(&ofi->target_served, memory_order_relaxed);
    if (served == seen)
        return 0;
    atomic_store_explicit(&ofi->target_served, served, memory_order_relaxed);
    return 1;
}

unsigned ferry_ofi_target_progress(ferry_ofi_t *ofi)
{
    struct fid_cq *cq = ofi->target_cq;
    if (cq == NULL)
        return 0;
    if (!cq_claim(&ofi->target_reading))
        return 0;
    struct fi_cq_entry entries[4];
    uint64_t read_us = ofi->target_cntr == NULL ? ferry_ofi_time_us() : 0;
    ssize_t n = fi_cq_read(cq, entries, 4);
    struct fi_cq_err_entry err = {0};
    int err_read = n == -FI_EAVAIL && fi_cq_readerr(cq, &err, 0) == 1;
    unsigned served = n == -FI_EAGAIN ? target_served(ofi, read_us) : 0;
    cq_release(&ofi->target_reading);
    if (n == -FI_EAGAIN)
        return served;
    if (n == -FI_EAVAIL) {
        if (err_read)
            ferry_debug("ofi: target endpoint: %s", fi_strerror(err.err));
        return 1;
    }
    return n > 0 ? (unsigned)n : 0;
}

/* The key of a slice, parsed once per distinct key string of the submit. */
typedef struct key_memo {
    const char *text;
    ferry_ofi_key_t key;
    ferry_status_t status;
} key_memo_t;

static ferry_status_t slice_key(key_memo_t *memo, const ferry_slice_t *slice,
                                ferry_ofi_key_t **key_p)
{
    if (memo->text != slice->remote_key) {
        free(memo->key.raw);
        memo->text = slice->remote_key;
        memo->status = ferry_ofi_key_parse(slice->remote_key, &memo->key);
    }
    if (memo->status != FERRY_OK)
        return memo->status;
    const ferry_ofi_key_t *key = &memo->key;
    if (slice->remote_addr < key->base || slice->length > key->length ||
        slice->remote_addr - key->base > key->length - slice->length)
        return FERRY_ERR_OUT_OF_RANGE;
    *key_p = &memo->key;
    return FERRY_OK;
}

/* The memo keeps the last key parsed, for the ops made next (an 8 B write
 * parsed its key twice). */
static ferry_status_t check_slices(const ferry_peer_t *peer, ferry_slice_t *slices,
                                   key_memo_t *memo)
{
    ferry_status_t status = FERRY_OK;
    for (ferry_slice_t *s = slices; s != NULL && status == FERRY_OK; s = s->next) {
        ferry_ofi_key_t *key;
        status = slice_key(memo, s, &key);
        if (status != FERRY_OK)
            ferry_error("ofi: segment \"%s\": %s 0x%llx +%zu refused: %s", peer->name,
                        status == FERRY_ERR_OUT_OF_RANGE ? "range" : "key of",
                        (unsigned long long)s->remote_addr, s->length,
                        status == FERRY_ERR_OUT_OF_RANGE ? "outside its key's buffer"
                                                         : "the key does not parse");
    }
    return status;
}

/* The memo's key into the batch's cache slot for its next submits (the
 * slot's peer is this submit's: peer_get_cached), or freed. */
static void keep_key(const ferry_peer_t *peer, key_memo_t *memo)
{
    ferry_ofi_batch_cache_t *cache = peer->cache != NULL ? *peer->cache : NULL;
    if (cache != NULL && memo->text != NULL && memo->status == FERRY_OK &&
        memo->key.raw == NULL && cache->descriptor_serial == peer->descriptor_serial) {
        cache->key_text = memo->text;
        cache->key = memo->key;
        return;
    }
    free(memo->key.raw);
}

void ferry_ofi_peer_cache_release(void *ctx, void *cached)
{
    (void)ctx;
    ferry_ofi_batch_cache_t *cache = cached;
    if (cache == NULL)
        return;
    ferry_ofi_peer_put(cache->peer);
    free(cache);
}

/* An op for the slice, its target address and key resolved. */
static ferry_status_t make_op(ferry_ofi_t *ofi, ferry_ofi_peer_t *p, ferry_slice_t *slice,
                              const ferry_ofi_key_t *key, ferry_ofi_op_t **cached,
                              ferry_ofi_op_t **op_p)
{
    ferry_ofi_op_t *op = *cached;
    if (op != NULL) {
        *cached = op->next;
        memset(op, 0, sizeof(*op));
    } else if ((op = calloc(1, sizeof(*op))) == NULL) {
        return FERRY_ERR_NO_MEMORY;
    }
    op->slice = slice;
    op->peer = p;
    op->rkey = key->key;
    if (key->raw != NULL) {
        int ret = fi_mr_map_raw(ofi->domain, key->raw_base, key->raw, key->raw_length,
                                &op->raw_key, 0);
        if (ret != 0) {
            ferry_error("ofi: fi_mr_map_raw: %s", fi_strerror(-ret));
            op_cache_give(ofi, op, op, 1);
            return ferry_ofi_status(ret);
        }
        op->raw_mapped = 1;
        op->rkey = op->raw_key;
    }
    op->rma_addr = (ofi->mr_mode & FI_MR_VIRT_ADDR) ? slice->remote_addr
                                                    : slice->remote_addr - key->base;
    *op_p = op;
    return FERRY_OK;
}

ferry_status_t ferry_ofi_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices)
{
    ferry_ofi_t *ofi = ctx;
    key_memo_t memo = {0};
    const ferry_ofi_batch_cache_t *cache = peer->cache != NULL ? *peer->cache : NULL;
    if (cache != NULL && cache->key_text != NULL &&
        cache->descriptor_serial == peer->descriptor_serial) {
        memo.text = cache->key_text; /* parsed by this batch's last submit */
        memo.key = cache->key;
    }
    ferry_status_t status = check_slices(peer, slices, &memo);
    ferry_ofi_peer_t *p = NULL;
    if (status == FERRY_OK)
        status = ferry_ofi_peer_get_cached(ofi, peer, &p);
    if (status != FERRY_OK) {
        free(memo.key.raw);
        return status;
    }
    ferry_slice_t *failed = NULL;
    ferry_status_t failed_status = FERRY_OK;
    ferry_ofi_op_t *first = NULL, *last = NULL;
    unsigned count = 0;
    unsigned want = 0;
    for (ferry_slice_t *slice = slices; slice != NULL; slice = slice->next)
        want++;
    ferry_ofi_op_t *cached = op_cache_take(ofi, want);
    ferry_slice_t *next;
    for (ferry_slice_t *slice = slices; slice != NULL; slice = next) {
        next = slice->next;
        slice->next = NULL;
        ferry_ofi_key_t *key = NULL;
        ferry_ofi_op_t *op = NULL;
        status = failed_status != FERRY_OK ? failed_status : slice_key(&memo, slice, &key);
        if (status == FERRY_OK)
            status = make_op(ofi, p, slice, key, &cached, &op);
        if (status != FERRY_OK) {
            /* the rest of the run fails with it, as one chain */
            slice->next = failed;
            failed = slice;
            failed_status = status;
            continue;
        }
        if (last != NULL)
            last->next = op;
        else
            first = op;
        last = op;
        count++;
    }
    keep_key(peer, &memo);
    if (cached != NULL) { /* a slice failed: its op was not made */
        ferry_ofi_op_t *last_cached = cached;
        unsigned left = 1;
        while (last_cached->next != NULL) {
            last_cached = last_cached->next;
            left++;
        }
        op_cache_give(ofi, cached, last_cached, left);
    }
    if (first != NULL) {
        ferry_ofi_peer_ref(p, count);
        /* queued and posted under one hold of the peer's lock (pump_locked) */
        pthread_rwlock_rdlock(&ofi->lane_lock);
        pthread_mutex_lock(&p->lock);
        if (p->state == FERRY_OFI_PEER_OK) {
            pump_locked(ofi, p, pending_append(p, first, last, count), 1);
        } else {
            ferry_status_t why = p->why;
            pthread_mutex_unlock(&p->lock);
            pthread_rwlock_unlock(&ofi->lane_lock);
            ferry_ofi_ops_finish(ofi, first, why); /* failed between get and here */
        }
        ferry_ofi_wake(ofi); /* the thread polls while ops are posted or pending */
    }
    ferry_ofi_peer_put(p);
    ferry_transport_slices_done(&ofi->svc, failed, failed_status);
    return FERRY_OK;
}
