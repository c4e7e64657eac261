/*
 * ucx eager writes: a WRITE slice to a peer whose lanes only emulate RMA
 * (tcp here) goes as eager active messages that the target copies into
 * place and answers with an acknowledgement.  UCX's own emulation of a
 * completed put (put and flush) costs more messages, each a system call:
 * four for an 8 B write on UCX 1.13 (the put, its completion and a second
 * request/acknowledgement pair on the tcp lane).  Lanes with real RMA
 * (shared memory, CMA, verbs) keep ucp_put_nbx.
 *
 * A message longer than the lane's send segment UCX cuts into fragments,
 * and the target's UCX gathers them into a buffer of its own before our
 * handler runs: a copy more there, and a buffer as large as the message.
 * So a write goes in pieces of FERRY_UCX_EAGER_PIECE (60 KiB: with the
 * headers, one 64 KiB tcp segment each), which the handler copies straight
 * from the receive segment.  4 MiB writes over loopback went from 0.79-0.81x
 * to 0.96-1.08x of ucx_perftest given the same segment size (medians of two
 * series of interleaved runs).  Where several lanes carry the messages,
 * each piece would need its own acknowledgement: there a write stays one
 * message.
 *
 * The bytes go as a generic datatype we pack ourselves, which UCX always
 * copies into its send buffers: with a plain buffer UCX 1.13 sends a long
 * message zero-copy, and when the peer dies with such a send queued over
 * tcp it completes the request once for the failure and once more from
 * the socket's queue, and aborts the process on its own assertion
 * ("comp->count > 0", seen once in a killed-peer test).  Copying costs
 * 64 KiB writes about 15 % of their bandwidth over loopback.
 *
 * Acknowledgements.  Where one lane carries every active message of the
 * endpoint (ep->am_ordered: over tcp, one connection) the messages arrive
 * and are handled in posting order: UCX queues what a lane cannot send yet
 * in order behind what it is sending, and the target's handlers run as the
 * byte stream delivers.  (UCX's API promises no order in general: with
 * several lanes the fragments of different messages may take different
 * ones.)  There the eager writes of one submit share one acknowledgement:
 * every write carries its id, the last one asks for it (EAGER_ACK), and the
 * answer means the target handled them all.  Over tcp an acknowledgement
 * per write is a system call more on each side per write.  On an endpoint
 * with several such lanes every write asks for its own.
 *
 * Initiator: every eager write counts once in its group for UCX's send
 * completion (ferry_ucx_op_done), every acknowledgement once more (a
 * notify's too: ucx_am.c uses the same table and answer); an
 * acknowledgement is an entry in the worker's table, found by its id.
 * Whoever takes the entry out of the table finishes that count: the
 * acknowledgement, or the endpoint's close (which fails what is still
 * waiting).  An acknowledgement with an id we do not know (late,
 * duplicated, forged) is dropped.
 *
 * Target: the whole write's range must lie inside a live, remote-writable
 * registration (access_acquire), checked for each piece, else the piece is
 * not written and the acknowledgement says why; a refusal of a write that
 * asks for none waits in the worker's refusal ring for the run's last
 * write, and the rest of that run is not applied.
 */
#include "ucx.h"

#include <stdlib.h>
#include <string.h>

enum { EAGER_ACK = 1 }; /* eager_write_header_t.flags: answer (for this write and those before) */

/* One piece of a write: the target checks the whole write's range for every
 * piece, so a write it refuses leaves nothing behind. */
typedef struct eager_write_header {
    uint64_t addr;   /* of the write */
    uint64_t length; /* of the write */
    uint64_t offset; /* of this piece in the write */
    uint64_t id;     /* of the acknowledgement */
    uint32_t flags;
    uint32_t pad;
} eager_write_header_t;

/* What the packed datatype reads the bytes from. */
typedef struct pack_state {
    const unsigned char *bytes;
    size_t length;
} pack_state_t;

/* Per eager message (a piece of a write), in the group's payload until the
 * group is done: the header and the pack state outlive the send. */
typedef struct eager_slot {
    eager_write_header_t header;
    pack_state_t pack;
} eager_slot_t;

typedef struct eager_ack_header {
    uint64_t id;
    int32_t status; /* ferry_status_t: the first refusal of the writes it answers */
    int32_t pad;
} eager_ack_header_t;

struct ferry_ucx_eager {
    uint64_t id;
    ferry_ucx_ep_t *ep;
    ferry_ucx_group_t *group;
    struct ferry_ucx_eager *next; /* worker->lock */
};

/* The target's refusal, carried as a UCX status through the group. */
static ucs_status_t refusal_status(int32_t status)
{
    switch (status) {
    case FERRY_OK:
        return UCS_OK;
    case FERRY_ERR_OUT_OF_RANGE:
        return UCS_ERR_OUT_OF_RANGE;
    default:
        return UCS_ERR_REJECTED;
    }
}

/* Unlink *pp, keeping the table's tail right; caller holds w->lock. */
static ferry_ucx_eager_t *eager_unlink(ferry_ucx_worker_t *w, ferry_ucx_eager_t **pp)
{
    ferry_ucx_eager_t *entry = *pp;
    *pp = entry->next;
    if (w->eager_tail == &entry->next)
        w->eager_tail = pp;
    return entry;
}

/* Take the entry with that id out of the worker's table (NULL: none).  The
 * table is in posting order and one endpoint's acknowledgements come back
 * in that order, so the search mostly stops at the head. */
static ferry_ucx_eager_t *eager_take(ferry_ucx_worker_t *w, uint64_t id)
{
    pthread_mutex_lock(&w->lock);
    ferry_ucx_eager_t **pp = &w->eager;
    while (*pp != NULL && (*pp)->id != id)
        pp = &(*pp)->next;
    ferry_ucx_eager_t *entry = *pp != NULL ? eager_unlink(w, pp) : NULL;
    pthread_mutex_unlock(&w->lock);
    return entry;
}

/* ---- the packed datatype: a (buffer, length) copied out on demand ---- */

/* The "buffer" handed to ucp_am_send_nbx is the slot's pack state. */
static void *pack_start(void *context, const void *buffer, size_t count)
{
    (void)context, (void)count;
    return (void *)buffer;
}

static void *unpack_start(void *context, void *buffer, size_t count)
{
    (void)context, (void)buffer, (void)count;
    return NULL; /* we never receive into this datatype */
}

static size_t pack_size(void *state)
{
    return ((pack_state_t *)state)->length;
}

static size_t pack(void *state, size_t offset, void *dest, size_t max_length)
{
    pack_state_t *s = state;
    size_t n = offset < s->length ? FERRY_UCX_MIN(max_length, s->length - offset) : 0;
    if (n > 0)
        memcpy(dest, s->bytes + offset, n);
    return n;
}

static ucs_status_t unpack(void *state, size_t offset, const void *src, size_t length)
{
    (void)state, (void)offset, (void)src, (void)length;
    return UCS_ERR_UNSUPPORTED;
}

static void pack_finish(void *state)
{
    (void)state; /* the group's payload */
}

ferry_status_t ferry_ucx_eager_datatype_create(ferry_ucx_t *ucx)
{
    static const ucp_generic_dt_ops_t ops = {
        .start_pack = pack_start,
        .start_unpack = unpack_start,
        .packed_size = pack_size,
        .pack = pack,
        .unpack = unpack,
        .finish = pack_finish,
    };
    ucs_status_t status = ucp_dt_create_generic(&ops, NULL, &ucx->eager_dt);
    if (status != UCS_OK) {
        ferry_error("ucx: ucp_dt_create_generic failed: %s", ucs_status_string(status));
        return FERRY_ERR_NO_RESOURCE;
    }
    ucx->eager_dt_made = 1;
    return FERRY_OK;
}

void ferry_ucx_eager_datatype_destroy(ferry_ucx_t *ucx)
{
    if (ucx->eager_dt_made)
        ucp_dt_destroy(ucx->eager_dt);
    ucx->eager_dt_made = 0;
}

int ferry_ucx_eager_fits(const ferry_ucx_ep_t *ep, const ferry_slice_t *slice)
{
    return ep->rma_emulated && slice->opcode == FERRY_OP_WRITE &&
           slice->length <= ep->ucx->settings.eager_write;
}

/* The size of the pieces an eager write goes in (0: one message).  Only an
 * endpoint whose messages keep their order cuts: there one acknowledgement
 * answers all the pieces, elsewhere each would need its own. */
static size_t piece_size(const ferry_ucx_ep_t *ep)
{
    return ep->am_ordered ? ep->ucx->settings.eager_piece : 0;
}

static size_t pieces_of(const ferry_ucx_ep_t *ep, const ferry_slice_t *slice)
{
    size_t piece = piece_size(ep);
    return piece == 0 || slice->length <= piece ? 1 : (slice->length + piece - 1) / piece;
}

/* The eager messages of the submit from slice on: counted at its first
 * eager write, not before the submit's loop, so that a submit of copies
 * into attached memory walks its slices once.  The slices behind the one
 * being posted are still the caller's chain (the loop relinks only those it
 * is done with); one that then goes another way only leaves the count high,
 * and ferry_ucx_eager_run_end asks for the acknowledgement instead. */
static size_t eager_messages_from(const ferry_ucx_ep_t *ep, const ferry_slice_t *slice)
{
    size_t count = 0;
    for (const ferry_slice_t *s = slice; s != NULL; s = s->next)
        if (ferry_ucx_eager_fits(ep, s))
            count += pieces_of(ep, s);
    return count;
}

uint64_t ferry_ucx_ack_expect(ferry_ucx_group_t *group)
{
    ferry_ucx_ep_t *ep = group->ep;
    ferry_ucx_worker_t *w = ep->worker;
    ferry_ucx_eager_t *entry = malloc(sizeof(*entry));
    if (entry == NULL)
        return 0;
    pthread_mutex_lock(&w->lock);
    if (++w->eager_ids == 0)
        ++w->eager_ids; /* 0 means none */
    *entry = (ferry_ucx_eager_t){.id = w->eager_ids, .ep = ep, .group = group};
    *w->eager_tail = entry;
    w->eager_tail = &entry->next;
    pthread_mutex_unlock(&w->lock);
    atomic_fetch_add(&group->pending, 1); /* the acknowledgement */
    return entry->id;
}

/* Send one piece of a write (slice NULL: only the request for the
 * acknowledgement). */
static ucs_status_t eager_send(ferry_ucx_eager_run_t *run, ferry_ucx_group_t *group,
                               const ferry_slice_t *slice, size_t offset, size_t length, int ack)
{
    ferry_ucx_ep_t *ep = group->ep;
    eager_slot_t *slot = (eager_slot_t *)run->slots + run->used++;
    uint64_t id = run->open_id;
    slot->header = (eager_write_header_t){.id = id, .flags = ack ? EAGER_ACK : 0};
    slot->pack = (pack_state_t){NULL, 0};
    if (slice != NULL) {
        slot->header.addr = slice->remote_addr;
        slot->header.length = slice->length;
        slot->header.offset = offset;
        slot->pack = (pack_state_t){(const unsigned char *)slice->local + offset, length};
    }
    if (ack)
        run->open_id = 0;
    atomic_fetch_add(&group->pending, 1); /* the send */
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_DATATYPE,
        .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
        .cb.send = ferry_ucx_op_done,
        .user_data = group,
        .datatype = ep->ucx->eager_dt, /* count: the length in bytes */
    };
    ucs_status_ptr_t request = ucp_am_send_nbx(ep->ep, FERRY_UCX_AM_WRITE, &slot->header,
                                               sizeof(slot->header), &slot->pack, length, &param);
    if (UCS_PTR_IS_PTR(request))
        return UCS_OK;
    ucs_status_t status = UCS_PTR_STATUS(request);
    ferry_ucx_group_unref_op(group, status); /* the send's count */
    if (status != UCS_OK && ack)
        ferry_ucx_ack_forget(group, id, status);
    return status;
}

void ferry_ucx_ack_forget(ferry_ucx_group_t *group, uint64_t id, ucs_status_t status)
{
    ferry_ucx_eager_t *entry = eager_take(group->ep->worker, id);
    if (entry == NULL)
        return; /* the endpoint's close took it and finished its count */
    free(entry);
    ferry_ucx_group_unref_op(group, status);
}

ucs_status_t ferry_ucx_eager_post(ferry_ucx_eager_run_t *run, ferry_ucx_group_t *group,
                                  const ferry_slice_t *slice)
{
    if (run->slots == NULL) {
        run->left = eager_messages_from(group->ep, slice);
        if ((run->slots = malloc((run->left + 1) * sizeof(eager_slot_t))) == NULL) {
            ferry_ucx_group_fail(group, UCS_ERR_NO_MEMORY);
            return UCS_ERR_NO_MEMORY;
        }
        group->payload = run->slots; /* headers and pack states outlive the sends */
    }
    size_t piece = piece_size(group->ep), offset = 0;
    ucs_status_t status;
    do {
        if (run->open_id == 0 && (run->open_id = ferry_ucx_ack_expect(group)) == 0) {
            ferry_ucx_group_fail(group, UCS_ERR_NO_MEMORY); /* the slice fails with the group */
            return UCS_ERR_NO_MEMORY;
        }
        size_t length = slice->length - offset;
        if (piece != 0 && length > piece)
            length = piece;
        run->left--;
        int ack = run->left == 0 || !group->ep->am_ordered;
        status = eager_send(run, group, slice, offset, length, ack);
        offset += length;
    } while (status == UCS_OK && offset < slice->length);
    return status;
}

void ferry_ucx_eager_run_end(ferry_ucx_eager_run_t *run, ferry_ucx_group_t *group)
{
    if (run->open_id != 0) /* an error stopped the run before its last write */
        eager_send(run, group, NULL, 0, 0, 1);
}

void ferry_ucx_eager_fail_ep(ferry_ucx_ep_t *ep)
{
    ferry_ucx_worker_t *w = ep->worker;
    ferry_ucx_eager_t *failed = NULL;
    pthread_mutex_lock(&w->lock);
    for (ferry_ucx_eager_t **pp = &w->eager; *pp != NULL;) {
        if ((*pp)->ep == ep) {
            ferry_ucx_eager_t *entry = eager_unlink(w, pp);
            entry->next = failed;
            failed = entry;
        } else {
            pp = &(*pp)->next;
        }
    }
    pthread_mutex_unlock(&w->lock);
    for (ferry_ucx_eager_t *entry = failed, *next; entry != NULL; entry = next) {
        next = entry->next;
        ferry_ucx_group_unref_op(entry->group, UCS_ERR_CANCELED);
        free(entry);
    }
}

static ucs_status_t ack_received(void *arg, const void *header, size_t header_length,
                                 void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ferry_ucx_worker_t *w = arg;
    eager_ack_header_t ack;
    if (header_length != sizeof(ack)) {
        ferry_warn("ucx: dropped a write acknowledgement with a %zu-byte header", header_length);
        return UCS_OK;
    }
    memcpy(&ack, header, sizeof(ack));
    ferry_ucx_eager_t *entry = eager_take(w, ack.id);
    if (entry == NULL) {
        ferry_debug("ucx: acknowledgement of unknown write %llu dropped",
                    (unsigned long long)ack.id);
        return UCS_OK;
    }
    atomic_store_explicit(&entry->ep->last_activity_ms, ferry_ucx_time_ms(),
                          memory_order_relaxed);
    ferry_ucx_group_unref_op(entry->group, refusal_status(ack.status));
    free(entry);
    return UCS_OK;
}

void ferry_ucx_ack_send(ucp_ep_h reply_ep, uint64_t id, ferry_status_t status)
{
    eager_ack_header_t *ack = malloc(sizeof(*ack));
    if (ack == NULL) {
        ferry_warn("ucx: no memory to acknowledge write %llu", (unsigned long long)id);
        return;
    }
    *ack = (eager_ack_header_t){.id = id, .status = (int32_t)status};
    /* A lost one: the initiator's deadline fails the write. */
    ferry_ucx_am_send_header(reply_ep, FERRY_UCX_AM_WRITE_ACK, ack, sizeof(*ack));
}

/* The refusal kept for (reply_ep, id), or NULL; caller holds w->lock. */
static struct ferry_ucx_refusal *refusal_find(ferry_ucx_worker_t *w, ucp_ep_h reply_ep,
                                              uint64_t id)
{
    for (unsigned i = 0; i < FERRY_UCX_REFUSALS_MAX; i++)
        if (w->refusals[i].reply_ep == reply_ep && w->refusals[i].id == id)
            return &w->refusals[i];
    return NULL;
}

/* A write that asks for no acknowledgement was refused: keep the refusal
 * for the run's last write (the run's first refusal stands).  The ring
 * holds FERRY_UCX_REFUSALS_MAX runs; an initiator that never finishes its
 * runs (dead, or not ours) only pushes the oldest out. */
static void refusal_keep(ferry_ucx_worker_t *w, ucp_ep_h reply_ep, uint64_t id,
                         ferry_status_t status)
{
    pthread_mutex_lock(&w->lock);
    if (refusal_find(w, reply_ep, id) == NULL) {
        struct ferry_ucx_refusal *slot =
            &w->refusals[w->refusals_next++ % FERRY_UCX_REFUSALS_MAX];
        if (slot->reply_ep != NULL)
            ferry_warn("ucx: more than %u runs of eager writes with a refusal are waiting for "
                       "their last write; the oldest is forgotten", FERRY_UCX_REFUSALS_MAX);
        else
            atomic_fetch_add(&w->refusals_kept, 1);
        *slot = (struct ferry_ucx_refusal){reply_ep, id, (int32_t)status};
    }
    pthread_mutex_unlock(&w->lock);
}

/* The refusal kept for the run (reply_ep, id), if any, else FERRY_OK; take:
 * forget it (the run's last write).  Every write looks and refusals are
 * rare: no lock, no scan while none is kept. */
static ferry_status_t refusal_kept(ferry_ucx_worker_t *w, ucp_ep_h reply_ep, uint64_t id,
                                   int take)
{
    if (atomic_load(&w->refusals_kept) == 0)
        return FERRY_OK;
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&w->lock);
    struct ferry_ucx_refusal *kept = refusal_find(w, reply_ep, id);
    if (kept != NULL) {
        status = (ferry_status_t)kept->status;
        if (take) {
            *kept = (struct ferry_ucx_refusal){0};
            atomic_fetch_sub(&w->refusals_kept, 1);
        }
    }
    pthread_mutex_unlock(&w->lock);
    return status;
}

/* Copy one piece into place if its whole write lies inside a live,
 * remote-writable registration; else say why. */
static ferry_status_t write_apply(const ferry_transport_services_t *svc,
                                  const eager_write_header_t *hdr, const void *data,
                                  size_t length, const ucp_am_recv_param_t *param)
{
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) { /* we send eager only */
        ferry_warn("ucx: refused a rendezvous eager write of %zu bytes", length);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (hdr->length == 0 && length == 0)
        return FERRY_OK; /* only a request for the acknowledgement */
    if (hdr->offset > hdr->length || length > hdr->length - hdr->offset) {
        ferry_warn("ucx: refused an eager write piece [+%llu, +%zu) outside its write of %llu "
                   "bytes", (unsigned long long)hdr->offset, length,
                   (unsigned long long)hdr->length);
        return FERRY_ERR_INVALID_PARAM;
    }
    void *token;
    ferry_status_t status = svc->access_acquire(svc->engine, hdr->addr, hdr->length,
                                                FERRY_ACCESS_WRITE, &token);
    if (status == FERRY_OK) {
        memcpy((void *)(uintptr_t)(hdr->addr + hdr->offset), data, length);
        svc->access_release(svc->engine, token);
    }
    return status;
}

static ucs_status_t write_received(void *arg, const void *header, size_t header_length,
                                   void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ferry_ucx_worker_t *w = arg;
    eager_write_header_t hdr;
    if (header_length != sizeof(hdr) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        ferry_warn("ucx: dropped a malformed eager write (%zu-byte header)", header_length);
        return UCS_OK;
    }
    memcpy(&hdr, header, sizeof(hdr));
    int last = (hdr.flags & EAGER_ACK) != 0;
    /* A run with a refusal fails as a whole: the rest of it is not applied
     * (nor refused, and logged, piece by piece). */
    ferry_status_t status = refusal_kept(w, param->reply_ep, hdr.id, last);
    if (status == FERRY_OK)
        status = write_apply(&w->ucx->svc, &hdr, data, length, param);
    if (!last) {
        if (status != FERRY_OK)
            refusal_keep(w, param->reply_ep, hdr.id, status);
        return UCS_OK;
    }
    ferry_ucx_ack_send(param->reply_ep, hdr.id, status);
    return UCS_OK;
}

ferry_status_t ferry_ucx_eager_register(ferry_ucx_worker_t *w)
{
    const struct {
        unsigned id;
        ucp_am_recv_callback_t cb;
    } handlers[] = {{FERRY_UCX_AM_WRITE, write_received}, {FERRY_UCX_AM_WRITE_ACK, ack_received}};
    for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]); i++) {
        ferry_status_t status = ferry_ucx_am_handler_set(w, handlers[i].id, handlers[i].cb);
        if (status != FERRY_OK)
            return status;
    }
    return FERRY_OK;
}

void ferry_ucx_eager_fini(ferry_ucx_worker_t *w)
{
    for (ferry_ucx_eager_t *entry = w->eager, *next; entry != NULL; entry = next) {
        next = entry->next;
        free(entry);
    }
    w->eager = NULL;
    w->eager_tail = &w->eager;
}
