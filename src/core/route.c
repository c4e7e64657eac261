/*
 * Peers and routes: how the engine names a remote incarnation to its
 * transports (ferry_peer_t), tells them to forget it, and picks the
 * transport that serves a buffer of it.
 */
#include "core.h"

#include <string.h>

int ferry_engine_same_host(const ferry_engine_t *engine, const ferry_descriptor_t *desc)
{
    /* Asked on every submit: compared once per descriptor. */
    atomic_int *memo = &((ferry_descriptor_t *)desc)->same_host;
    int known = atomic_load_explicit(memo, memory_order_relaxed);
    if (known == 0) {
        known = strcmp(desc->host_id, engine->host_id) == 0 ? 2 : 1;
        atomic_store_explicit(memo, known, memory_order_relaxed);
    }
    return known == 2;
}

void ferry_engine_make_peer(const ferry_engine_t *engine, const ferry_descriptor_t *desc,
                            int desc_transport, ferry_peer_t *peer)
{
    peer->name = desc->name;
    peer->generation = desc->generation;
    peer->endpoint = desc_transport >= 0 ? desc->transports[desc_transport].endpoint : "";
    peer->rpc = desc->rpc;
    peer->same_host = ferry_engine_same_host(engine, desc);
    peer->cache = NULL;
    peer->descriptor_serial = desc->serial;
}

/* Tell every transport the peer has an endpoint for: forget it (changed 0)
 * or just its per-buffer state (changed 1). */
static void peer_tell(ferry_engine_t *engine, const ferry_descriptor_t *desc, int changed)
{
    for (size_t i = 0; i < engine->n_transports; i++) {
        ferry_transport_instance_t *tp = &engine->transports[i];
        int j = ferry_descriptor_transport_index(desc, tp->plugin->name);
        if (j < 0 || (changed ? !FERRY_TRANSPORT_OPS_HAS(tp->ops, peer_changed)
                              : tp->ops->peer_forget == NULL))
            continue;
        ferry_peer_t peer;
        ferry_engine_make_peer(engine, desc, j, &peer);
        if (changed)
            tp->ops->peer_changed(tp->ctx, &peer);
        else
            tp->ops->peer_forget(tp->ctx, &peer);
    }
}

void ferry_engine_forget_peer(ferry_engine_t *engine, const ferry_descriptor_t *desc)
{
    peer_tell(engine, desc, 0);
}

void ferry_engine_peer_changed(ferry_engine_t *engine, const ferry_descriptor_t *desc)
{
    peer_tell(engine, desc, 1);
}

const char *ferry_engine_transport_reach(ferry_engine_t *engine, size_t i,
                                         const ferry_descriptor_t *desc,
                                         const ferry_desc_buffer_t *buffer, int *reach_p,
                                         int *desc_transport_p)
{
    ferry_transport_instance_t *tp = &engine->transports[i];
    if ((tp->plugin->flags & FERRY_TRANSPORT_SAME_HOST_ONLY) &&
        !ferry_engine_same_host(engine, desc))
        return "it reaches peers on this host only";
    int j = ferry_descriptor_transport_index(desc, tp->plugin->name);
    if (j < 0)
        return "the peer did not enable it";
    if (buffer->keys[j] == NULL)
        return "the peer's buffer is not registered with it";
    if (tp->one_sided && !ferry_engine_descriptor_confirmed(engine, desc))
        return "it copies one-sided, and the segment's owner did not confirm its descriptor";
    ferry_peer_t peer;
    ferry_engine_make_peer(engine, desc, j, &peer);
    *reach_p = tp->ops->reaches != NULL ? tp->ops->reaches(tp->ctx, &peer, buffer->keys[j])
                                        : FERRY_REACH_YES;
    *desc_transport_p = j;
    return *reach_p == FERRY_REACH_NO ? "it does not reach the peer's buffer" : NULL;
}

int ferry_engine_select_transport(ferry_engine_t *engine, const ferry_descriptor_t *desc,
                                  const ferry_desc_buffer_t *buffer, int *desc_transport_p)
{
    int fallback = -1, fallback_j = -1;
    for (size_t i = 0; i < engine->n_transports; i++) {
        int reach, j;
        if (ferry_engine_transport_reach(engine, i, desc, buffer, &reach, &j) != NULL)
            continue;
        if (reach == FERRY_REACH_FALLBACK && fallback < 0) {
            fallback = (int)i;
            fallback_j = j;
        }
        if (reach != FERRY_REACH_YES)
            continue;
        *desc_transport_p = j;
        return (int)i;
    }
    *desc_transport_p = fallback_j;
    return fallback;
}
