/*
 * Confirmation of a descriptor by its owner, before a one-sided transport
 * uses it.  A descriptor from a shared store (http, etcd, redis, pmix) is
 * what someone wrote there; the owner's own RPC serves what the owner
 * registered.  A one-sided transport copies with no check by the target,
 * so it may only follow a descriptor the owner serves as well: the engine
 * fetches the owner's descriptor over RPC once per descriptor it holds and
 * compares.  The fetch also makes this engine a subscriber of the owner
 * (the owner's FETCH handler notes the caller), so the owner's
 * invalidations reach us before its ferry_unregister returns.
 *
 * A p2p descriptor came from the owner's RPC in the first place: it is
 * confirmed when it arrives (ferry_descriptor_t.confirmed set by the
 * segment cache).
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

/* The owner serves its descriptor in either form (and, in the compact one,
 * with its revision, which a JSON copy from a store lacks): what counts is
 * the value, compared field by field. */
static int served_as(const ferry_descriptor_t *desc, const char *owners_text)
{
    ferry_descriptor_t *owners = NULL;
    if (ferry_descriptor_decode(owners_text, strlen(owners_text), &owners) != FERRY_OK)
        return 0;
    int same = ferry_descriptor_same(desc, owners);
    ferry_descriptor_unref(owners);
    return same;
}

int ferry_engine_descriptor_confirmed(ferry_engine_t *engine, const ferry_descriptor_t *desc)
{
    atomic_int *state = &((ferry_descriptor_t *)desc)->confirmed;
    int known = atomic_load_explicit(state, memory_order_acquire);
    if (known != FERRY_DESC_UNCONFIRMED)
        return known == FERRY_DESC_CONFIRMED;
    if (!engine->settings.confirm_descriptors)
        return 1; /* FERRY_CONFIRM_DESCRIPTORS=no: the store is trusted */
    if (desc->rpc == NULL || *desc->rpc == '\0') {
        ferry_warn("segment \"%s\": its descriptor names no RPC endpoint, so its owner cannot "
                   "confirm it; one-sided transports are not used for it", desc->name);
        atomic_store_explicit(state, FERRY_DESC_REFUSED, memory_order_release);
        return 0;
    }
    char *json = NULL;
    ferry_status_t status = ferry_engine_rpc_fetch(engine, desc->rpc, desc->name, &json);
    if (status != FERRY_OK) {
        /* Not an answer: asked again by the next request. */
        ferry_info("segment \"%s\": its owner at %s did not confirm the descriptor (%s); "
                   "one-sided transports wait for that", desc->name, desc->rpc,
                   ferry_status_string(status));
        return 0;
    }
    int same = served_as(desc, json);
    free(json);
    if (!same)
        ferry_warn("segment \"%s\": the metadata store's descriptor differs from what its owner "
                   "at %s serves; one-sided transports are not used for it", desc->name,
                   desc->rpc);
    atomic_store_explicit(state, same ? FERRY_DESC_CONFIRMED : FERRY_DESC_REFUSED,
                          memory_order_release);
    return same;
}
