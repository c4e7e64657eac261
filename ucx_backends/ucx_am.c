/*
 * ucx active messages: notifies (ops->notify) and the hello an initiator
 * sends on a new endpoint, which tells the target our RPC endpoint so its
 * unregister invalidates our cached descriptor whatever the metadata store.
 * Both are eager (a single message delivered in the target's progress
 * thread); the engine sends a batch's notify only once its data completed.
 *
 * A notify is answered: the target's handler queues it with its engine and
 * then sends the acknowledgement eager writes use (ucx_eager.c), so
 * ferry_notify_send and ferry_batch_wait return once the owner has it
 * queued, as ferry.h says.  UCX's completion of the send, or of a flush
 * behind it, means only that the bytes reached the peer's receive queue
 * (its FIFO, its socket): a receiver polling right after a barrier could
 * find nothing yet (seen once in four mpi4py runs).
 */
#include "ucx.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The active message's header is the acknowledgement's id followed by the
 * sender's segment name; the message is the data. */
typedef struct notify_payload {
    uint64_t id;
    char from[FERRY_UCX_NAME_MAX + 1];
    unsigned char msg[];
} notify_payload_t;

static size_t copy_text(char *dst, size_t cap, const void *src, size_t length)
{
    size_t n = FERRY_UCX_MIN(length, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
    return n;
}

/* The notify's refusal (FERRY_OK: queued with our engine). */
static ferry_status_t notify_deliver(ferry_ucx_worker_t *w, const char *from, const void *data,
                                     size_t length, const ucp_am_recv_param_t *param)
{
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* Our notifies are eager; returning without receiving drops it. */
        ferry_warn("ucx: dropped a rendezvous notify of %zu bytes", length);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (length > FERRY_NOTIFY_MAX) {
        ferry_warn("ucx: dropped a notify of %zu bytes (FERRY_NOTIFY_MAX is %d)", length,
                   FERRY_NOTIFY_MAX);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (w->ucx->svc.notify_deliver != NULL)
        w->ucx->svc.notify_deliver(w->ucx->svc.engine, from, data, length);
    return FERRY_OK;
}

static ucs_status_t notify_received(void *arg, const void *header, size_t header_length,
                                    void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ferry_ucx_worker_t *w = arg;
    uint64_t id;
    if (header_length < sizeof(id) || !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        ferry_warn("ucx: dropped a malformed notify (%zu-byte header)", header_length);
        return UCS_OK;
    }
    memcpy(&id, header, sizeof(id));
    char from[FERRY_UCX_NAME_MAX + 1];
    copy_text(from, sizeof(from), (const char *)header + sizeof(id), header_length - sizeof(id));
    ferry_ucx_ack_send(param->reply_ep, id, notify_deliver(w, from, data, length, param));
    return UCS_OK;
}

static ucs_status_t hello_received(void *arg, const void *header, size_t header_length,
                                   void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ferry_ucx_worker_t *w = arg;
    char rpc[FERRY_UCX_NAME_MAX + 1];
    copy_text(rpc, sizeof(rpc), header, header_length);
    if (rpc[0] != '\0' && w->ucx->svc.peer_seen != NULL)
        w->ucx->svc.peer_seen(w->ucx->svc.engine, rpc);
    return UCS_OK;
}

ferry_status_t ferry_ucx_am_handler_set(ferry_ucx_worker_t *w, unsigned id,
                                        ucp_am_recv_callback_t cb)
{
    ucp_am_handler_param_t param = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                      UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS,
        .id = id,
        .cb = cb,
        .arg = w,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
    };
    ucs_status_t status = ucp_worker_set_am_recv_handler(w->worker, &param);
    if (status != UCS_OK) {
        ferry_error("ucx: cannot register active message handler %u: %s", id,
                    ucs_status_string(status));
        return FERRY_ERR_NO_RESOURCE;
    }
    return FERRY_OK;
}

ferry_status_t ferry_ucx_am_register(ferry_ucx_worker_t *w)
{
    ferry_status_t status = ferry_ucx_am_handler_set(w, FERRY_UCX_AM_NOTIFY, notify_received);
    if (status == FERRY_OK)
        status = ferry_ucx_am_handler_set(w, FERRY_UCX_AM_HELLO, hello_received);
    if (status == FERRY_OK)
        status = ferry_ucx_eager_register(w);
    return status;
}

static void sent_free_header(void *request, ucs_status_t status, void *user_data)
{
    ucp_request_free(request);
    free(user_data);
}

void ferry_ucx_am_send_header(ucp_ep_h ep, unsigned id, void *header, size_t header_length)
{
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_AM_SEND_FLAG_EAGER,
        .cb.send = sent_free_header,
        .user_data = header,
    };
    ucs_status_ptr_t request = ucp_am_send_nbx(ep, id, header, header_length, NULL, 0, &param);
    if (!UCS_PTR_IS_PTR(request))
        free(header); /* sent already, or failed */
}

void ferry_ucx_send_hello(ferry_ucx_ep_t *ep)
{
    const char *rpc = ep->ucx->svc.rpc_endpoint;
    if (rpc == NULL || *rpc == '\0' || strlen(rpc) > FERRY_UCX_NAME_MAX)
        return;
    char *header = strdup(rpc);
    if (header == NULL)
        return;
    ferry_lock_acquire(&ep->lock);
    if (!ep->closed)
        ferry_ucx_am_send_header(ep->ep, FERRY_UCX_AM_HELLO, header, strlen(header));
    else
        free(header);
    ferry_lock_release(&ep->lock);
}

ferry_status_t ferry_ucx_notify(void *ctx, const ferry_peer_t *peer, const char *from,
                                const void *msg, size_t length)
{
    ferry_ucx_t *ucx = ctx;
    if (length > FERRY_NOTIFY_MAX || (msg == NULL && length > 0))
        return FERRY_ERR_INVALID_PARAM;
    ferry_ucx_ep_t *ep;
    ferry_status_t result = ferry_ucx_ep_get(ucx, peer, &ep);
    if (result != FERRY_OK)
        return result;
    notify_payload_t *payload = malloc(sizeof(*payload) + (length ? length : 1));
    ferry_ucx_waiter_t *waiter = calloc(1, sizeof(*waiter));
    if (payload == NULL || waiter == NULL) {
        free(payload);
        free(waiter);
        ferry_ucx_ep_unref(ep);
        return FERRY_ERR_NO_MEMORY;
    }
    size_t header_length = sizeof(payload->id) +
                           copy_text(payload->from, sizeof(payload->from), from ? from : "",
                                     from ? strlen(from) : 0);
    if (length)
        memcpy(payload->msg, msg, length);
    pthread_mutex_init(&waiter->lock, NULL);
    pthread_cond_init(&waiter->cond, NULL);
    atomic_init(&waiter->refs, 2);

    ferry_lock_acquire(&ep->lock);
    ferry_ucx_group_t *group = NULL;
    if (!ep->closed && atomic_load(&ep->failed) == 0)
        group = ferry_ucx_group_new(ep);
    if (group == NULL) {
        ferry_lock_release(&ep->lock);
        free(payload);
        pthread_cond_destroy(&waiter->cond);
        pthread_mutex_destroy(&waiter->lock);
        free(waiter);
        ferry_ucx_ep_unref(ep);
        return FERRY_ERR_PEER_FAILED;
    }
    /* The group owns the payload and one waiter reference from here on; it
     * is done once UCX sent the message and the peer's answer came (or the
     * endpoint closed). */
    group->payload = payload;
    group->waiter = waiter;
    payload->id = ferry_ucx_ack_expect(group);
    if (payload->id == 0) {
        ferry_ucx_group_fail(group, UCS_ERR_NO_MEMORY);
    } else {
        ucp_request_param_t param = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                            UCP_OP_ATTR_FIELD_FLAGS,
            .flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY,
            .cb.send = ferry_ucx_op_done,
            .user_data = group,
        };
        atomic_fetch_add(&group->pending, 1);
        ucs_status_ptr_t request = ucp_am_send_nbx(ep->ep, FERRY_UCX_AM_NOTIFY, &payload->id,
                                                   header_length, payload->msg, length, &param);
        if (!UCS_PTR_IS_PTR(request)) {
            ucs_status_t status = UCS_PTR_STATUS(request);
            ferry_ucx_group_unref_op(group, status);
            if (status != UCS_OK)
                ferry_ucx_ack_forget(group, payload->id, status);
        }
    }
    ferry_lock_release(&ep->lock);
    ferry_ucx_group_unref_op(group, UCS_OK);

    unsigned timeout_ms = ucx->settings.timeout_ms ? ucx->settings.timeout_ms : 30000;
    struct timespec deadline;
    ferry_deadline_after_ms(&deadline, CLOCK_REALTIME, timeout_ms);
    pthread_mutex_lock(&waiter->lock);
    while (!waiter->done &&
           pthread_cond_timedwait(&waiter->cond, &waiter->lock, &deadline) == 0)
        ;
    int done = waiter->done;
    ucs_status_t status = waiter->status;
    pthread_mutex_unlock(&waiter->lock);
    if (atomic_fetch_sub(&waiter->refs, 1) == 1) {
        pthread_cond_destroy(&waiter->cond);
        pthread_mutex_destroy(&waiter->lock);
        free(waiter);
    }
    int failed = atomic_load(&ep->failed);
    ferry_ucx_ep_unref(ep);
    if (!done)
        return FERRY_ERR_TIMEOUT;
    if (status == UCS_OK)
        return FERRY_OK;
    return failed ? (ferry_status_t)failed : ferry_ucx_status(status);
}
