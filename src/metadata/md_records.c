/* Change records waiting for the next write: see md_records.h. */
#include "md_records.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ferry_md_records_init(ferry_md_records_t *records)
{
    memset(records, 0, sizeof(*records));
    pthread_mutex_init(&records->lock, NULL);
}

static void drop_pending(ferry_md_records_t *records)
{
    for (size_t i = 0; i < records->n_pending; i++)
        free(records->pending[i].text);
    records->n_pending = 0;
}

void ferry_md_records_fini(ferry_md_records_t *records)
{
    drop_pending(records);
    free(records->pending);
    pthread_mutex_destroy(&records->lock);
}

/* Caller holds lock. */
static void restart(ferry_md_records_t *records)
{
    drop_pending(records);
    records->restarts++;
}

ferry_status_t ferry_md_records_add(ferry_md_records_t *records, uint64_t generation,
                                    uint64_t revision, uint64_t oldest, const char *text)
{
    char *copy = NULL;
    if (text != NULL && (copy = strdup(text)) == NULL)
        return FERRY_ERR_NO_MEMORY;
    pthread_mutex_lock(&records->lock);
    if (records->pending == NULL)
        records->pending = calloc(FERRY_MD_RECORDS_PENDING_MAX, sizeof(*records->pending));
    if (records->pending == NULL) {
        pthread_mutex_unlock(&records->lock);
        free(copy);
        return FERRY_ERR_NO_MEMORY;
    }
    /* Anything but the next revision of the same generation leaves a gap. */
    int gap = generation != records->generation || revision != records->newest + 1 ||
              copy == NULL || records->n_pending == FERRY_MD_RECORDS_PENDING_MAX;
    if (gap) {
        restart(records);
        free(copy);
    } else {
        records->pending[records->n_pending++] = (ferry_md_record_t){revision, copy};
    }
    records->generation = generation;
    records->newest = revision;
    records->oldest = oldest;
    pthread_mutex_unlock(&records->lock);
    return FERRY_OK;
}

int ferry_md_records_take(ferry_md_records_t *records, ferry_md_records_batch_t *batch)
{
    memset(batch, 0, sizeof(*batch));
    pthread_mutex_lock(&records->lock);
    if (records->newest == 0) {
        pthread_mutex_unlock(&records->lock);
        return 0;
    }
    batch->generation = records->generation;
    batch->newest = records->newest;
    batch->restart = records->restarts != records->restarts_done;
    batch->restarts = records->restarts;
    if (!batch->restart && records->oldest >= records->pruned + FERRY_MD_RECORDS_PRUNE_EVERY)
        batch->prune_below = records->oldest;
    batch->records = calloc(records->n_pending + 1, sizeof(*batch->records));
    for (size_t i = 0; batch->records != NULL && i < records->n_pending; i++) {
        const ferry_md_record_t *record = &records->pending[i];
        if (record->revision < records->oldest)
            continue; /* fell off the owner's log while waiting */
        char *text = strdup(record->text);
        if (text == NULL)
            break;
        batch->records[batch->n_records++] = (ferry_md_record_t){record->revision, text};
    }
    if (batch->records == NULL || batch->n_records < records->n_pending) {
        /* out of memory: what cannot go along is a gap */
        restart(records);
        batch->restart = 1;
        batch->restarts = records->restarts;
        batch->prune_below = 0;
    }
    pthread_mutex_unlock(&records->lock);
    return 1;
}

void ferry_md_records_written(ferry_md_records_t *records, const ferry_md_records_batch_t *batch)
{
    pthread_mutex_lock(&records->lock);
    size_t kept = 0;
    for (size_t i = 0; i < records->n_pending; i++) {
        if (records->pending[i].revision <= batch->newest)
            free(records->pending[i].text);
        else
            records->pending[kept++] = records->pending[i];
    }
    records->n_pending = kept;
    if (batch->restart && records->restarts_done < batch->restarts)
        records->restarts_done = batch->restarts;
    if (batch->restart)
        records->pruned = batch->newest; /* all deleted, then the newer written */
    else if (batch->prune_below > records->pruned)
        records->pruned = batch->prune_below;
    pthread_mutex_unlock(&records->lock);
}

void ferry_md_records_batch_fini(ferry_md_records_batch_t *batch)
{
    for (size_t i = 0; i < batch->n_records; i++)
        free(batch->records[i].text);
    free(batch->records);
    memset(batch, 0, sizeof(*batch));
}

void ferry_md_records_lost(ferry_md_records_t *records)
{
    pthread_mutex_lock(&records->lock);
    restart(records);
    pthread_mutex_unlock(&records->lock);
}

void ferry_md_records_clear(ferry_md_records_t *records)
{
    pthread_mutex_lock(&records->lock);
    drop_pending(records);
    records->generation = records->newest = records->oldest = records->pruned = 0;
    records->restarts_done = ++records->restarts; /* a new segment starts clean */
    pthread_mutex_unlock(&records->lock);
}

void ferry_md_head_format(char *out, uint64_t generation, uint64_t newest)
{
    snprintf(out, FERRY_MD_HEAD_MAX, "%" PRIx64 " %" PRIx64, generation, newest);
}

int ferry_md_head_parse(const char *text, size_t length, uint64_t *generation_p,
                        uint64_t *newest_p)
{
    char copy[FERRY_MD_HEAD_MAX], *end;
    if (length == 0 || length >= sizeof(copy))
        return 0;
    memcpy(copy, text, length);
    copy[length] = '\0';
    if (copy[0] == ' ' || copy[0] == '-' || copy[0] == '+')
        return 0;
    unsigned long long generation = strtoull(copy, &end, 16);
    if (*end != ' ' || end[1] == ' ' || end[1] == '-' || end[1] == '+' || end[1] == '\0')
        return 0;
    unsigned long long newest = strtoull(end + 1, &end, 16);
    if (*end != '\0')
        return 0;
    *generation_p = generation;
    *newest_p = newest;
    return 1;
}
