/*
 * The data path: one fi_writemsg / fi_readmsg per slice on the peer's
 * endpoint, at most ofi->window posted per peer; completions from the
 * peer's CQ, read by whoever progresses (the thread, ferry_batch_wait's
 * spin through the progress op, a submit waiting for room in the window).
 *
 * Writes ask for FI_DELIVERY_COMPLETE (FERRY_OFI_COMPLETION=transmit for
 * FI_TRANSMIT_COMPLETE): with libfabric 1.17, transmit-complete reports a
 * write to a deregistered key as a success on tcp;ofi_rxm, and the data is
 * only known to be in the target's memory at delivery.
 *
 * Submit checks every slice's key before it posts anything: a key that
 * does not parse, or a slice outside the buffer the key names, refuses
 * the whole submit (the engine has already checked the range against the
 * owner-confirmed descriptor; this is the transport's own look).
 */
#include "ofi.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void op_link_locked(ferry_ofi_peer_t *p, ferry_ofi_op_t *op)
{
    op->prev = NULL;
    op->next = p->ops;
    if (p->ops != NULL)
        p->ops->prev = op;
    p->ops = op;
    if (p->posted++ == 0) {
        p->last_activity_ms = ferry_ofi_time_ms();
        atomic_fetch_add_explicit(&p->ofi->busy_peers, 1, memory_order_release);
    }
    atomic_store_explicit(&p->busy, p->posted, memory_order_relaxed);
}

static void op_unlink_locked(ferry_ofi_peer_t *p, ferry_ofi_op_t *op)
{
    if (op->prev != NULL)
        op->prev->next = op->next;
    else
        p->ops = op->next;
    if (op->next != NULL)
        op->next->prev = op->prev;
    op->prev = op->next = NULL;
    if (--p->posted == 0)
        atomic_fetch_sub_explicit(&p->ofi->busy_peers, 1, memory_order_release);
    atomic_store_explicit(&p->busy, p->posted, memory_order_relaxed);
}

ferry_ofi_op_t *ferry_ofi_op_pop(ferry_ofi_peer_t *p)
{
    pthread_mutex_lock(&p->lock);
    ferry_ofi_op_t *op = p->ops;
    if (op != NULL)
        op_unlink_locked(p, op);
    pthread_mutex_unlock(&p->lock);
    return op;
}

void ferry_ofi_op_complete(ferry_ofi_op_t *op, ferry_status_t status)
{
    ferry_ofi_t *ofi = op->peer->ofi;
    ferry_ofi_op_release_mr(ofi, op);
    ofi->svc.slice_done(op->slice, status);
    free(op);
}

/* What a CQ error entry means for the rest of the peer's ops: a refused
 * key or range is that op's alone; anything else (reset, timeout, the
 * peer gone) is the link's. */
static int error_is_the_ops_alone(int err)
{
    return err == FI_EACCES || err == FI_EKEYREJECTED || err == FI_EPERM;
}

unsigned ferry_ofi_peer_progress(ferry_ofi_peer_t *p)
{
    struct fi_cq_entry entries[FERRY_OFI_CQ_BATCH];
    ferry_slice_t *done = NULL, **tail = &done;
    ferry_ofi_op_t *done_ops[FERRY_OFI_CQ_BATCH];
    ferry_ofi_op_t *failed = NULL;
    ferry_status_t failed_status = FERRY_OK;
    char message[256] = "";
    unsigned count = 0;

    pthread_rwlock_rdlock(&p->ep_lock);
    if (p->cq == NULL) {
        pthread_rwlock_unlock(&p->ep_lock);
        return 0;
    }
    ssize_t n = fi_cq_read(p->cq, entries, FERRY_OFI_CQ_BATCH);
    if (n > 0) {
        pthread_mutex_lock(&p->lock);
        for (ssize_t i = 0; i < n; i++) {
            done_ops[i] = entries[i].op_context;
            op_unlink_locked(p, done_ops[i]);
        }
        p->last_activity_ms = ferry_ofi_time_ms();
        pthread_mutex_unlock(&p->lock);
        count = (unsigned)n;
    } else if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry err = {0};
        if (fi_cq_readerr(p->cq, &err, 0) == 1 && err.op_context != NULL) {
            failed = err.op_context;
            const char *text = fi_cq_strerror(p->cq, err.prov_errno, err.err_data, NULL, 0);
            snprintf(message, sizeof(message), "%s; provider: %s", fi_strerror(err.err),
                     text ? text : "?");
            failed_status = ferry_ofi_status(-err.err);
            if (failed_status == FERRY_ERR_CANCELED || failed_status == FERRY_OK)
                failed_status = FERRY_ERR_PEER_FAILED;
            pthread_mutex_lock(&p->lock);
            op_unlink_locked(p, failed);
            p->last_activity_ms = ferry_ofi_time_ms();
            pthread_mutex_unlock(&p->lock);
            if (error_is_the_ops_alone(err.err))
                ferry_error("ofi: %s %zu bytes at 0x%llx of %.80s: %s",
                            failed->slice->opcode == FERRY_OP_WRITE ? "write of" : "read of",
                            failed->slice->length,
                            (unsigned long long)failed->slice->remote_addr, p->endpoint, message);
            else
                failed_status = FERRY_ERR_PEER_FAILED;
        }
    }
    pthread_rwlock_unlock(&p->ep_lock);

    /* Taken off the list under the endpoint's read lock: ours alone now. */
    for (unsigned i = 0; i < count; i++) {
        ferry_ofi_op_release_mr(p->ofi, done_ops[i]);
        *tail = done_ops[i]->slice;
        tail = &done_ops[i]->slice->next;
        free(done_ops[i]);
    }
    *tail = NULL;
    ferry_transport_slices_done(&p->ofi->svc, done, FERRY_OK);
    if (failed != NULL) {
        int link = failed_status == FERRY_ERR_PEER_FAILED;
        ferry_ofi_op_complete(failed, failed_status);
        if (link)
            ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, message, 1);
        count++;
    }
    return count;
}

unsigned ferry_ofi_target_progress(ferry_ofi_t *ofi)
{
    struct fid_cq *cq = ofi->target_cq;
    if (cq == NULL)
        return 0;
    struct fi_cq_entry entries[4];
    ssize_t n = fi_cq_read(cq, entries, 4);
    if (n == -FI_EAVAIL) {
        struct fi_cq_err_entry err = {0};
        if (fi_cq_readerr(cq, &err, 0) == 1)
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

static ferry_status_t check_slices(const ferry_peer_t *peer, ferry_slice_t *slices)
{
    key_memo_t memo = {0};
    ferry_status_t status = FERRY_OK;
    for (ferry_slice_t *s = slices; s != NULL && status == FERRY_OK; s = s->next) {
        ferry_ofi_key_t *key;
        status = slice_key(&memo, s, &key);
        if (status != FERRY_OK)
            ferry_error("ofi: segment \"%s\": %s 0x%llx +%zu refused: %s", peer->name,
                        status == FERRY_ERR_OUT_OF_RANGE ? "range" : "key of",
                        (unsigned long long)s->remote_addr, s->length,
                        status == FERRY_ERR_OUT_OF_RANGE ? "outside its key's buffer"
                                                         : "the key does not parse");
    }
    free(memo.key.raw);
    return status;
}

/* Post one op (caller holds ep_lock for reading, the endpoint open). */
static int post(ferry_ofi_t *ofi, ferry_ofi_peer_t *p, ferry_ofi_op_t *op,
                const ferry_ofi_key_t *key)
{
    ferry_slice_t *slice = op->slice;
    void *desc = NULL;
    ferry_status_t status = ferry_ofi_local_desc(ofi, op, &desc);
    if (status != FERRY_OK)
        return -FI_ENOMEM;
    uint64_t rkey = key->key;
    if (key->raw != NULL && !op->raw_mapped) {
        int ret = fi_mr_map_raw(ofi->domain, key->base, key->raw, key->raw_length, &op->raw_key,
                                0);
        if (ret != 0)
            return ret;
        op->raw_mapped = 1;
    }
    if (op->raw_mapped)
        rkey = op->raw_key;
    uint64_t addr = (ofi->mr_mode & FI_MR_VIRT_ADDR) ? slice->remote_addr
                                                     : slice->remote_addr - key->base;
    struct iovec iov = {.iov_base = slice->local, .iov_len = slice->length};
    struct fi_rma_iov rma = {.addr = addr, .len = slice->length, .key = rkey};
    struct fi_msg_rma msg = {.msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = p->addr,
                             .rma_iov = &rma, .rma_iov_count = 1, .context = &op->context};
    if (slice->opcode == FERRY_OP_WRITE)
        return (int)fi_writemsg(p->ep, &msg, FI_COMPLETION | ofi->write_flags);
    return (int)fi_readmsg(p->ep, &msg, FI_COMPLETION);
}

/* Post one slice, waiting for room in the window; FERRY_OK once posted
 * (its completion finishes it), else the status it must be failed with. */
static ferry_status_t post_slice(ferry_ofi_t *ofi, ferry_ofi_peer_t *p, ferry_ofi_op_t *op,
                                 const ferry_ofi_key_t *key)
{
    uint64_t waiting_since = 0;
    for (;;) {
        pthread_rwlock_rdlock(&p->ep_lock);
        pthread_mutex_lock(&p->lock);
        ferry_status_t state = p->state == FERRY_OFI_PEER_OK && p->ep != NULL ? FERRY_OK : p->why;
        int room = p->posted < ofi->window;
        if (state == FERRY_OK && room)
            op_link_locked(p, op);
        pthread_mutex_unlock(&p->lock);
        if (state != FERRY_OK) {
            pthread_rwlock_unlock(&p->ep_lock);
            return state;
        }
        /* shm (libfabric 1.17) spins on a lock inside the peer's region to
         * post: a peer killed while it held that lock hangs the post for
         * good.  A look at its pidfd first narrows that to a peer that dies
         * in the microseconds between the look and the post. */
        if (room && ofi->silent_deaths && ferry_ofi_peer_dead(p)) {
            pthread_mutex_lock(&p->lock);
            op_unlink_locked(p, op);
            pthread_mutex_unlock(&p->lock);
            pthread_rwlock_unlock(&p->ep_lock);
            ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, "its process is gone", 0);
            continue;
        }
        int ret = room ? post(ofi, p, op, key) : -FI_EAGAIN;
        if (ret != 0 && room) {
            pthread_mutex_lock(&p->lock);
            op_unlink_locked(p, op);
            pthread_mutex_unlock(&p->lock);
            ferry_ofi_op_release_mr(ofi, op);
        }
        pthread_rwlock_unlock(&p->ep_lock);
        if (ret == 0)
            return FERRY_OK;
        if (ret != -FI_EAGAIN) {
            ferry_error("ofi: posting a %s of %zu bytes to %.80s: %s",
                        op->slice->opcode == FERRY_OP_WRITE ? "write" : "read",
                        op->slice->length, p->endpoint, fi_strerror(-ret));
            return ferry_ofi_status(ret);
        }
        /* The window or the provider's queue is full: complete something.
         * Bounded: with ops posted, the thread's sweep fails the peer after
         * the timeout; a queue that stays full with none of ours posted
         * (shm: a frozen peer's command queue) fails it here. */
        if (ferry_ofi_peer_progress(p) != 0) {
            waiting_since = 0;
            continue;
        }
        ferry_ofi_target_progress(ofi);
        uint64_t now = ferry_ofi_time_ms();
        unsigned bound = ofi->settings.timeout_ms ? ofi->settings.timeout_ms : 30000;
        if (waiting_since == 0) {
            waiting_since = now;
        } else if (now - waiting_since > bound) {
            char what[96];
            snprintf(what, sizeof(what), "its queue stayed full for %u ms", bound);
            ferry_ofi_peer_fail(p, FERRY_ERR_PEER_FAILED, what, 0);
        }
        sched_yield();
    }
}

ferry_status_t ferry_ofi_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices)
{
    ferry_ofi_t *ofi = ctx;
    ferry_status_t status = check_slices(peer, slices);
    if (status != FERRY_OK)
        return status;
    ferry_ofi_peer_t *p;
    status = ferry_ofi_peer_get(ofi, peer, &p);
    if (status != FERRY_OK)
        return status;
    key_memo_t memo = {0};
    ferry_slice_t *failed = NULL;
    ferry_status_t failed_status = FERRY_OK;
    ferry_slice_t *next;
    for (ferry_slice_t *slice = slices; slice != NULL; slice = next) {
        next = slice->next;
        slice->next = NULL;
        ferry_ofi_key_t *key = NULL;
        ferry_ofi_op_t *op = NULL;
        status = failed_status != FERRY_OK ? failed_status : slice_key(&memo, slice, &key);
        if (status == FERRY_OK && (op = calloc(1, sizeof(*op))) == NULL)
            status = FERRY_ERR_NO_MEMORY;
        if (status == FERRY_OK) {
            op->slice = slice;
            op->peer = p;
            status = post_slice(ofi, p, op, key);
            if (status != FERRY_OK)
                free(op);
        }
        if (status != FERRY_OK) {
            /* the rest of the run fails with it, as one chain */
            slice->next = failed;
            failed = slice;
            failed_status = status;
        }
    }
    free(memo.key.raw);
    ferry_ofi_wake(ofi);
    ferry_ofi_peer_put(p);
    ferry_transport_slices_done(&ofi->svc, failed, failed_status);
    return FERRY_OK;
}
