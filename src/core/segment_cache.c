/*
 * Segment cache: one entry per opened name, holding the newest descriptor.
 * Concurrent opens of a name share one fetch; a refresh replaces the
 * descriptor atomically (requests in flight keep their reference to the old
 * one).  When a peer's generation changes, its old incarnation's transport
 * state is dropped.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

void ferry_segment_cache_init(ferry_segment_cache_t *cache)
{
    pthread_mutex_init(&cache->lock, NULL);
    cache->list = NULL;
}

/* A new version for the segment (caller holds its lock): taken from one
 * process-wide count, so no segment ever shows a version another one (or
 * an earlier state of itself) had. */
static void segment_changed(ferry_segment_t *segment)
{
    static atomic_uint_fast64_t versions;
    atomic_store_explicit(&segment->version, atomic_fetch_add(&versions, 1) + 1,
                          memory_order_release);
}

static void segment_free(ferry_segment_t *segment)
{
    if (segment->handle)
        ferry_handle_free(segment->handle);
    if (segment->desc)
        ferry_descriptor_unref(segment->desc);
    pthread_mutex_destroy(&segment->lock);
    pthread_cond_destroy(&segment->changed);
    free(segment->name);
    free(segment);
}

void ferry_segment_cache_fini(ferry_engine_t *engine, ferry_segment_cache_t *cache)
{
    for (ferry_segment_t *segment = cache->list, *next; segment; segment = next) {
        next = segment->next;
        segment_free(segment);
    }
    cache->list = NULL;
    pthread_mutex_destroy(&cache->lock);
}

/* Fetch and decode the named descriptor from the metadata store. */
static ferry_status_t fetch_descriptor(ferry_engine_t *engine, const char *name,
                                       ferry_descriptor_t **desc_p)
{
    char *json = NULL;
    /* The store logs its own failures: it knows why. */
    ferry_status_t status = engine->metadata->fetch(engine->metadata_ctx, name, &json);
    if (status != FERRY_OK)
        return status;
    status = ferry_descriptor_decode(json, strlen(json), desc_p);
    free(json);
    if (status != FERRY_OK)
        ferry_error("segment \"%s\": the metadata store holds an invalid descriptor", name);
    return status;
}

static ferry_descriptor_t *local_descriptor(ferry_engine_t *engine)
{
    ferry_descriptor_t *desc;
    return ferry_engine_local_descriptor(engine, &desc, NULL) == FERRY_OK ? desc : NULL;
}

static int is_own_name(ferry_engine_t *engine, const char *name)
{
    return strcmp(name, engine->name) == 0 || strcmp(name, engine->rpc_endpoint) == 0;
}

ferry_status_t ferry_segment_cache_open(ferry_engine_t *engine, const char *name,
                                        ferry_segment_t **segment_p)
{
    ferry_segment_cache_t *cache = &engine->segments;
    pthread_mutex_lock(&cache->lock);
    ferry_segment_t *segment = cache->list;
    while (segment && strcmp(segment->name, name) != 0)
        segment = segment->next;
    if (segment != NULL) {
        segment->opens++;
        pthread_mutex_unlock(&cache->lock);
        /* Another thread may still be fetching it: share that fetch. */
        pthread_mutex_lock(&segment->lock);
        while (segment->fetching)
            pthread_cond_wait(&segment->changed, &segment->lock);
        ferry_status_t status = segment->desc ? FERRY_OK : segment->fetch_status;
        pthread_mutex_unlock(&segment->lock);
        if (status != FERRY_OK) {
            ferry_segment_cache_close(engine, segment);
            return status;
        }
        *segment_p = segment;
        return FERRY_OK;
    }
    segment = calloc(1, sizeof(*segment));
    if (segment == NULL || (segment->name = strdup(name)) == NULL) {
        free(segment);
        pthread_mutex_unlock(&cache->lock);
        return FERRY_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&segment->lock, NULL);
    pthread_cond_init(&segment->changed, NULL);
    segment->opens = 1;
    segment->fetching = 1;
    segment->is_local = is_own_name(engine, name);
    segment->handle = ferry_handle_alloc(FERRY_HANDLE_SEGMENT, segment, engine);
    segment->next = cache->list;
    cache->list = segment;
    pthread_mutex_unlock(&cache->lock);

    ferry_descriptor_t *desc = NULL;
    ferry_status_t status;
    if (segment->handle == 0)
        status = FERRY_ERR_NO_RESOURCE;
    else if (segment->is_local)
        status = (desc = local_descriptor(engine)) ? FERRY_OK : FERRY_ERR_SEGMENT_NOT_FOUND;
    else
        status = fetch_descriptor(engine, name, &desc);

    pthread_mutex_lock(&segment->lock);
    segment->desc = desc;
    segment_changed(segment);
    segment->fetch_status = status;
    segment->fetching = 0;
    pthread_cond_broadcast(&segment->changed);
    pthread_mutex_unlock(&segment->lock);
    if (status != FERRY_OK) {
        ferry_segment_cache_close(engine, segment);
        return status;
    }
    *segment_p = segment;
    return FERRY_OK;
}

void ferry_segment_cache_close(ferry_engine_t *engine, ferry_segment_t *segment)
{
    ferry_segment_cache_t *cache = &engine->segments;
    pthread_mutex_lock(&cache->lock);
    if (--segment->opens > 0) {
        pthread_mutex_unlock(&cache->lock);
        return;
    }
    for (ferry_segment_t **p = &cache->list; *p; p = &(*p)->next) {
        if (*p == segment) {
            *p = segment->next;
            break;
        }
    }
    pthread_mutex_unlock(&cache->lock);
    /* Unreachable from the list; no other opener exists.  Any transport state
     * for the peer stays until its generation changes or the engine ends,
     * so reopening is cheap. */
    segment_free(segment);
}

ferry_status_t ferry_segment_refetch(ferry_engine_t *engine, ferry_segment_t *segment,
                                     const ferry_descriptor_t *seen)
{
    pthread_mutex_lock(&segment->lock);
    if (segment->fetching || (seen != NULL && segment->desc != seen)) {
        /* Someone else refreshed (or is refreshing) since the caller looked. */
        while (segment->fetching)
            pthread_cond_wait(&segment->changed, &segment->lock);
        ferry_status_t status = segment->desc != seen ? FERRY_OK : segment->fetch_status;
        pthread_mutex_unlock(&segment->lock);
        return status;
    }
    segment->fetching = 1;
    /* An invalidation while we fetch (it bumps the version) may describe a
     * change our fetch read too early to see: then the result stays stale. */
    uint64_t version_before = atomic_load_explicit(&segment->version, memory_order_relaxed);
    pthread_mutex_unlock(&segment->lock);

    ferry_descriptor_t *desc = NULL;
    ferry_status_t status;
    if (segment->is_local)
        status = (desc = local_descriptor(engine)) ? FERRY_OK : FERRY_ERR_SEGMENT_NOT_FOUND;
    else
        status = fetch_descriptor(engine, segment->name, &desc);

    ferry_descriptor_t *old = NULL;
    pthread_mutex_lock(&segment->lock);
    if (status == FERRY_OK) {
        old = segment->desc;
        segment->desc = desc;
        segment->stale =
            atomic_load_explicit(&segment->version, memory_order_relaxed) != version_before;
        segment_changed(segment);
    }
    segment->fetch_status = status;
    segment->fetching = 0;
    pthread_cond_broadcast(&segment->changed);
    pthread_mutex_unlock(&segment->lock);
    if (old != NULL) {
        if (old->generation != desc->generation) {
            ferry_info("segment \"%s\" restarted: generation 0x%016llx -> 0x%016llx",
                       segment->name, (unsigned long long)old->generation,
                       (unsigned long long)desc->generation);
            ferry_engine_forget_peer(engine, old);
        }
        ferry_descriptor_unref(old);
    }
    return status;
}

ferry_status_t ferry_segment_descriptor_versioned(ferry_engine_t *engine,
                                                  ferry_segment_t *segment,
                                                  ferry_descriptor_t **desc_p,
                                                  uint64_t *version_p)
{
    *version_p = 0;
    if (segment->is_local) {
        /* Our own segment: always the newest local descriptor, no fetch. */
        *desc_p = local_descriptor(engine);
        return *desc_p ? FERRY_OK : FERRY_ERR_SEGMENT_NOT_FOUND;
    }
    pthread_mutex_lock(&segment->lock);
    if (!segment->stale) { /* the common case: one lock per request */
        *desc_p = ferry_descriptor_ref(segment->desc);
        *version_p = atomic_load_explicit(&segment->version, memory_order_relaxed);
        pthread_mutex_unlock(&segment->lock);
        return FERRY_OK;
    }
    ferry_descriptor_t *seen = segment->desc;
    pthread_mutex_unlock(&segment->lock);
    ferry_status_t status = ferry_segment_refetch(engine, segment, seen);
    if (status != FERRY_OK)
        return status;
    pthread_mutex_lock(&segment->lock);
    *desc_p = ferry_descriptor_ref(segment->desc);
    /* Stale again already: no version, so nobody reuses it unchecked. */
    if (!segment->stale)
        *version_p = atomic_load_explicit(&segment->version, memory_order_relaxed);
    pthread_mutex_unlock(&segment->lock);
    return FERRY_OK;
}

ferry_status_t ferry_segment_descriptor(ferry_engine_t *engine, ferry_segment_t *segment,
                                        ferry_descriptor_t **desc_p)
{
    uint64_t version;
    return ferry_segment_descriptor_versioned(engine, segment, desc_p, &version);
}

ferry_status_t ferry_segment_cache_refresh(ferry_engine_t *engine, const char *name)
{
    ferry_segment_cache_t *cache = &engine->segments;
    ferry_segment_t *targets[256];
    size_t count = 0;
    int found = 0;
    /* Hold an open on each target so none is freed while we fetch unlocked. */
    pthread_mutex_lock(&cache->lock);
    for (ferry_segment_t *s = cache->list; s; s = s->next) {
        if (name != NULL && strcmp(s->name, name) != 0)
            continue;
        found = 1;
        if (count < FERRY_ARRAY_SIZE(targets)) {
            s->opens++;
            targets[count++] = s;
        }
    }
    pthread_mutex_unlock(&cache->lock);
    if (name != NULL && !found) {
        ferry_error("refresh of segment \"%s\": it is not open", name);
        return FERRY_ERR_SEGMENT_NOT_FOUND;
    }
    ferry_status_t result = FERRY_OK;
    for (size_t i = 0; i < count; i++) {
        ferry_status_t status = ferry_segment_refetch(engine, targets[i], NULL);
        if (status != FERRY_OK && result == FERRY_OK)
            result = status;
        ferry_segment_cache_close(engine, targets[i]);
    }
    return result;
}

void ferry_segment_cache_changed(void *engine, const char *name)
{
    ferry_segment_cache_invalidate(engine, name, 0);
}

void ferry_segment_cache_invalidate(ferry_engine_t *engine, const char *name,
                                    uint64_t generation)
{
    ferry_segment_cache_t *cache = &engine->segments;
    ferry_descriptor_t *changed[16];
    size_t n_changed = 0;
    pthread_mutex_lock(&cache->lock);
    for (ferry_segment_t *s = cache->list; s; s = s->next) {
        pthread_mutex_lock(&s->lock);
        /* p2p segments may be opened by address, so match the descriptor's name. */
        if ((s->desc && strcmp(s->desc->name, name) == 0) || strcmp(s->name, name) == 0) {
            s->stale = 1;
            segment_changed(s);
            ferry_debug("segment \"%s\" invalidated by its owner (generation 0x%016llx)",
                        s->name, (unsigned long long)generation);
            if (s->desc && s->desc->generation == generation && n_changed < 16)
                changed[n_changed++] = ferry_descriptor_ref(s->desc);
        }
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&cache->lock);
    /* Same incarnation, fewer buffers: transports drop what they cached for
     * the old ones (no lock held: they take their own). */
    for (size_t i = 0; i < n_changed; i++) {
        ferry_engine_peer_changed(engine, changed[i]);
        ferry_descriptor_unref(changed[i]);
    }
}

/* ---- public API ---- */

ferry_status_t ferry_segment_open(ferry_engine_h handle, const char *name,
                                  ferry_segment_h *segment_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (name == NULL || *name == '\0' || segment_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_segment_t *segment;
    ferry_status_t status = ferry_segment_cache_open(engine, name, &segment);
    if (status == FERRY_OK)
        *segment_p = (ferry_segment_h)(uintptr_t)segment->handle;
    return status;
}

static ferry_segment_t *segment_lookup(ferry_engine_t *engine, ferry_segment_h handle)
{
    return ferry_handle_lookup((uint64_t)(uintptr_t)handle, FERRY_HANDLE_SEGMENT, engine);
}

ferry_status_t ferry_segment_close(ferry_engine_h handle, ferry_segment_h segment_handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    ferry_segment_t *segment = segment_lookup(engine, segment_handle);
    if (segment == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    ferry_segment_cache_close(engine, segment);
    return FERRY_OK;
}

ferry_status_t ferry_segment_refresh(ferry_engine_h handle, const char *name)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    return ferry_segment_cache_refresh(engine, name);
}

ferry_status_t ferry_segment_describe(ferry_engine_h handle, ferry_segment_h segment_handle,
                                      char **json_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    ferry_segment_t *segment = segment_lookup(engine, segment_handle);
    if (segment == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (json_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_descriptor_t *desc;
    ferry_status_t status = ferry_segment_descriptor(engine, segment, &desc);
    if (status != FERRY_OK)
        return status;
    status = ferry_descriptor_encode(desc, json_p);
    ferry_descriptor_unref(desc);
    return status;
}
