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

#endif
