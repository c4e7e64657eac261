/* What the redis store makes of redis's replies (see redis.h). */
#include "redis.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ferry_redis_reply_ok(const redisReply *reply, char *why, size_t whylen)
{
    if (reply == NULL)
        return 0;
    if (reply->type == REDIS_REPLY_STATUS && strcmp(reply->str, "OK") == 0)
        return 1;
    snprintf(why, whylen, "%s", reply->type == REDIS_REPLY_ERROR ? reply->str :
             "unexpected reply");
    return 0;
}

ferry_status_t ferry_redis_value(const redisReply *reply, char **value_p, char *why,
                                 size_t whylen)
{
    if (reply->type == REDIS_REPLY_STRING) {
        /* A value with a NUL inside is cut there: the decoder refuses it. */
        *value_p = malloc(reply->len + 1);
        if (*value_p == NULL)
            return FERRY_ERR_NO_MEMORY;
        memcpy(*value_p, reply->str, reply->len);
        (*value_p)[reply->len] = '\0';
        return FERRY_OK;
    }
    if (reply->type == REDIS_REPLY_NIL)
        return FERRY_ERR_SEGMENT_NOT_FOUND;
    snprintf(why, whylen, "%s", reply->type == REDIS_REPLY_ERROR ? reply->str :
             "not a string value");
    return reply->type == REDIS_REPLY_ERROR ? FERRY_ERR_METADATA : FERRY_ERR_DECODE;
}

int ferry_redis_renewed(const redisReply *reply)
{
    return reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
}
