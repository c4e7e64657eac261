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

static void drop_kept(ferry_md_records_t *records)
{
    for (size_t i = 0; i < records->n_kept; i++)
        free(records->kept[i].text);
    records->n_kept = records->n_written = 0;
}

void ferry_md_records_fini(ferry_md_records_t *records)
{
    drop_kept(records);
    free(records->kept);
    pthread_mutex_destroy(&records->lock);
}

/* Caller holds lock. */
static void restart(ferry_md_records_t *records)
{
    drop_kept(records);
    records->restarts++;
}

ferry_status_t ferry_md_records_add(ferry_md_records_t *records, uint64_t generation,
                                    uint64_t revision, uint64_t oldest, const char *text)
{
    char *copy = NULL;
    if (text != NULL && (copy = strdup(text)) == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&records->lock);
    if (records->kept == NULL)
        records->kept = calloc(FERRY_MD_RECORDS_KEPT_MAX, sizeof(*records->kept));
    /* Anything but the next revision of the same generation leaves a gap. */
    int gap = records->kept == NULL || generation != records->generation ||
              revision != records->newest + 1 || copy == NULL;
    if (!gap && records->n_kept == FERRY_MD_RECORDS_KEPT_MAX) {
        status = FERRY_ERR_NO_RESOURCE;
        gap = 1;
    }
    if (gap) {
        restart(records);
        free(copy);
    } else {
        records->kept[records->n_kept++] = (ferry_md_record_t){revision, copy};
    }
    records->generation = generation;
    records->newest = revision;
    records->oldest = oldest;
    pthread_mutex_unlock(&records->lock);
    return status;
}

void ferry_md_records_checkpoint(ferry_md_records_t *records)
{
    pthread_mutex_lock(&records->lock);
    if (records->n_written < records->n_kept) {
        /* not on the server yet: they go with the checkpoint's write */
        for (size_t i = 0; i < records->n_written; i++)
            free(records->kept[i].text);
        memmove(records->kept, records->kept + records->n_written,
                (records->n_kept - records->n_written) * sizeof(*records->kept));
        records->n_kept -= records->n_written;
        records->n_written = 0;
    } else {
        drop_kept(records);
    }
    pthread_mutex_unlock(&records->lock);
}

int ferry_md_records_pending(ferry_md_records_t *records)
{
    pthread_mutex_lock(&records->lock);
    int pending = records->newest != 0 &&
                  (records->n_written < records->n_kept || records->head_written != records->newest ||
                   records->restarts != records->restarts_done);
    pthread_mutex_unlock(&records->lock);
    return pending;
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
    size_t first = batch->restart ? 0 : records->n_written;
    batch->records = calloc(records->n_kept - first + 1, sizeof(*batch->records));
    for (size_t i = first; batch->records != NULL && i < records->n_kept; i++) {
        char *text = strdup(records->kept[i].text);
        if (text == NULL)
            break;
        batch->records[batch->n_records++] = (ferry_md_record_t){records->kept[i].revision, text};
    }
    if (batch->records == NULL || batch->n_records < records->n_kept - first) {
        ferry_md_records_batch_fini(batch);
        pthread_mutex_unlock(&records->lock);
        return -1; /* out of memory: the keeper tries again */
    }
    if (batch->prune_below > 0 && batch->n_records > 0 &&
        batch->records[0].revision < batch->prune_below)
        batch->prune_below = batch->records[0].revision; /* no key deleted and written at once */
    pthread_mutex_unlock(&records->lock);
    return 1;
}

void ferry_md_records_written(ferry_md_records_t *records, const ferry_md_records_batch_t *batch)
{
    pthread_mutex_lock(&records->lock);
    if (batch->restarts == records->restarts) {
        /* nothing restarted meanwhile: kept still holds what was taken */
        size_t n = 0;
        while (n < records->n_kept && records->kept[n].revision <= batch->newest)
            n++;
        if (n > records->n_written)
            records->n_written = n;
        records->restarts_done = batch->restarts;
        if (batch->newest > records->head_written)
            records->head_written = batch->newest;
    }
    if (batch->restart)
        records->pruned = batch->newest;
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
    records->n_written = 0; /* kept: written again after the restart's delete */
    records->head_written = 0;
    records->restarts++;
    pthread_mutex_unlock(&records->lock);
}

void ferry_md_records_clear(ferry_md_records_t *records)
{
    pthread_mutex_lock(&records->lock);
    drop_kept(records);
    records->generation = records->newest = records->oldest = records->pruned = 0;
    records->head_written = 0;
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
