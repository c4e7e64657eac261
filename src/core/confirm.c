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
 *
 * A descriptor that a refresh made from a confirmed one B by a store's
 * change records (segment_cache.c, store_changes) keeps B as its
 * confirm_base.  The owner then confirms it cheaply: asked for its
 * changes since B's revision (FETCH with B's generation and revision, as a
 * p2p refresh), it answers with those steps; B with them applied is what
 * the owner serves, made here without any text of the whole descriptor,
 * and is compared with the store's, value by value as ever (buffers both
 * took from B share their strings, so the comparison is a pass over the
 * array).  When the owner's log no longer reaches B it answers whole, and
 * that is compared.  confirm_base is taken under base_lock, so one
 * confirmation uses it; a concurrent one asks for the whole text.
 */
#include "core.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_mutex_t base_lock = PTHREAD_MUTEX_INITIALIZER;

void ferry_engine_confirm_base_pass(ferry_engine_t *engine, const ferry_descriptor_t *held,
                                    ferry_descriptor_t *desc)
{
    if (!engine->settings.confirm_descriptors)
        return;
    pthread_mutex_lock(&base_lock);
    ferry_descriptor_t *base = (ferry_descriptor_t *)held;
    if (atomic_load_explicit(&held->confirmed, memory_order_acquire) != FERRY_DESC_CONFIRMED)
        base = held->confirm_base; /* held itself was never confirmed: its base is */
    if (base != NULL && base->generation == desc->generation && desc->confirm_base == NULL)
        desc->confirm_base = ferry_descriptor_ref(base);
    pthread_mutex_unlock(&base_lock);
}

static ferry_descriptor_t *base_take(ferry_descriptor_t *desc)
{
    pthread_mutex_lock(&base_lock);
    ferry_descriptor_t *base = desc->confirm_base;
    desc->confirm_base = NULL;
    pthread_mutex_unlock(&base_lock);
    return base;
}

/* After no answer: the next confirmation may use it again. */
static void base_give_back(ferry_descriptor_t *desc, ferry_descriptor_t *base)
{
    pthread_mutex_lock(&base_lock);
    if (desc->confirm_base == NULL) {
        desc->confirm_base = base;
        base = NULL;
    }
    pthread_mutex_unlock(&base_lock);
    if (base != NULL)
        ferry_descriptor_unref(base);
}

/* The owner's descriptor from its answer to a FETCH that carried base's
 * revision: the changes since, applied to base, or the whole text. */
static ferry_status_t owners_descriptor(const ferry_descriptor_t *base, const char *text,
                                        size_t length, ferry_descriptor_t **owners_p)
{
    size_t magic = strlen(FERRY_DESC_CHANGES_MAGIC);
    if (base == NULL || length < magic || memcmp(text, FERRY_DESC_CHANGES_MAGIC, magic) != 0)
        return ferry_descriptor_decode(text, length, owners_p);
    ferry_desc_changes_t changes;
    ferry_status_t status = ferry_desc_changes_decode(text, length, &changes);
    if (status != FERRY_OK)
        return status;
    if (changes.n_steps == 0 && changes.generation == base->generation &&
        changes.from == base->revision)
        *owners_p = ferry_descriptor_ref((ferry_descriptor_t *)base);
    else
        status = ferry_descriptor_apply(base, &changes, owners_p);
    ferry_desc_changes_fini(&changes);
    return status;
}

/* The owner serves its descriptor in either form (and, in the compact one,
 * with its revision, which a JSON copy from a store lacks), or as changes
 * since base: what counts is the value, compared field by field. */
static int served_as(const ferry_descriptor_t *desc, const ferry_descriptor_t *base,
                     const char *owners_text, size_t length)
{
    ferry_descriptor_t *owners = NULL;
    if (owners_descriptor(base, owners_text, length, &owners) != FERRY_OK)
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
    ferry_descriptor_t *base = base_take((ferry_descriptor_t *)desc);
    char *text = NULL;
    size_t length = 0;
    ferry_status_t status =
        base != NULL ? ferry_engine_rpc_fetch_since(engine, desc->rpc, desc->name,
                                                    base->generation, base->revision, &text,
                                                    &length)
                     : ferry_engine_rpc_fetch_since(engine, desc->rpc, desc->name, 0, 0, &text,
                                                    &length);
    if (status != FERRY_OK) {
        /* Not an answer: asked again by the next request. */
        ferry_info("segment \"%s\": its owner at %s did not confirm the descriptor (%s); "
                   "one-sided transports wait for that", desc->name, desc->rpc,
                   ferry_status_string(status));
        if (base != NULL)
            base_give_back((ferry_descriptor_t *)desc, base);
        return 0;
    }
    int same = served_as(desc, base, text, length);
    free(text);
    if (base != NULL)
        ferry_descriptor_unref(base);
    if (!same)
        ferry_warn("segment \"%s\": the metadata store's descriptor differs from what its owner "
                   "at %s serves; one-sided transports are not used for it", desc->name,
                   desc->rpc);
    atomic_store_explicit(state, same ? FERRY_DESC_CONFIRMED : FERRY_DESC_REFUSED,
                          memory_order_release);
    return same;
}
