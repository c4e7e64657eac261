/*
 * redis metadata store (redis.c: connections, commands, the expiry keeper).
 * What the store makes of redis's replies lives apart, in redis_reply.c, so
 * the fuzz harness (test/fuzz/fuzz_redis.c) can hand it every reply that
 * hiredis's reader builds from arbitrary bytes.
 */
#ifndef FERRY_METADATA_REDIS_H
#define FERRY_METADATA_REDIS_H

#include <ferry/plugin.h>

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

#endif
