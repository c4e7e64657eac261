/*
 * The lane: the one initiator endpoint (own CQ and AV) that every peer's
 * ops are posted on, and its replacement when a peer goes silent.
 *
 * Why a fence and not fi_av_remove (libfabric 1.17, README.md "Faults"):
 * removing a silent peer's address stops nothing (rxm still read a write
 * source and wrote a read destination after it; shm crashed in
 * fi_cq_read once the peer ran again).  Closing the endpoint is what makes
 * the provider let go of the local buffers of ops still posted: rxm then
 * reports every unfinished op, of every peer, as FI_ECANCELED in the old
 * CQ (which stays readable); shm drops them without a word.  So a fence
 * closes the lane, fails the silent peer's ops (and those of any other
 * failed peer), puts every other peer's unfinished ops back to pending
 * (RMA is idempotent, and none of them was reported yet), and swaps in a
 * fresh lane; peers' addresses are inserted into it again on first use.
 *
 * Parking: closing an rxm endpoint that holds a connection attempt to a
 * peer killed before the connection came up, or reads posted to a peer
 * that stopped answering, crashed libfabric 1.17 inside fi_close (must_park
 * says when).  Such a lane is parked: never closed
 * and never progressed again (data progress is manual, so rxm touches our
 * buffers only inside our own calls on it); its endpoint, CQ and AV, and
 * with them the domain, the fabric and the target endpoint, stay open
 * until the process exits (ofi_context.c keeps them reachable).
 */
#include "ofi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void close_quietly(struct fid *fid, const char *what)
{
    int ret = fid != NULL ? fi_close(fid) : 0;
    if (ret != 0)
        ferry_warn("ofi: closing the lane's %s: %s", what, fi_strerror(-ret));
}

static void lane_free(ferry_ofi_lane_t *lane)
{
    if (lane == NULL)
        return;
    close_quietly(lane->ep ? &lane->ep->fid : NULL, "endpoint");
    close_quietly(lane->av ? &lane->av->fid : NULL, "address vector");
    close_quietly(lane->cq ? &lane->cq->fid : NULL, "completion queue");
    free(lane);
}

static ferry_ofi_lane_t *lane_open(ferry_ofi_t *ofi)
{
    ferry_ofi_lane_t *lane = calloc(1, sizeof(*lane));
    if (lane == NULL)
        return NULL;
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
    int ret = fi_cq_open(ofi->domain, &cq_attr, &lane->cq, NULL);
    if (ret != 0) {
        ferry_error("ofi: fi_cq_open (initiator endpoint): %s", fi_strerror(-ret));
        free(lane);
        return NULL;
    }
    if (ferry_ofi_endpoint_open(ofi, lane->cq, NULL, &lane->av, &lane->ep,
                                "initiator endpoint") !=
        FERRY_OK) {
        lane_free(lane);
        return NULL;
    }
    lane->id = atomic_fetch_add(&ofi->lanes_opened, 1) + 1;
    return lane;
}

/* Everybody shut out of ofi->lane: the posters (lane_lock's write hold),
 * then its CQ's reader (the claim, taken after the write lock and before
 * any other lock: ofi.h, "Lane references").  The fence and stop swap or
 * close the lane only between these two. */
static void lane_shut(ferry_ofi_t *ofi)
{
    pthread_rwlock_wrlock(&ofi->lane_lock);
    ferry_ofi_lane_claim(ofi);
}

static void lane_open_up(ferry_ofi_t *ofi)
{
    ferry_ofi_lane_unclaim(ofi);
    pthread_rwlock_unlock(&ofi->lane_lock);
}

ferry_status_t ferry_ofi_lane_start(ferry_ofi_t *ofi)
{
    ofi->lane = lane_open(ofi);
    return ofi->lane != NULL ? FERRY_OK : FERRY_ERR_CONNECT;
}

int ferry_ofi_lane_address(ferry_ofi_t *ofi, ferry_ofi_lane_t *lane, ferry_ofi_peer_t *p)
{
    (void)ofi;
    if (p->lane_id == lane->id)
        return 0;
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    int ret = fi_av_insert(lane->av, p->address, 1, &addr, 0, NULL);
    if (ret != 1)
        return ret < 0 ? ret : -FI_EADDRNOTAVAIL;
    p->addr = addr;
    p->lane_id = lane->id;
    p->attempted = 0;
    p->connected = 0;
    return 0;
}

void ferry_ofi_lane_suspect(ferry_ofi_t *ofi, uint64_t lane_id)
{
    if (!ofi->park_on_silence)
        return;
    pthread_rwlock_rdlock(&ofi->lane_lock);
    if (ofi->lane != NULL && ofi->lane->id == lane_id)
        atomic_store(&ofi->lane->suspect, 1);
    pthread_rwlock_unlock(&ofi->lane_lock);
}

/* Whether closing the lane could crash (tcp;ofi_rxm, libfabric 1.17), as
 * seen: a peer failed here while rxm was still connecting to it (lane
 * suspect), or a peer we cannot see alive (another host, or gone) has
 * posts refused and none accepted (the probe, 3 crashes in 34), or
 * operations are posted to a peer that stopped answering without rxm
 * noticing (a frozen peer, or a killed one before the reset arrived:
 * SIGSEGV at 0x20 inside fi_close, with reads in test_ofi's frozen-peer
 * read test and 1 run in 5 with per-peer endpoints, and with writes in
 * its frozen-peer-among-healthy-ones test under ASan).  When stopping,
 * any read posted counts: the engine does not know which peer would
 * answer.  Caller holds lane_lock for writing and ofi->lock. */
static int must_park(ferry_ofi_t *ofi, ferry_ofi_lane_t *lane, int stopping)
{
    if (!ofi->park_on_silence)
        return 0;
    if (atomic_load(&lane->suspect))
        return 1;
    int park = 0;
    for (ferry_ofi_peer_t *p = ofi->peers; p != NULL && !park; p = p->next) {
        pthread_mutex_lock(&p->lock);
        int here = p->lane_id == lane->id;
        int connecting = here && p->attempted && !p->connected;
        int silent = here && p->state != FERRY_OFI_PEER_OK && p->posted_ops != NULL;
        int reads = 0;
        if (here && stopping)
            for (ferry_ofi_op_t *op = p->posted_ops; op != NULL && !reads; op = op->next)
                reads = op->slice->opcode == FERRY_OP_READ;
        pthread_mutex_unlock(&p->lock);
        park = silent || reads || (connecting && (p->pid == 0 || ferry_ofi_peer_dead(p)));
    }
    return park;
}

static void park(ferry_ofi_t *ofi, ferry_ofi_lane_t *lane)
{
    ferry_ofi_parked_t *parked = calloc(1, sizeof(*parked));
    if (parked == NULL) {
        ferry_error("ofi: no memory to park a lane: closing it");
        lane_free(lane);
        return;
    }
    *parked = (ferry_ofi_parked_t){.ep = lane->ep, .cq = lane->cq, .av = lane->av,
                                   .next = ofi->parked};
    ofi->parked = parked;
    ferry_warn("ofi: lane %llu is parked, not closed (operations posted to a silent peer, or a "
               "connection attempt to a failed one: libfabric 1.17's rxm may crash closing "
               "it); its memory stays until the process exits", (unsigned long long)lane->id);
    free(lane);
}

/* Take a chain (by next) of every op of the lane still posted: those the
 * old CQ gave back after the close first (done: OK ones, chained on *ok),
 * then what is still on the peers' lists.  Unfinished ops of healthy peers
 * go back to pending (unless stopping); the rest is returned to be failed.
 * Caller has shut everybody out (lane_shut) and holds ofi->lock. */
static ferry_ofi_op_t *sort_ops(ferry_ofi_t *ofi, ferry_ofi_lane_t *lane, int drain,
                                int stopping, ferry_ofi_op_t **ok, unsigned *requeued_p)
{
    ferry_ofi_op_t *failed = NULL;
    unsigned requeued = 0;
    *ok = NULL;
    struct fi_cq_entry entries[FERRY_OFI_CQ_BATCH];
    for (int rounds = 0; drain && rounds < 1024; rounds++) {
        ssize_t n = fi_cq_read(lane->cq, entries, FERRY_OFI_CQ_BATCH);
        if (n == -FI_EAVAIL) {
            struct fi_cq_err_entry err = {0};
            if (fi_cq_readerr(lane->cq, &err, 0) != 1)
                break;
            continue; /* unfinished: still on its peer's list, sorted below */
        }
        if (n <= 0)
            break;
        for (ssize_t i = 0; i < n; i++) {
            ferry_ofi_op_t *op = entries[i].op_context;
            if (op == NULL)
                continue;
            pthread_mutex_lock(&op->peer->lock);
            ferry_ofi_posted_unlink(op->peer, op);
            op->peer->last_activity_ms = ferry_ofi_time_ms();
            pthread_mutex_unlock(&op->peer->lock);
            op->next = *ok;
            *ok = op;
        }
    }
    for (ferry_ofi_peer_t *p = ofi->peers; p != NULL; p = p->next) {
        pthread_mutex_lock(&p->lock);
        int keep = !stopping && p->state == FERRY_OFI_PEER_OK;
        ferry_ofi_op_t *op;
        while ((op = p->posted_ops) != NULL) {
            ferry_ofi_posted_unlink(p, op);
            if (keep) {
                ferry_ofi_op_release_local(op); /* bound to the old lane */
                ferry_ofi_pending_push_front(p, op);
                requeued++;
            } else {
                op->next = failed;
                failed = op;
            }
        }
        if (stopping) {
            while ((op = ferry_ofi_pending_pop(p)) != NULL) {
                op->next = failed;
                failed = op;
            }
        }
        if (keep)
            p->last_activity_ms = ferry_ofi_time_ms(); /* a fresh deadline on the fresh lane */
        p->lane_id = 0;
        pthread_mutex_unlock(&p->lock);
    }
    *requeued_p = requeued;
    return failed;
}

/* Close (or park) the lane, everybody shut out (lane_shut), and sort its
 * ops; the caller finishes them once no lock is held. */
static ferry_ofi_op_t *retire(ferry_ofi_t *ofi, ferry_ofi_lane_t *lane, int stopping,
                              ferry_ofi_op_t **ok, unsigned *requeued_p, int *parked_p)
{
    pthread_mutex_lock(&ofi->lock);
    int parking = must_park(ofi, lane, stopping);
    int ret = 0;
    if (!parking && lane->ep != NULL) {
        ret = fi_close(&lane->ep->fid);
        if (ret != 0)
            ferry_warn("ofi: closing lane %llu: %s", (unsigned long long)lane->id,
                       fi_strerror(-ret));
        lane->ep = NULL;
    }
    /* A parked lane's CQ is never read again: its ops are sorted from
     * our own lists, as shm's vanished ones are. */
    ferry_ofi_op_t *failed = sort_ops(ofi, lane, !parking, stopping, ok, requeued_p);
    pthread_mutex_unlock(&ofi->lock);
    if (parking) {
        pthread_mutex_lock(&ofi->lock);
        park(ofi, lane);
        pthread_mutex_unlock(&ofi->lock);
    } else {
        lane_free(lane);
    }
    *parked_p = parking;
    return failed;
}

void ferry_ofi_lane_fence(ferry_ofi_t *ofi, uint64_t lane_id, const char *why)
{
    lane_shut(ofi);
    ferry_ofi_lane_t *old = ofi->lane;
    if (old == NULL || old->id != lane_id) {
        lane_open_up(ofi); /* replaced, or being replaced, already */
        return;
    }
    ferry_ofi_op_t *ok = NULL;
    unsigned requeued = 0;
    int parked = 0;
    ferry_ofi_op_t *failed = retire(ofi, old, 0, &ok, &requeued, &parked);
    /* No lane while the fresh one opens (a fresh rxm lane takes ~230 ms):
     * pumps leave ops pending meanwhile, and the silent peer's ops fail
     * now rather than after the opening. */
    ofi->lane = NULL;
    atomic_fetch_add(&ofi->lanes_closed, 1);
    lane_open_up(ofi);

    unsigned failed_count = 0;
    for (ferry_ofi_op_t *op = failed; op != NULL; op = op->next)
        failed_count++;
    ferry_ofi_ops_finish(ofi, ok, FERRY_OK);
    /* each failed op's peer says why (its first failure's status) */
    while (failed != NULL) {
        ferry_ofi_op_t *op = failed;
        failed = op->next;
        op->next = NULL;
        pthread_mutex_lock(&op->peer->lock);
        ferry_status_t status = op->peer->state == FERRY_OFI_PEER_OK ? FERRY_ERR_PEER_FAILED
                                                                     : op->peer->why;
        pthread_mutex_unlock(&op->peer->lock);
        ferry_ofi_ops_finish(ofi, op, status);
    }

    ferry_ofi_lane_t *fresh = lane_open(ofi);
    lane_shut(ofi);
    if (fresh != NULL && !atomic_load(&ofi->stop) && ofi->lane == NULL) {
        ofi->lane = fresh;
        fresh = NULL;
    }
    int swapped = fresh == NULL && ofi->lane != NULL;
    lane_open_up(ofi);
    if (swapped) {
        /* the time without a lane does not count against anybody's
         * deadline (a fresh rxm lane took 2.5 s under ThreadSanitizer) */
        uint64_t now = ferry_ofi_time_ms();
        pthread_mutex_lock(&ofi->lock);
        for (ferry_ofi_peer_t *p = ofi->peers; p != NULL; p = p->next) {
            pthread_mutex_lock(&p->lock);
            if (p->pending != 0)
                p->last_activity_ms = now;
            pthread_mutex_unlock(&p->lock);
        }
        pthread_mutex_unlock(&ofi->lock);
    }
    lane_free(fresh); /* stopping meanwhile: not wanted */
    ferry_warn("ofi: lane %llu %s (%s): %u operations of failed peers fail, %u of other "
               "peers are posted again on %s", (unsigned long long)lane_id,
               parked ? "parked" : "closed", why, failed_count, requeued,
               swapped ? "a fresh lane" : "no lane (opening one failed, or the engine stops)");
    if (!swapped) {
        /* nothing can be posted: every peer with ops fails them */
        size_t count = 0;
        ferry_ofi_peer_t **busy = ferry_ofi_peers_busy(ofi, &count);
        for (size_t i = 0; i < count; i++) {
            ferry_ofi_peer_fail(busy[i], FERRY_ERR_PEER_FAILED, "no lane to post on", 1);
            ferry_ofi_peer_put(busy[i]);
        }
        free(busy);
    }
    ferry_ofi_wake(ofi); /* the thread posts what went back to pending */
}

void ferry_ofi_lane_stop(ferry_ofi_t *ofi)
{
    lane_shut(ofi);
    ferry_ofi_lane_t *lane = ofi->lane;
    ofi->lane = NULL;
    ferry_ofi_op_t *ok = NULL, *failed = NULL;
    unsigned requeued = 0;
    int parked = 0;
    if (lane != NULL) {
        failed = retire(ofi, lane, 1, &ok, &requeued, &parked);
    } else {
        /* no lane (a fresh one failed to open): only pending ops are left */
        pthread_mutex_lock(&ofi->lock);
        for (ferry_ofi_peer_t *p = ofi->peers; p != NULL; p = p->next) {
            pthread_mutex_lock(&p->lock);
            ferry_ofi_op_t *op;
            while ((op = ferry_ofi_pending_pop(p)) != NULL) {
                op->next = failed;
                failed = op;
            }
            pthread_mutex_unlock(&p->lock);
        }
        pthread_mutex_unlock(&ofi->lock);
    }
    lane_open_up(ofi);
    ferry_ofi_ops_finish(ofi, ok, FERRY_OK);
    ferry_ofi_ops_finish(ofi, failed, FERRY_ERR_CANCELED);
}
