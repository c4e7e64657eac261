/*
 * redis metadata store (redis.c: connections, commands, the expiry keeper).
 * What the store makes of redis's replies lives apart, in redis_reply.c, so
 * the fuzz harness (test/fuzz/fuzz_redis.c) can hand it every reply that
 * hiredis's reader builds from arbitrary bytes.
 */
#ifndef FERRY_METADATA_REDIS_H
#define FERRY_METADATA_REDIS_H

#include <ferry/plugin.h>

#include "../md_records.h"

#include <hiredis/hiredis.h>
#include <stddef.h>

/* 1 for a status reply "OK" (AUTH, SELECT, SET); else 0, why saying what
 * came instead. */
int ferry_redis_reply_ok(const redisReply *reply, char *why, size_t whylen);
/* A GET's reply: the value (malloc-ed, NUL-terminated) for a string;
 * FERRY_ERR_SEGMENT_NOT_FOUND for nil; FERRY_ERR_METADATA for an error
 * reply and FERRY_ERR_DECODE for any other type, why saying which. */
ferry_status_t ferry_redis_value(const redisReply *reply, char **value_p, char *why,
                                 size_t whylen);
/* 1 when a PEXPIRE's reply says the key was there (integer 1). */
int ferry_redis_renewed(const redisReply *reply);

/* The change log of a segment (redis.c, "change records"): a sorted set
 * whose members are the records (scored by revision) and one head,
 * "head:<hex generation>", scored by the newest revision. */
#define FERRY_REDIS_HEAD "head:"
/* A ZRANGEBYSCORE ... WITHSCORES reply: the head's generation and newest
 * revision, and the records scored above since, ascending, into records
 * (room for max; each malloc-ed).  FERRY_ERR_SEGMENT_NOT_FOUND without a
 * head, FERRY_ERR_DECODE for a reply of another shape, FERRY_ERR_METADATA
 * for an error reply (why says which). */
ferry_status_t ferry_redis_changes(const redisReply *reply, uint64_t since,
                                   uint64_t *generation_p, uint64_t *newest_p, char **records,
                                   size_t max, size_t *count_p, char *why, size_t whylen);

/* redis_changes.c: the sorted set beside a segment's key K, K/changes/log
 * (malloc-ed). */
char *ferry_redis_log_key(const char *key);

/* One pipeline, up to 5 commands: DEL, ZADD, ZREMRANGEBYSCORE and PEXPIRE
 * of the log, then the descriptor's SET. */
typedef struct ferry_redis_write {
    size_t n;
    int argcs[5];
    const char **argvs[5];
    size_t *lengths[5];
    const char *del[2], *prune[4], *expire[3];
    const char **zadd;           /* malloc-ed */
    char (*scores)[24];          /* the records' revisions, malloc-ed */
    char *log;
    char newest[24], prune_below[24], head[64];
} ferry_redis_write_t;

/* Append a command (argv kept by reference: it must outlive the write). */
int ferry_redis_write_add(ferry_redis_write_t *w, int argc, const char **argv);
/* The change log's part of a write of batch under key: restart, records
 * and head, pruning, expiry of ttl ms.  0 when out of memory. */
int ferry_redis_write_changes(ferry_redis_write_t *w, const char *key, const char *ttl,
                              const ferry_md_records_batch_t *batch);
void ferry_redis_write_fini(ferry_redis_write_t *w);

#endif
