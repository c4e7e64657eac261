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
    /* seq_cst: a copier's check pairs with it (segment_copiers.c). */
    atomic_store_explicit(&segment->version, atomic_fetch_add(&versions, 1) + 1,
                          memory_order_seq_cst);
}

static void segment_free(ferry_segment_t *segment)
{
    if (segment->handle)
        ferry_handle_free(segment->handle);
    ferry_segment_copiers_wait_all(segment); /* requests in flight count on it */
    if (segment->desc)
        ferry_descriptor_unref(segment->desc);
    pthread_mutex_destroy(&segment->drain_lock);
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
static ferry_status_t fetch_whole(ferry_engine_t *engine, const char *name,
                                  ferry_descriptor_t **desc_p)
{
    char *text = NULL;
    /* The store logs its own failures: it knows why. */
    ferry_status_t status = engine->metadata->fetch(engine->metadata_ctx, name, &text);
    if (status != FERRY_OK)
        return status;
    status = ferry_descriptor_decode(text, strlen(text), desc_p);
    free(text);
    if (status != FERRY_OK)
        ferry_error("segment \"%s\": the metadata store holds an invalid descriptor", name);
    else if (engine->metadata_plugin->flags & FERRY_METADATA_OWNER_SERVES)
        atomic_store(&(*desc_p)->confirmed, FERRY_DESC_CONFIRMED); /* the owner served it */
    return status;
}

/*
 * The changes since `held` from its owner over RPC (FETCH with held's
 * generation and revision, `name` the segment it is asked for): O(changes)
 * to send and decode, one copy of the buffer array to apply; or the whole
 * descriptor when its log does not reach back that far.  For p2p that is
 * every refresh; for a shared store, what fills a gap in its records.
 * FERRY_ERR_DECODE: an answer that does not apply (logged once).
 */
static ferry_status_t owner_changes(ferry_engine_t *engine, const ferry_descriptor_t *held,
                                    const char *name, ferry_descriptor_t **desc_p)
{
    if (held->rpc == NULL || held->rpc[0] == '\0')
        return FERRY_ERR_UNSUPPORTED;
    char *text = NULL;
    size_t length = 0;
    ferry_status_t status = ferry_engine_rpc_fetch_since(engine, held->rpc, name,
                                                         held->generation, held->revision,
                                                         &text, &length);
    if (status != FERRY_OK) {
        ferry_error("segment \"%s\": its owner at %s does not answer a refresh: %s",
                    held->name, held->rpc, ferry_status_string(status));
        return status;
    }
    size_t magic = strlen(FERRY_DESC_CHANGES_MAGIC);
    if (length < magic || memcmp(text, FERRY_DESC_CHANGES_MAGIC, magic) != 0) {
        status = ferry_descriptor_decode(text, length, desc_p); /* whole: too old */
    } else {
        ferry_desc_changes_t changes;
        status = ferry_desc_changes_decode(text, length, &changes);
        if (status == FERRY_OK && changes.n_steps == 0 && changes.generation == held->generation &&
            changes.from == held->revision)
            *desc_p = ferry_descriptor_ref((ferry_descriptor_t *)held); /* nothing changed */
        else if (status == FERRY_OK)
            status = ferry_descriptor_apply(held, &changes, desc_p);
        if (status == FERRY_OK || status == FERRY_ERR_DECODE)
            ferry_desc_changes_fini(&changes);
    }
    free(text);
    if (status == FERRY_OK)
        atomic_store(&(*desc_p)->confirmed, FERRY_DESC_CONFIRMED); /* the owner served it */
    return status;
}

/*
 * p2p refresh of a descriptor we hold.  FERRY_ERR_UNSUPPORTED: not possible
 * here (another store, no revision, or an answer that did not fit), the
 * caller fetches whole; any other failure is the owner's answer.
 */
static ferry_status_t fetch_changes(ferry_engine_t *engine, const char *name,
                                    const ferry_descriptor_t *held, ferry_descriptor_t **desc_p)
{
    if (!(engine->metadata_plugin->flags & FERRY_METADATA_OWNER_SERVES) || held == NULL ||
        held->revision == 0)
        return FERRY_ERR_UNSUPPORTED;
    /* As the p2p store asks: "name@host:port" wants that name, "host:port"
     * whoever answers there (a restarted owner sends its whole descriptor). */
    const char *at = strrchr(name, '@');
    char wanted[1024] = "";
    if (at != NULL && (size_t)(at - name) < sizeof(wanted))
        memcpy(wanted, name, (size_t)(at - name));
    ferry_status_t status = owner_changes(engine, held, wanted, desc_p);
    if (status == FERRY_ERR_DECODE) {
        /* the decoder said why (once); fetching whole is the answer to it */
        ferry_info("segment \"%s\": its owner's changes do not apply; fetching it whole",
                   held->name);
        return FERRY_ERR_UNSUPPORTED;
    }
    return status;
}

/*
 * Refresh of a segment opened from a blob: only its owner knows it (no
 * store holds it), so its changes since held over RPC, or its whole
 * descriptor when they do not apply.  A restarted owner at the same
 * endpoint under the same name answers with its new generation's; any
 * other engine there refuses (another name).
 */
static ferry_status_t owner_refresh(ferry_engine_t *engine, const ferry_descriptor_t *held,
                                    ferry_descriptor_t **desc_p)
{
    ferry_status_t status = held->revision != 0 ? owner_changes(engine, held, held->name, desc_p)
                                                : FERRY_ERR_DECODE;
    if (status != FERRY_ERR_DECODE)
        return status;
    if (held->rpc == NULL || held->rpc[0] == '\0')
        return FERRY_ERR_UNSUPPORTED;
    char *text = NULL;
    status = ferry_engine_rpc_fetch(engine, held->rpc, held->name, &text);
    if (status == FERRY_OK) {
        status = ferry_descriptor_decode(text, strlen(text), desc_p);
        if (status == FERRY_OK)
            atomic_store(&(*desc_p)->confirmed, FERRY_DESC_CONFIRMED); /* the owner served it */
    }
    free(text);
    return status;
}

/* The records, decoded, as one change set from `since`: its steps taken
 * from each record's set (their pools go along).  FERRY_ERR_UNSUPPORTED:
 * one is missing or of another generation (the caller fetches whole). */
static ferry_status_t merge_records(char **records, size_t count, uint64_t generation,
                                    uint64_t since, size_t n_transports,
                                    ferry_desc_changes_t *merged)
{
    ferry_desc_changes_init(merged, generation, since, n_transports);
    merged->steps = calloc(count + 1, sizeof(*merged->steps));
    if (merged->steps == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = FERRY_OK;
    for (size_t i = 0; i < count && status == FERRY_OK; i++) {
        ferry_desc_changes_t record;
        status = ferry_desc_changes_decode(records[i], strlen(records[i]), &record);
        if (status != FERRY_OK)
            break; /* the decoder logged it */
        if (record.generation != generation || record.from != since + i ||
            record.n_steps != 1 || record.n_transports != n_transports) {
            status = FERRY_ERR_UNSUPPORTED;
        } else {
            ferry_desc_step_t *step = &merged->steps[merged->n_steps++];
            *step = record.steps[0];
            if (step->pool == NULL) { /* its strings are in the record's pool */
                step->pool = record.pool;
                record.pool = NULL;
            }
            record.n_steps = 0;
        }
        ferry_desc_changes_fini(&record);
    }
    return status;
}

/*
 * Refresh of a descriptor we hold through a shared store's change records
 * (plugin.h, fetch_changes): one request for the records since our
 * revision, applied like the owner's changes.  FERRY_ERR_UNSUPPORTED: not
 * possible (an older plugin, no revision, another generation, a record
 * missing or unusable: then *missing_p, and the owner's RPC can fill the
 * gap).
 */
static ferry_status_t store_changes(ferry_engine_t *engine, const char *name,
                                    const ferry_descriptor_t *held, ferry_descriptor_t **desc_p,
                                    int *missing_p)
{
    *missing_p = 0;
    if (!FERRY_METADATA_OPS_HAS(engine->metadata, fetch_changes) || held->revision == 0)
        return FERRY_ERR_UNSUPPORTED;
    uint64_t generation = 0, newest = 0;
    char **records = NULL;
    size_t count = 0;
    ferry_status_t status = engine->metadata->fetch_changes(
        engine->metadata_ctx, name, held->revision, &generation, &newest, &records, &count);
    if (records == NULL)
        count = 0; /* a plugin's failure hands nothing over */
    if (status == FERRY_OK && (generation != held->generation || newest < held->revision ||
                               count != newest - held->revision)) {
        ferry_debug("segment \"%s\": the store's change records do not lead from revision "
                    "%llu to %llu (%zu held); fetching it whole", name,
                    (unsigned long long)held->revision, (unsigned long long)newest, count);
        /* of our generation and ahead of us, yet incomplete: records missing */
        *missing_p = generation == held->generation && newest > held->revision;
        status = FERRY_ERR_UNSUPPORTED;
    }
    ferry_desc_changes_t merged = {0};
    if (status == FERRY_OK && count == 0) {
        *desc_p = ferry_descriptor_ref((ferry_descriptor_t *)held); /* nothing changed */
    } else if (status == FERRY_OK) {
        status = merge_records(records, count, generation, held->revision, held->n_transports,
                               &merged);
        if (status == FERRY_OK)
            status = ferry_descriptor_apply(held, &merged, desc_p);
        /* present but of no use (another step, garbage): the owner knows */
        *missing_p = status == FERRY_ERR_UNSUPPORTED || status == FERRY_ERR_DECODE;
        ferry_desc_changes_fini(&merged);
    }
    for (size_t i = 0; i < count; i++)
        free(records[i]);
    free(records);
    if (status == FERRY_OK)
        return FERRY_OK;
    if (status == FERRY_ERR_DECODE)
        ferry_info("segment \"%s\": its change records do not apply; fetching it whole", name);
    /* The store logged its own failures; the whole fetch says what is wrong. */
    return status == FERRY_ERR_NO_MEMORY ? status : FERRY_ERR_UNSUPPORTED;
}

/*
 * A store with change records holds a checkpoint under the segment's key
 * (engine_publish.c): the whole descriptor, then the records after it.
 * When records are missing, the owner's RPC fills the gap; when it does
 * not answer either, the checkpoint is what there is (logged).
 */
static ferry_status_t fetch_descriptor(ferry_engine_t *engine, const char *name,
                                       ferry_descriptor_t **desc_p)
{
    ferry_descriptor_t *whole = NULL, *newer = NULL;
    ferry_status_t status = fetch_whole(engine, name, &whole);
    if (status != FERRY_OK || !FERRY_METADATA_OPS_HAS(engine->metadata, fetch_changes) ||
        whole->revision == 0 || (engine->metadata_plugin->flags & FERRY_METADATA_OWNER_SERVES)) {
        *desc_p = whole;
        return status;
    }
    int missing = 0;
    status = store_changes(engine, name, whole, &newer, &missing);
    if (status != FERRY_OK && missing) {
        status = owner_changes(engine, whole, whole->name, &newer);
        if (status != FERRY_OK)
            ferry_warn("segment \"%s\": the store misses change records after its checkpoint "
                       "and the owner does not answer (%s); using the checkpoint (revision "
                       "%llu)", name, ferry_status_string(status),
                       (unsigned long long)whole->revision);
    }
    if (status != FERRY_OK) {
        *desc_p = whole; /* no records (an older owner), or no better */
        return FERRY_OK;
    }
    ferry_descriptor_unref(whole);
    *desc_p = newer;
    return FERRY_OK;
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

/* The entry named name with one more open (*created_p 0), or a new one
 * (*created_p 1) that is fetching: the caller settles it. */
static ferry_status_t cache_enter(ferry_engine_t *engine, const char *name,
                                  ferry_segment_t **segment_p, int *created_p)
{
    ferry_segment_cache_t *cache = &engine->segments;
    pthread_mutex_lock(&cache->lock);
    ferry_segment_t *segment = cache->list;
    while (segment && strcmp(segment->name, name) != 0)
        segment = segment->next;
    *created_p = segment == NULL;
    if (segment != NULL) {
        segment->opens++;
        pthread_mutex_unlock(&cache->lock);
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
    pthread_mutex_init(&segment->drain_lock, NULL);
    segment->opens = 1;
    segment->fetching = 1;
    segment->is_local = is_own_name(engine, name);
    segment->stats = ferry_stats_peer(&engine->stats, name);
    segment->handle = ferry_handle_alloc(FERRY_HANDLE_SEGMENT, segment, engine);
    segment->next = cache->list;
    cache->list = segment;
    pthread_mutex_unlock(&cache->lock);
    *segment_p = segment;
    return FERRY_OK;
}

/* An entry found open: once another thread's first fetch of it ended, its
 * outcome (the open dropped again on failure). */
static ferry_status_t cache_joined(ferry_engine_t *engine, ferry_segment_t *segment)
{
    pthread_mutex_lock(&segment->lock);
    while (segment->fetching)
        pthread_cond_wait(&segment->changed, &segment->lock);
    ferry_status_t status = segment->desc ? FERRY_OK : segment->fetch_status;
    pthread_mutex_unlock(&segment->lock);
    if (status != FERRY_OK)
        ferry_segment_cache_close(engine, segment);
    return status;
}

/* A new entry's first descriptor (or why there is none) becomes visible. */
static ferry_status_t cache_settle(ferry_engine_t *engine, ferry_segment_t *segment,
                                   ferry_descriptor_t *desc, ferry_status_t status,
                                   int from_blob)
{
    pthread_mutex_lock(&segment->lock);
    segment->desc = desc;
    segment->from_blob = from_blob;
    segment_changed(segment);
    segment->fetch_status = status;
    segment->fetching = 0;
    pthread_cond_broadcast(&segment->changed);
    pthread_mutex_unlock(&segment->lock);
    if (status != FERRY_OK)
        ferry_segment_cache_close(engine, segment);
    return status;
}

ferry_status_t ferry_segment_cache_open(ferry_engine_t *engine, const char *name,
                                        ferry_segment_t **segment_p)
{
    ferry_segment_t *segment;
    int created;
    ferry_status_t status = cache_enter(engine, name, &segment, &created);
    if (status != FERRY_OK)
        return status;
    if (!created) {
        /* Another thread may still be fetching it: share that fetch. */
        status = cache_joined(engine, segment);
    } else {
        ferry_descriptor_t *desc = NULL;
        if (segment->handle == 0)
            status = FERRY_ERR_NO_RESOURCE;
        else if (segment->is_local)
            status = (desc = local_descriptor(engine)) ? FERRY_OK : FERRY_ERR_SEGMENT_NOT_FOUND;
        else
            status = fetch_descriptor(engine, name, &desc);
        status = cache_settle(engine, segment, desc, status, 0);
    }
    if (status == FERRY_OK)
        *segment_p = segment;
    return status;
}

ferry_status_t ferry_segment_cache_open_desc(ferry_engine_t *engine, ferry_descriptor_t *desc,
                                             ferry_segment_t **segment_p)
{
    ferry_segment_t *segment;
    int created;
    ferry_status_t status = cache_enter(engine, desc->name, &segment, &created);
    if (status != FERRY_OK)
        return status;
    if (!created) {
        status = cache_joined(engine, segment);
    } else if (segment->handle == 0) {
        status = cache_settle(engine, segment, NULL, FERRY_ERR_NO_RESOURCE, 1);
    } else if (segment->is_local) {
        ferry_descriptor_t *own = local_descriptor(engine);
        status = cache_settle(engine, segment, own, own ? FERRY_OK : FERRY_ERR_SEGMENT_NOT_FOUND,
                              0);
    } else {
        status = cache_settle(engine, segment, ferry_descriptor_ref(desc), FERRY_OK, 1);
    }
    if (status == FERRY_OK)
        *segment_p = segment;
    return status;
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
    /* What we hold: the base of an incremental refresh. */
    ferry_descriptor_t *held = ferry_descriptor_ref(segment->desc);
    pthread_mutex_unlock(&segment->lock);

    ferry_descriptor_t *desc = NULL;
    ferry_status_t status = FERRY_ERR_UNSUPPORTED;
    int from_blob = segment->from_blob; /* set before the first desc: held under lock */
    if (segment->is_local)
        status = (desc = local_descriptor(engine)) ? FERRY_OK : FERRY_ERR_SEGMENT_NOT_FOUND;
    else if (from_blob)
        status = held != NULL ? owner_refresh(engine, held, &desc) : FERRY_ERR_SEGMENT_NOT_FOUND;
    else if (held != NULL)
        status = fetch_changes(engine, segment->name, held, &desc);
    if (status == FERRY_ERR_UNSUPPORTED && held != NULL && !segment->is_local && !from_blob &&
        !(engine->metadata_plugin->flags & FERRY_METADATA_OWNER_SERVES)) {
        int missing;
        status = store_changes(engine, segment->name, held, &desc, &missing);
        if (status != FERRY_OK && missing)
            status = owner_changes(engine, held, held->name, &desc);
        if (status != FERRY_OK && status != FERRY_ERR_NO_MEMORY)
            status = FERRY_ERR_UNSUPPORTED; /* whole, then */
        if (status == FERRY_OK && desc != held)
            ferry_engine_confirm_base_pass(engine, held, desc);
    }
    if (status == FERRY_ERR_UNSUPPORTED && !from_blob)
        status = fetch_descriptor(engine, segment->name, &desc);
    if (held != NULL)
        ferry_descriptor_unref(held);

    ferry_descriptor_t *old = NULL;
    /* Read before desc is published: once the lock is dropped, another
     * thread's refetch may replace desc and free it. */
    uint64_t generation = desc != NULL ? desc->generation : 0;
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
        if (old->generation != generation) {
            ferry_info("segment \"%s\" restarted: generation 0x%016llx -> 0x%016llx",
                       segment->name, (unsigned long long)old->generation,
                       (unsigned long long)generation);
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

/* The open segments named name (all when NULL), each held by one more open
 * so that none is freed while the caller works on it unlocked; close each
 * with ferry_segment_cache_close and free the array.  FERRY_ERR_NO_MEMORY,
 * or FERRY_OK with *count_p possibly 0. */
static ferry_status_t hold_segments(ferry_engine_t *engine, const char *name,
                                   ferry_segment_t ***held_p, size_t *count_p)
{
    ferry_segment_cache_t *cache = &engine->segments;
    ferry_segment_t **held = NULL;
    size_t count = 0, capacity = 0;
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&cache->lock);
    for (ferry_segment_t *s = cache->list; s; s = s->next) {
        if (name != NULL && strcmp(s->name, name) != 0)
            continue;
        if (count == capacity) {
            capacity = capacity ? 2 * capacity : 16;
            ferry_segment_t **grown = realloc(held, capacity * sizeof(*grown));
            if (grown == NULL) {
                status = FERRY_ERR_NO_MEMORY;
                break;
            }
            held = grown;
        }
        s->opens++;
        held[count++] = s;
    }
    pthread_mutex_unlock(&cache->lock);
    if (status != FERRY_OK) {
        for (size_t i = 0; i < count; i++)
            ferry_segment_cache_close(engine, held[i]);
        free(held);
        held = NULL;
        count = 0;
    }
    *held_p = held;
    *count_p = count;
    return status;
}

ferry_status_t ferry_segment_cache_refresh(ferry_engine_t *engine, const char *name)
{
    ferry_segment_t **targets;
    size_t count;
    ferry_status_t result = hold_segments(engine, name, &targets, &count);
    if (result != FERRY_OK)
        return result;
    if (name != NULL && count == 0) {
        ferry_error("refresh of segment \"%s\": it is not open", name);
        return FERRY_ERR_SEGMENT_NOT_FOUND;
    }
    for (size_t i = 0; i < count; i++) {
        ferry_status_t status = ferry_segment_refetch(engine, targets[i], NULL);
        if (status != FERRY_OK && result == FERRY_OK)
            result = status;
        ferry_segment_cache_close(engine, targets[i]);
    }
    free(targets);
    return result;
}

void ferry_segment_cache_changed(void *engine, const char *name)
{
    /* A store's watch: the owner does not wait for this answer. */
    ferry_segment_cache_invalidate(engine, name, 0, 0);
}

/* p2p segments may be opened by address, so the descriptor's name counts too. */
static int segment_named(ferry_segment_t *segment, const char *name)
{
    return strcmp(segment->name, name) == 0 ||
           (segment->desc != NULL && strcmp(segment->desc->name, name) == 0);
}

ferry_status_t ferry_segment_cache_invalidate(ferry_engine_t *engine, const char *name,
                                              uint64_t generation, unsigned drain_ms)
{
    ferry_segment_t **held;
    size_t count;
    ferry_status_t result = hold_segments(engine, NULL, &held, &count);
    if (result != FERRY_OK)
        return result;
    for (size_t i = 0; i < count; i++) {
        ferry_segment_t *s = held[i];
        ferry_descriptor_t *changed = NULL;
        pthread_mutex_lock(&s->lock);
        int named = segment_named(s, name);
        if (named) {
            s->stale = 1;
            segment_changed(s);
            ferry_debug("segment \"%s\" invalidated by its owner (generation 0x%016llx)",
                        s->name, (unsigned long long)generation);
            if (s->desc && s->desc->generation == generation)
                changed = ferry_descriptor_ref(s->desc);
        }
        pthread_mutex_unlock(&s->lock);
        /* The owner may take the range back once we answer: copies that
         * resolved against the old descriptor end first. */
        if (named && drain_ms > 0 && ferry_segment_copiers_drain(s, drain_ms) != FERRY_OK) {
            ferry_warn("segment \"%s\": one-sided copies still ran %u ms after its owner "
                       "invalidated it", s->name, drain_ms);
            result = FERRY_ERR_TIMEOUT;
        }
        /* Same incarnation, fewer buffers: transports drop what they cached
         * for the old ones (no lock held: they take their own). */
        if (changed != NULL) {
            ferry_engine_peer_changed(engine, changed);
            ferry_descriptor_unref(changed);
        }
        ferry_segment_cache_close(engine, s);
    }
    free(held);
    return result;
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

ferry_status_t ferry_segment_resolve(ferry_engine_h engine_handle, ferry_segment_h segment_handle,
                                     ferry_engine_t **engine_p, ferry_segment_t **segment_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(engine_handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    ferry_segment_t *segment = segment_lookup(engine, segment_handle);
    if (segment == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    *engine_p = engine;
    *segment_p = segment;
    return FERRY_OK;
}

ferry_status_t ferry_segment_close(ferry_engine_h handle, ferry_segment_h segment_handle)
{
    ferry_engine_t *engine;
    ferry_segment_t *segment;
    if (ferry_segment_resolve(handle, segment_handle, &engine, &segment) != FERRY_OK)
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
    ferry_engine_t *engine;
    ferry_segment_t *segment;
    if (ferry_segment_resolve(handle, segment_handle, &engine, &segment) != FERRY_OK)
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
