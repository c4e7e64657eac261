/* What the redis store makes of redis's replies (see redis.h). */
#include "redis.h"

#include <inttypes.h>
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

/* A whole unsigned number in hex (base 16) or decimal (a score), all of
 * the string. */
static int parse_u64(const char *text, size_t length, int base, uint64_t *value_p)
{
    char copy[32], *end;
    if (length == 0 || length >= sizeof(copy) || text[0] == '-' || text[0] == '+' ||
        text[0] == ' ')
        return 0;
    memcpy(copy, text, length);
    copy[length] = '\0';
    unsigned long long value = strtoull(copy, &end, base);
    if (*end != '\0')
        return 0;
    *value_p = value;
    return 1;
}

ferry_status_t ferry_redis_changes(const redisReply *reply, uint64_t since,
                                   uint64_t *generation_p, uint64_t *newest_p, char **records,
                                   size_t max, size_t *count_p, char *why, size_t whylen)
{
    *count_p = 0;
    if (reply->type == REDIS_REPLY_ERROR) {
        snprintf(why, whylen, "%s", reply->str);
        return FERRY_ERR_METADATA;
    }
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements % 2 != 0) {
        snprintf(why, whylen, "the change log is not a sorted set");
        return FERRY_ERR_DECODE;
    }
    size_t head = strlen(FERRY_REDIS_HEAD);
    int have_head = 0;
    ferry_status_t status = FERRY_ERR_DECODE;
    for (size_t i = 0; i < reply->elements; i += 2) {
        const redisReply *member = reply->element[i], *score = reply->element[i + 1];
        uint64_t revision;
        if (member->type != REDIS_REPLY_STRING || score->type != REDIS_REPLY_STRING ||
            !parse_u64(score->str, score->len, 10, &revision)) {
            snprintf(why, whylen, "the change log holds a member of another kind");
            goto err_free;
        }
        if (member->len > head && memcmp(member->str, FERRY_REDIS_HEAD, head) == 0) {
            have_head = parse_u64(member->str + head, member->len - head, 16, generation_p);
            *newest_p = revision;
            if (!have_head) {
                snprintf(why, whylen, "the change log's head names no generation");
                goto err_free;
            }
        } else if (revision > since && *count_p < max) {
            char *text = malloc(member->len + 1);
            if (text == NULL) {
                status = FERRY_ERR_NO_MEMORY;
                goto err_free;
            }
            memcpy(text, member->str, member->len);
            text[member->len] = '\0';
            records[(*count_p)++] = text;
        }
    }
    if (have_head)
        return FERRY_OK;
    status = FERRY_ERR_SEGMENT_NOT_FOUND; /* records without a head tell nothing */

err_free:
    for (size_t i = 0; i < *count_p; i++)
        free(records[i]);
    *count_p = 0;
    return status;
}
