/*
 * The redis store's change log (redis.c, "change records"): the commands
 * that write it, built here and sent by redis.c in one pipeline.
 */
#include "../keys.h"
#include "redis.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ferry_redis_log_key(const char *key)
{
    return ferry_md_strcat3(key, "/changes/log", "");
}

int ferry_redis_write_add(ferry_redis_write_t *w, int argc, const char **argv)
{
    size_t *lengths = malloc((size_t)argc * sizeof(*lengths));
    if (lengths == NULL)
        return 0;
    for (int i = 0; i < argc; i++)
        lengths[i] = strlen(argv[i]);
    w->argcs[w->n] = argc;
    w->argvs[w->n] = argv;
    w->lengths[w->n++] = lengths;
    return 1;
}

void ferry_redis_write_fini(ferry_redis_write_t *w)
{
    for (size_t i = 0; i < w->n; i++)
        free(w->lengths[i]);
    free(w->zadd);
    free(w->scores);
    free(w->log);
}

int ferry_redis_write_changes(ferry_redis_write_t *w, const char *key, const char *ttl,
                         const ferry_md_records_batch_t *batch)
{
    size_t argc = 2 + 2 * (batch->n_records + 1);
    w->log = ferry_redis_log_key(key);
    w->zadd = malloc(argc * sizeof(*w->zadd));
    w->scores = malloc((batch->n_records + 1) * sizeof(*w->scores));
    if (w->log == NULL || w->zadd == NULL || w->scores == NULL)
        return 0;
    w->del[0] = "DEL";
    w->del[1] = w->log;
    if (batch->restart && !ferry_redis_write_add(w, 2, w->del))
        return 0;
    w->zadd[0] = "ZADD";
    w->zadd[1] = w->log;
    for (size_t i = 0; i < batch->n_records; i++) {
        snprintf(w->scores[i], sizeof(w->scores[i]), "%" PRIu64, batch->records[i].revision);
        w->zadd[2 + 2 * i] = w->scores[i];
        w->zadd[3 + 2 * i] = batch->records[i].text;
    }
    snprintf(w->newest, sizeof(w->newest), "%" PRIu64, batch->newest);
    snprintf(w->head, sizeof(w->head), FERRY_REDIS_HEAD "%" PRIx64, batch->generation);
    w->zadd[argc - 2] = w->newest;
    w->zadd[argc - 1] = w->head;
    if (!ferry_redis_write_add(w, (int)argc, w->zadd))
        return 0;
    snprintf(w->prune_below, sizeof(w->prune_below), "(%" PRIu64, batch->prune_below);
    w->prune[0] = "ZREMRANGEBYSCORE";
    w->prune[1] = w->log;
    w->prune[2] = "-inf";
    w->prune[3] = w->prune_below;
    if (batch->prune_below != 0 && !ferry_redis_write_add(w, 4, w->prune))
        return 0;
    w->expire[0] = "PEXPIRE";
    w->expire[1] = w->log;
    w->expire[2] = ttl;
    return ferry_redis_write_add(w, 3, w->expire);
}
