/*
 * Publishing: the engine's own descriptor, its texts, its revisions and the
 * log of changes between them.
 *
 * Registrations change the registry under register_lock and note what
 * changed (`pending`: entries added, addresses removed).  A publish turns
 * the pending changes into one step of the change log and counts a new
 * revision; nothing is built or encoded then.  The descriptor is made when
 * someone needs it (a fetch, a store that holds whole descriptors, our own
 * segment opened): from the previous one by applying the steps since, a
 * copy of the buffer array and O(changes) work, or from the registry when
 * there is none or the log no longer reaches back to it.  Its texts are
 * encoded on demand, once per form.  A peer that holds revision v asks for
 * the changes since v (engine_rpc.c) and gets the log's steps as text, no
 * descriptor built at all, or the whole descriptor when v is older than
 * the log or of another generation.
 *
 * The log is bounded (LOG_STEPS steps, LOG_BUFFERS buffers in all): the
 * oldest steps go first.  A publish with more pending changes than
 * LOG_BUFFERS (a bulk registration) empties the log instead: every peer
 * then refetches whole, which costs about what the changes would.
 *
 * Locks: pending is register_lock's; revision, changes, local_desc and
 * the texts are published_lock's.  A publish holds both (register_lock
 * first).
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

#define LOG_STEPS 256
#define LOG_BUFFERS 65536

/* Whether the transport's key may be published for a buffer with those
 * flags: a key that grants reads (a UCX rkey) is kept from a buffer that
 * peers may not read. */
static int key_enforces(const ferry_transport_instance_t *tp, unsigned flags)
{
    return !(tp->plugin->flags & FERRY_TRANSPORT_KEY_GRANTS_READ) ||
           (flags & FERRY_REG_REMOTE_READ);
}

/* The published view of one registered range, strings in pool. */
static int fill_buffer(const ferry_engine_t *engine, const ferry_reg_entry_t *entry,
                       ferry_desc_pool_t *pool, ferry_desc_buffer_t *buffer)
{
    buffer->addr = entry->addr;
    buffer->length = entry->length;
    buffer->access = entry->flags & FERRY_REG_REMOTE;
    buffer->location = ferry_desc_pool_strndup(pool, entry->location, strlen(entry->location));
    buffer->keys = ferry_desc_pool_alloc(pool, engine->n_transports * sizeof(char *));
    if (buffer->location == NULL || buffer->keys == NULL)
        return 0;
    for (size_t t = 0; t < engine->n_transports; t++) {
        const char *key = entry->keys[t];
        if (key == NULL || !key_enforces(&engine->transports[t], entry->flags)) {
            buffer->keys[t] = NULL;
            continue;
        }
        if ((buffer->keys[t] = ferry_desc_pool_strndup(pool, key, strlen(key))) == NULL)
            return 0;
    }
    return 1;
}

/* The whole descriptor from the registry.  Caller holds published_lock
 * (for published_epoch). */
static ferry_status_t build_descriptor(ferry_engine_t *engine, ferry_descriptor_t **desc_p)
{
    ferry_descriptor_t *desc = ferry_descriptor_new();
    if (desc == NULL)
        return FERRY_ERR_NO_MEMORY;
    desc->name = strdup(engine->name);
    desc->generation = engine->generation;
    desc->revision = engine->revision;
    desc->host_id = strdup(engine->host_id);
    desc->rpc = strdup(engine->rpc_endpoint);
    desc->transports = calloc(engine->n_transports + 1, sizeof(*desc->transports));
    desc->pool = ferry_desc_pool_new(NULL);
    if (!desc->name || !desc->host_id || !desc->rpc || !desc->transports || !desc->pool)
        goto err_unref;
    for (size_t i = 0; i < engine->n_transports; i++, desc->n_transports++) {
        desc->transports[i].name = strdup(engine->transports[i].plugin->name);
        desc->transports[i].endpoint = strdup(engine->transports[i].address);
        if (!desc->transports[i].name || !desc->transports[i].endpoint)
            goto err_unref;
    }
    ferry_registry_t *registry = &engine->registry;
    pthread_rwlock_rdlock(&registry->lock);
    desc->buffers = calloc(registry->count + 1, sizeof(*desc->buffers));
    int complete = desc->buffers != NULL;
    ferry_registry_iter_t it;
    ferry_registry_iter_init(&it, registry);
    for (const ferry_reg_entry_t *entry; complete && (entry = ferry_registry_iter_next(&it));) {
        if (entry->epoch > engine->published_epoch)
            continue; /* registered with FERRY_REG_DEFER_PUBLISH, not published yet */
        complete = fill_buffer(engine, entry, desc->pool, &desc->buffers[desc->n_buffers++]);
    }
    pthread_rwlock_unlock(&registry->lock);
    if (!complete) /* a descriptor without some buffer or key would mislead peers */
        goto err_unref;
    *desc_p = desc;
    return FERRY_OK;

err_unref:
    ferry_descriptor_unref(desc);
    return FERRY_ERR_NO_MEMORY;
}

/* ---------------- pending changes (register_lock) ---------------- */

static void pending_drop(ferry_desc_pending_t *pending)
{
    free(pending->added);
    free(pending->removed);
    pending->added = NULL;
    pending->removed = NULL;
    pending->n_added = pending->n_removed = 0;
    pending->added_capacity = pending->removed_capacity = 0;
}

/* Past LOG_BUFFERS, no step is kept for this publish: stop counting. */
static int pending_room(ferry_desc_pending_t *pending)
{
    if (!pending->overflow && pending->n_added + pending->n_removed >= LOG_BUFFERS) {
        pending_drop(pending);
        pending->overflow = 1;
    }
    return !pending->overflow;
}

static int grow(void **array, size_t *capacity, size_t count, size_t size)
{
    if (count < *capacity)
        return 1;
    size_t more = *capacity ? 2 * *capacity : 16;
    void *grown = realloc(*array, more * size);
    if (grown == NULL)
        return 0;
    *array = grown;
    *capacity = more;
    return 1;
}

void ferry_engine_changes_added(ferry_engine_t *engine, ferry_reg_entry_t *entry)
{
    ferry_desc_pending_t *pending = &engine->pending;
    if (!pending_room(pending))
        return;
    if (!grow((void **)&pending->added, &pending->added_capacity, pending->n_added,
              sizeof(*pending->added))) {
        pending_drop(pending); /* out of memory: the log restarts at the publish */
        pending->overflow = 1;
        return;
    }
    pending->added[pending->n_added++] = entry;
}

void ferry_engine_changes_removed(ferry_engine_t *engine, ferry_reg_entry_t *entry)
{
    ferry_desc_pending_t *pending = &engine->pending;
    if (pending->overflow)
        return;
    if (entry->epoch > engine->published_epoch) {
        /* never published: it leaves the pending additions (the newest
         * are the likeliest: a batch undoing itself) */
        for (size_t i = pending->n_added; i-- > 0;) {
            if (pending->added[i] == entry) {
                pending->added[i] = pending->added[--pending->n_added];
                return;
            }
        }
        return;
    }
    if (!pending_room(pending))
        return;
    if (!grow((void **)&pending->removed, &pending->removed_capacity, pending->n_removed,
              sizeof(*pending->removed))) {
        pending_drop(pending);
        pending->overflow = 1;
        return;
    }
    pending->removed[pending->n_removed++] = entry->addr;
}

/* ---------------- the log (published_lock) ---------------- */

static int by_addr(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static int by_entry_addr(const void *a, const void *b)
{
    const ferry_reg_entry_t *x = *(ferry_reg_entry_t *const *)a;
    const ferry_reg_entry_t *y = *(ferry_reg_entry_t *const *)b;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

static size_t log_buffers(const ferry_desc_changes_t *log)
{
    size_t total = 0;
    for (size_t s = 0; s < log->n_steps; s++)
        total += log->steps[s].n_removed + log->steps[s].n_added;
    return total;
}

static void log_drop_oldest(ferry_desc_changes_t *log)
{
    ferry_desc_step_t *oldest = &log->steps[0];
    free(oldest->removed);
    free(oldest->added);
    ferry_desc_pool_unref(oldest->pool);
    memmove(&log->steps[0], &log->steps[1], (log->n_steps - 1) * sizeof(log->steps[0]));
    log->n_steps--;
    log->from++;
}

/* Nothing before `revision` can be told as changes any more. */
static void log_restart(ferry_desc_changes_t *log, uint64_t revision)
{
    while (log->n_steps > 0)
        log_drop_oldest(log);
    log->from = revision;
}

/* The pending changes as the step to revision, strings in its own pool. */
static int make_step(ferry_engine_t *engine, uint64_t revision, ferry_desc_step_t *step)
{
    ferry_desc_pending_t *pending = &engine->pending;
    *step = (ferry_desc_step_t){.revision = revision, .n_removed = pending->n_removed};
    step->removed = pending->removed;
    pending->removed = NULL;
    pending->removed_capacity = 0;
    if (step->n_removed > 1)
        qsort(step->removed, step->n_removed, sizeof(*step->removed), by_addr);
    if (pending->n_added > 1)
        qsort(pending->added, pending->n_added, sizeof(*pending->added), by_entry_addr);
    step->added = calloc(pending->n_added + 1, sizeof(*step->added));
    step->pool = ferry_desc_pool_new(NULL);
    if (step->added == NULL || step->pool == NULL)
        return 0;
    for (; step->n_added < pending->n_added; step->n_added++)
        if (!fill_buffer(engine, pending->added[step->n_added], step->pool,
                         &step->added[step->n_added]))
            return 0;
    return 1;
}

static void step_free(ferry_desc_step_t *step)
{
    free(step->removed);
    free(step->added);
    ferry_desc_pool_unref(step->pool);
}

/* The pending changes become the next revision; caller holds
 * register_lock. */
static void publish_changes(ferry_engine_t *engine)
{
    ferry_desc_pending_t *pending = &engine->pending;
    ferry_desc_changes_t *log = &engine->changes;
    int changed = pending->overflow || pending->n_added + pending->n_removed > 0;
    pthread_mutex_lock(&engine->published_lock);
    engine->published_epoch = engine->register_epoch;
    if (changed) {
        uint64_t revision = ++engine->revision;
        ferry_desc_step_t step;
        int kept = !pending->overflow && make_step(engine, revision, &step);
        if (!kept) {
            if (!pending->overflow)
                step_free(&step);
            log_restart(log, revision); /* peers older than this fetch whole */
        } else {
            while (log->n_steps > 0 && (log->n_steps >= LOG_STEPS ||
                                        log_buffers(log) + step.n_added + step.n_removed >
                                            LOG_BUFFERS))
                log_drop_oldest(log);
            log->steps[log->n_steps++] = step;
        }
    }
    pthread_mutex_unlock(&engine->published_lock);
    pending_drop(pending);
    pending->overflow = 0;
}

ferry_status_t ferry_engine_changes_init(ferry_engine_t *engine)
{
    engine->revision = 1;
    ferry_desc_changes_init(&engine->changes, 0, 1, 0);
    engine->changes.steps = calloc(LOG_STEPS, sizeof(*engine->changes.steps));
    return engine->changes.steps ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

void ferry_engine_changes_fini(ferry_engine_t *engine)
{
    for (size_t s = 0; s < engine->changes.n_steps; s++)
        step_free(&engine->changes.steps[s]);
    engine->changes.n_steps = 0;
    ferry_desc_changes_fini(&engine->changes);
    pending_drop(&engine->pending);
    for (int f = 0; f < 2; f++)
        free(engine->published_text[f]);
    if (engine->local_desc)
        ferry_descriptor_unref(engine->local_desc);
}

/* The log's steps after `since` as a change set that borrows them. */
static ferry_desc_changes_t log_since(const ferry_engine_t *engine, uint64_t since)
{
    const ferry_desc_changes_t *log = &engine->changes;
    size_t skip = (size_t)(since - log->from);
    return (ferry_desc_changes_t){.generation = engine->generation, .from = since,
                                  .n_transports = engine->n_transports,
                                  .n_steps = log->n_steps - skip, .steps = log->steps + skip};
}

/* ---------------- the descriptor and its texts (published_lock) ---------------- */

/* local_desc at the newest revision; caller holds published_lock. */
static ferry_status_t materialize(ferry_engine_t *engine)
{
    ferry_descriptor_t *old = engine->local_desc, *desc = NULL;
    if (old != NULL && old->revision == engine->revision)
        return FERRY_OK;
    ferry_status_t status;
    if (old != NULL && old->revision >= engine->changes.from) {
        ferry_desc_changes_t since = log_since(engine, old->revision);
        status = ferry_descriptor_apply(old, &since, &desc);
    } else {
        status = build_descriptor(engine, &desc);
    }
    if (status != FERRY_OK)
        return status;
    if (old != NULL)
        ferry_descriptor_unref(old);
    engine->local_desc = desc;
    for (int f = 0; f < 2; f++) {
        free(engine->published_text[f]);
        engine->published_text[f] = NULL;
    }
    return FERRY_OK;
}

static ferry_status_t text_locked(ferry_engine_t *engine, ferry_desc_form_t form, char **text_p,
                                  size_t *length_p)
{
    ferry_status_t status = materialize(engine);
    if (status == FERRY_OK && engine->published_text[form] == NULL)
        status = ferry_descriptor_encode_as(engine->local_desc, form,
                                            &engine->published_text[form],
                                            &engine->published_length[form]);
    if (status != FERRY_OK)
        return status;
    *length_p = engine->published_length[form];
    *text_p = malloc(*length_p + 1);
    if (*text_p == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(*text_p, engine->published_text[form], *length_p + 1);
    return FERRY_OK;
}

ferry_status_t ferry_engine_local_text(ferry_engine_t *engine, ferry_desc_form_t form,
                                       char **text_p, size_t *length_p)
{
    pthread_mutex_lock(&engine->published_lock);
    ferry_status_t status = text_locked(engine, form, text_p, length_p);
    pthread_mutex_unlock(&engine->published_lock);
    return status;
}

ferry_status_t ferry_engine_local_descriptor(ferry_engine_t *engine, ferry_descriptor_t **desc_p,
                                             char **json_p)
{
    size_t length;
    pthread_mutex_lock(&engine->published_lock);
    ferry_status_t status = materialize(engine);
    if (status == FERRY_OK && json_p != NULL)
        status = text_locked(engine, FERRY_DESC_FORM_JSON, json_p, &length);
    if (status == FERRY_OK && desc_p != NULL)
        *desc_p = ferry_descriptor_ref(engine->local_desc);
    pthread_mutex_unlock(&engine->published_lock);
    return status;
}

ferry_status_t ferry_engine_changes_text(ferry_engine_t *engine, uint64_t generation,
                                         uint64_t revision, ferry_desc_form_t form,
                                         char **text_p, size_t *length_p)
{
    pthread_mutex_lock(&engine->published_lock);
    ferry_status_t status;
    if (generation == engine->generation && revision != 0 &&
        revision >= engine->changes.from && revision <= engine->revision) {
        ferry_desc_changes_t since = log_since(engine, revision);
        status = ferry_desc_changes_encode(&since, revision, text_p, length_p);
    } else {
        status = text_locked(engine, form, text_p, length_p);
    }
    pthread_mutex_unlock(&engine->published_lock);
    return status;
}

/*
 * A shared store that keeps change records (plugin.h, publish_changes)
 * gets the newest step as a record, and the whole descriptor only now and
 * then, as a checkpoint: when the records since the last one hold more
 * than an eighth of its size (at least CHECKPOINT_BYTES_MIN), or
 * CHECKPOINT_STEPS of them; or when the store could not take the record
 * (no step in the log: a bulk registration emptied it; the store missed a
 * revision; it is away).  So a publish of one change costs one small
 * record, the whole encoding is paid once per so many changes, and a
 * reader that opens the segment reads the checkpoint and at most an eighth
 * more.  Only for the compact form: a JSON descriptor carries no revision,
 * so no reader would ever ask.  After a publication the store refused,
 * the next is whole whatever changed.  Caller holds register_lock (store_*).
 * Returns whether the whole descriptor is to be published.
 */
#define CHECKPOINT_STEPS 128
#define CHECKPOINT_BYTES_MIN ((size_t)64 << 10)

static int publish_store_changes(ferry_engine_t *engine)
{
    if (engine->publish_form != FERRY_DESC_FORM_COMPACT ||
        !FERRY_METADATA_OPS_HAS(engine->metadata, publish_changes))
        return 1;
    char *text = NULL;
    size_t length = 0;
    pthread_mutex_lock(&engine->published_lock);
    uint64_t revision = engine->revision;
    const ferry_desc_changes_t *log = &engine->changes;
    /* readers behind need the log's reach; openers every record since the
     * checkpoint */
    uint64_t oldest = log->from + 1;
    if (engine->store_checkpoint + 1 < oldest)
        oldest = engine->store_checkpoint + 1;
    if (revision == engine->store_revision && !engine->store_behind) {
        pthread_mutex_unlock(&engine->published_lock);
        return 0; /* nothing changed: the store has it all */
    }
    if (engine->store_behind) {
        engine->store_revision = revision;
        pthread_mutex_unlock(&engine->published_lock);
        return 1; /* its last whole descriptor was refused: that again, new */
    }
    if (engine->store_revision != 0 && engine->store_revision + 1 == revision &&
        log->n_steps > 0 && log->steps[log->n_steps - 1].revision == revision) {
        ferry_desc_changes_t newest = log_since(engine, revision - 1);
        if (ferry_desc_changes_encode(&newest, revision - 1, &text, &length) != FERRY_OK)
            text = NULL; /* logged; a checkpoint instead */
    }
    pthread_mutex_unlock(&engine->published_lock);
    ferry_status_t status = engine->metadata->publish_changes(
        engine->metadata_ctx, engine->name, engine->generation, revision, oldest, text);
    free(text);
    engine->store_revision = revision;
    if (status != FERRY_OK)
        return 1;
    engine->store_steps++;
    engine->store_bytes += length;
    size_t bound = engine->store_whole_length / 8;
    return engine->store_steps >= CHECKPOINT_STEPS ||
           engine->store_bytes > (bound > CHECKPOINT_BYTES_MIN ? bound : CHECKPOINT_BYTES_MIN);
}

ferry_status_t ferry_engine_publish_locked(ferry_engine_t *engine)
{
    publish_changes(engine);
    /* Owner-served stores (p2p) ask us when a peer wants it: encoding now
     * would make n registrations cost O(n^2). */
    if (engine->metadata_plugin->flags & FERRY_METADATA_OWNER_SERVES)
        return FERRY_OK;
    if (!publish_store_changes(engine))
        return FERRY_OK;
    char *text;
    size_t length;
    ferry_status_t status = ferry_engine_local_text(engine, engine->publish_form, &text,
                                                    &length);
    if (status != FERRY_OK)
        return status;
    status = engine->metadata->publish(engine->metadata_ctx, engine->name, text);
    free(text);
    /* Taken (or kept by the store for its keeper): the new checkpoint. */
    engine->store_behind = status != FERRY_OK;
    engine->store_checkpoint = engine->store_revision;
    engine->store_steps = 0;
    engine->store_bytes = 0;
    engine->store_whole_length = length;
    return status;
}
