/*
 * Liveness probe of an opened segment: one PROBE round trip to the RPC
 * endpoint in the descriptor we hold, compared with the generation we hold.
 *
 * The probe reads the cached descriptor as it is, without the refresh a
 * stale one would get on its next use: a refresh is a fetch from the owner
 * (or the store) under the engine's own RPC timeout, which would put the
 * caller's bound out of reach exactly when the owner is in trouble.  An
 * owner that answers with another generation (or name) has restarted: the
 * segment is then marked stale, so the next request refreshes it first.
 */
#include "core.h"
#include "../rpc/rpc.h"

#include <stdlib.h>
#include <string.h>

/* The descriptor the segment holds now (referenced), or NULL. */
static ferry_descriptor_t *held_descriptor(ferry_segment_t *segment)
{
    pthread_mutex_lock(&segment->lock);
    ferry_descriptor_t *desc = segment->desc ? ferry_descriptor_ref(segment->desc) : NULL;
    pthread_mutex_unlock(&segment->lock);
    return desc;
}

/* What the owner's answer says about the incarnation we hold. */
static ferry_status_t judge_reply(const ferry_descriptor_t *desc, const void *reply,
                                  size_t length)
{
    ferry_wire_reader_t in = {.data = reply, .length = length};
    ferry_rpc_probe_reply_t m;
    if (ferry_rpc_probe_reply_read(&in, &m) != FERRY_OK) {
        ferry_warn("probe of segment \"%s\" at %s: malformed reply (%zu bytes)", desc->name,
                   desc->rpc, length);
        return FERRY_ERR_PROTOCOL;
    }
    if (m.generation != desc->generation || strcmp(m.name, desc->name) != 0) {
        ferry_info("probe of segment \"%s\" at %s: \"%s\" generation 0x%016llx answers, we "
                   "hold generation 0x%016llx: it restarted", desc->name, desc->rpc, m.name,
                   (unsigned long long)m.generation, (unsigned long long)desc->generation);
        return FERRY_ERR_STALE;
    }
    return FERRY_OK;
}

ferry_status_t ferry_segment_probe(ferry_engine_h handle, ferry_segment_h segment_handle,
                                   int timeout_ms)
{
    ferry_engine_t *engine;
    ferry_segment_t *segment;
    if (ferry_segment_resolve(handle, segment_handle, &engine, &segment) != FERRY_OK)
        return FERRY_ERR_INVALID_HANDLE;
    if (segment->is_local)
        return FERRY_OK; /* we answer for ourselves */
    /* 0 would mean "no limit" to the RPC client: a probe is always bounded. */
    unsigned bound = timeout_ms > 0 ? (unsigned)timeout_ms : engine->settings.rpc_timeout_ms;
    if (bound == 0)
        bound = 1000;
    ferry_descriptor_t *desc = held_descriptor(segment);
    if (desc == NULL)
        return FERRY_ERR_SEGMENT_NOT_FOUND;
    if (desc->rpc == NULL || desc->rpc[0] == '\0') {
        ferry_error("probe of segment \"%s\": its descriptor names no RPC endpoint", desc->name);
        ferry_descriptor_unref(desc);
        return FERRY_ERR_UNSUPPORTED;
    }
    void *reply = NULL;
    size_t length = 0;
    ferry_status_t status = ferry_rpc_call(desc->rpc, FERRY_RPC_PROBE, NULL, 0, bound,
                                           engine->settings.rpc_max_frame, &reply, &length);
    switch (status) {
    case FERRY_OK:
        status = judge_reply(desc, reply, length);
        break;
    case FERRY_ERR_CONNECT: /* refused: nobody listens there any more */
    case FERRY_ERR_PEER_FAILED:
        ferry_debug("probe of segment \"%s\" at %s: %s", desc->name, desc->rpc,
                    ferry_status_string(status));
        status = FERRY_ERR_PEER_FAILED;
        break;
    case FERRY_ERR_BUSY: /* an engine still starting there: not the one we hold */
        status = FERRY_ERR_STALE;
        break;
    default:
        break;
    }
    free(reply);
    if (status == FERRY_ERR_STALE)
        ferry_segment_cache_invalidate(engine, desc->name, 0, 0);
    ferry_descriptor_unref(desc);
    return status;
}
