/*
 * The engine's side of the control-plane RPC: serving its descriptor,
 * queueing notifies, answering probes, taking invalidations; and the client
 * calls the engine makes (p2p fetch, notify send).
 */
#include "core.h"
#include "../rpc/rpc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOTIFY_QUEUE_MAX 65536

static ferry_status_t handle_fetch(ferry_engine_t *engine, ferry_wire_reader_t *in,
                                   void **reply_p, size_t *reply_length_p)
{
    ferry_rpc_fetch_t m;
    if (ferry_rpc_fetch_read(in, &m) != FERRY_OK)
        return FERRY_ERR_PROTOCOL;
    if (m.name[0] != '\0' && strcmp(m.name, engine->name) != 0) {
        ferry_debug("fetch of segment \"%s\" from %s: this engine is \"%s\"", m.name, m.from,
                    engine->name);
        return FERRY_ERR_SEGMENT_NOT_FOUND;
    }
    /* A fetcher may copy one-sided next: it must hear our unregisters. */
    ferry_status_t subscribed = ferry_engine_subscribe(engine, m.from);
    if (subscribed != FERRY_OK)
        return subscribed;
    /* An older engine asks without `accept`: JSON, all it reads. */
    ferry_desc_form_t form = m.accept & FERRY_RPC_ACCEPT_COMPACT ? FERRY_DESC_FORM_COMPACT
                                                                 : FERRY_DESC_FORM_JSON;
    char *text;
    size_t length;
    ferry_status_t status =
        m.accept & FERRY_RPC_ACCEPT_CHANGES
            ? ferry_engine_changes_text(engine, m.generation, m.revision, form, &text, &length)
            : ferry_engine_local_text(engine, form, &text, &length);
    if (status != FERRY_OK)
        return status;
    *reply_p = text;
    *reply_length_p = length;
    return FERRY_OK;
}

/* Queue a notify for ferry_notify_recv (from RPC or any transport). */
static ferry_status_t notify_enqueue(ferry_engine_t *engine, const char *from, const void *msg,
                                     size_t length)
{
    if (length > FERRY_NOTIFY_MAX)
        return FERRY_ERR_PROTOCOL;
    ferry_notify_item_t *item = calloc(1, sizeof(*item));
    if (item == NULL)
        return FERRY_ERR_NO_MEMORY;
    snprintf(item->notify.from, sizeof(item->notify.from), "%s", from);
    if (length)
        memcpy(item->notify.msg, msg, length);
    item->notify.length = length;
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&engine->notify_lock);
    if (engine->notify_count >= NOTIFY_QUEUE_MAX) {
        status = FERRY_ERR_NO_RESOURCE;
    } else {
        if (engine->notify_tail)
            engine->notify_tail->next = item;
        else
            engine->notify_head = item;
        engine->notify_tail = item;
        engine->notify_count++;
    }
    pthread_mutex_unlock(&engine->notify_lock);
    if (status != FERRY_OK) {
        ferry_warn("notify from %s dropped: %d notifies wait unread", item->notify.from,
                   NOTIFY_QUEUE_MAX);
        free(item);
    }
    return status;
}

void ferry_engine_notify_deliver(void *engine, const char *from, const void *msg, size_t length)
{
    notify_enqueue(engine, from, msg, length);
}

static ferry_status_t handle_notify(ferry_engine_t *engine, ferry_wire_reader_t *in)
{
    ferry_rpc_notify_t m;
    if (ferry_rpc_notify_read(in, &m) != FERRY_OK)
        return FERRY_ERR_PROTOCOL;
    return notify_enqueue(engine, m.from, m.msg, m.length);
}

ferry_status_t ferry_engine_rpc_handle(void *arg, int type, const void *payload, size_t length,
                                       int *reply_type_p, void **reply_p, size_t *reply_length_p)
{
    ferry_engine_t *engine = arg;
    ferry_wire_reader_t in = {.data = payload, .length = length};
    ferry_wire_writer_t out = {0};
    ferry_status_t status;
    if (!atomic_load_explicit(&engine->serving, memory_order_acquire)) {
        ferry_debug("RPC request of type %d while the engine starts: busy", type);
        return FERRY_ERR_BUSY;
    }
    switch (type) {
    case FERRY_RPC_FETCH:
        *reply_type_p = FERRY_RPC_FETCH_REPLY;
        return handle_fetch(engine, &in, reply_p, reply_length_p);
    case FERRY_RPC_NOTIFY:
        *reply_type_p = FERRY_RPC_NOTIFY_ACK;
        return handle_notify(engine, &in);
    case FERRY_RPC_PROBE:
        *reply_type_p = FERRY_RPC_PROBE_REPLY;
        status = ferry_rpc_probe_reply_write(&out, engine->generation, engine->name);
        *reply_p = out.data;
        *reply_length_p = out.length;
        return status;
    case FERRY_RPC_INVALIDATE: {
        ferry_rpc_invalidate_t m;
        *reply_type_p = FERRY_RPC_INVALIDATE_ACK;
        if (ferry_rpc_invalidate_read(&in, &m) != FERRY_OK)
            return FERRY_ERR_PROTOCOL;
        /* Within the owner's wait for our answer (the same setting on
         * both sides by default), with room for the reply. */
        return ferry_segment_cache_invalidate(engine, m.name, m.generation,
                                              engine->settings.invalidate_timeout_ms * 3 / 4);
    }
    default:
        status = FERRY_ERR_PROTOCOL;
        ferry_warn("RPC request of unknown type %d ignored", type);
        return status;
    }
}

ferry_status_t ferry_engine_rpc_fetch_since(ferry_engine_t *engine, const char *rpc,
                                            const char *name, uint64_t generation,
                                            uint64_t revision, char **text_p, size_t *length_p)
{
    ferry_rpc_fetch_t m = {.accept = FERRY_RPC_ACCEPT_COMPACT, .generation = generation,
                           .revision = revision};
    if (revision != 0)
        m.accept |= FERRY_RPC_ACCEPT_CHANGES;
    snprintf(m.name, sizeof(m.name), "%s", name);
    snprintf(m.from, sizeof(m.from), "%s", engine->rpc_endpoint);
    ferry_wire_writer_t out = {0};
    if (ferry_rpc_fetch_since_write(&out, &m) != FERRY_OK)
        return FERRY_ERR_NO_MEMORY;
    size_t length;
    ferry_status_t status = ferry_rpc_call(rpc, FERRY_RPC_FETCH, out.data, out.length,
                                           engine->settings.rpc_timeout_ms,
                                           engine->settings.rpc_max_frame, (void **)text_p,
                                           &length);
    free(out.data);
    if (status == FERRY_OK && length_p != NULL)
        *length_p = length;
    return status;
}

ferry_status_t ferry_engine_rpc_fetch(void *engine, const char *rpc, const char *name,
                                      char **descriptor_p)
{
    return ferry_engine_rpc_fetch_since(engine, rpc, name, 0, 0, descriptor_p, NULL);
}

/* Through the first transport both sides enabled that carries notifies. */
static int notify_transport(ferry_engine_t *engine, const ferry_descriptor_t *desc, int *j_p)
{
    int same_host = ferry_engine_same_host(engine, desc);
    for (size_t i = 0; i < engine->n_transports; i++) {
        ferry_transport_instance_t *tp = &engine->transports[i];
        if (!FERRY_TRANSPORT_OPS_HAS(tp->ops, notify) ||
            ((tp->plugin->flags & FERRY_TRANSPORT_SAME_HOST_ONLY) && !same_host))
            continue;
        if ((*j_p = ferry_descriptor_transport_index(desc, tp->plugin->name)) >= 0)
            return (int)i;
    }
    return -1;
}

ferry_status_t ferry_engine_send_notify(ferry_engine_t *engine, const ferry_descriptor_t *desc,
                                        const void *msg, size_t length)
{
    if (length > FERRY_NOTIFY_MAX) {
        ferry_error("notify of %zu bytes exceeds FERRY_NOTIFY_MAX (%d)", length,
                    FERRY_NOTIFY_MAX);
        return FERRY_ERR_INVALID_PARAM;
    }
    int j, i = notify_transport(engine, desc, &j);
    if (i >= 0) {
        ferry_transport_instance_t *tp = &engine->transports[i];
        ferry_peer_t peer;
        ferry_engine_make_peer(engine, desc, j, &peer);
        ferry_status_t status = tp->ops->notify(tp->ctx, &peer, engine->name, msg, length);
        if (status == FERRY_OK)
            return FERRY_OK;
        ferry_warn("notify to %s via %s failed (%s); trying RPC", desc->name, tp->plugin->name,
                   ferry_status_string(status));
    }
    const char *rpc = desc->rpc;
    ferry_wire_writer_t out = {0};
    if (ferry_rpc_notify_write(&out, engine->name, msg, length) != FERRY_OK)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = ferry_rpc_call(rpc, FERRY_RPC_NOTIFY, out.data, out.length,
                                           engine->settings.rpc_timeout_ms,
                                           engine->settings.rpc_max_frame, NULL, NULL);
    free(out.data);
    if (status != FERRY_OK)
        ferry_error("notify to %s failed: %s", rpc, ferry_status_string(status));
    return status;
}

ferry_status_t ferry_notify_send(ferry_engine_h handle, ferry_segment_h segment_handle,
                                 const void *msg, size_t length)
{
    ferry_engine_t *engine;
    ferry_segment_t *segment;
    if (ferry_segment_resolve(handle, segment_handle, &engine, &segment) != FERRY_OK)
        return FERRY_ERR_INVALID_HANDLE;
    if (msg == NULL && length > 0)
        return FERRY_ERR_INVALID_PARAM;
    ferry_descriptor_t *desc;
    ferry_status_t status = ferry_segment_descriptor(engine, segment, &desc);
    if (status != FERRY_OK)
        return status;
    status = ferry_engine_send_notify(engine, desc, msg, length);
    ferry_descriptor_unref(desc);
    return status;
}

ferry_status_t ferry_notify_recv(ferry_engine_h handle, ferry_notify_t *msgs, size_t max,
                                 size_t *count_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (count_p == NULL || (msgs == NULL && max > 0))
        return FERRY_ERR_INVALID_PARAM;
    size_t n = 0;
    pthread_mutex_lock(&engine->notify_lock);
    while (n < max && engine->notify_head) {
        ferry_notify_item_t *item = engine->notify_head;
        engine->notify_head = item->next;
        if (engine->notify_head == NULL)
            engine->notify_tail = NULL;
        engine->notify_count--;
        msgs[n++] = item->notify;
        free(item);
    }
    pthread_mutex_unlock(&engine->notify_lock);
    *count_p = n;
    return FERRY_OK;
}
