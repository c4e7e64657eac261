/*
 * The redis store's reading of redis's replies.  hiredis parses the protocol
 * (its reader, fed the input as if it came from the server); every reply it
 * builds, nested ones included, goes through what src/metadata/redis does
 * with a reply: the "OK" check of AUTH, SELECT and SET, a GET's value, a
 * PEXPIRE's answer.
 *
 * Checked: a GET value is the reply's bytes, terminated; the reason given
 * for a refusal stays terminated; the store's readers never touch a field
 * the reply's type does not have.
 */
#include "fuzz_common.h"

#include "../../src/metadata/redis/redis.h"

#include <string.h>

static void check_reply(const redisReply *reply, int depth)
{
    char why[256] = "";
    int ok = ferry_redis_reply_ok(reply, why, sizeof(why));
    FUZZ_CHECK(!ok || reply->type == REDIS_REPLY_STATUS);
    FUZZ_CHECK(strnlen(why, sizeof(why)) < sizeof(why));

    char *value = NULL;
    ferry_status_t status = ferry_redis_value(reply, &value, why, sizeof(why));
    if (status == FERRY_OK) {
        FUZZ_CHECK(reply->type == REDIS_REPLY_STRING);
        FUZZ_CHECK(memcmp(value, reply->str, reply->len) == 0 && value[reply->len] == '\0');
        free(value);
    } else {
        FUZZ_CHECK(status == FERRY_ERR_SEGMENT_NOT_FOUND || status == FERRY_ERR_METADATA ||
                   status == FERRY_ERR_DECODE);
        FUZZ_CHECK(strnlen(why, sizeof(why)) < sizeof(why));
    }
    (void)ferry_redis_renewed(reply);

    if (reply->type == REDIS_REPLY_ARRAY && depth < 8)
        for (size_t i = 0; i < reply->elements; i++)
            check_reply(reply->element[i], depth + 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    redisReader *reader = redisReaderCreate();
    FUZZ_CHECK(reader != NULL);
    if (redisReaderFeed(reader, (const char *)data, size) == REDIS_OK) {
        void *reply;
        while (redisReaderGetReply(reader, &reply) == REDIS_OK && reply != NULL) {
            check_reply(reply, 0);
            freeReplyObject(reply);
        }
    }
    redisReaderFree(reader);
    return 0;
}
