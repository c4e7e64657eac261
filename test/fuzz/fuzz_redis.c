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

    /* a change log's reply (redis.c): records handed over only with FERRY_OK */
    char *records[4];
    size_t count = 99;
    uint64_t generation, newest;
    status = ferry_redis_changes(reply, 1, &generation, &newest, records, 4, &count, why,
                                 sizeof(why));
    FUZZ_CHECK(count <= 4 && (status == FERRY_OK || count == 0));
    FUZZ_CHECK(strnlen(why, sizeof(why)) < sizeof(why));
    for (size_t i = 0; i < count; i++)
        free(records[i]);

    if (reply->type == REDIS_REPLY_ARRAY && depth < 8)
        for (size_t i = 0; i < reply->elements; i++)
            check_reply(reply->element[i], depth + 1);
}

/*
 * hiredis 0.14 allocates an array's table of elements as soon as it reads
 * the count (up to INT_MAX entries), before any element arrives: up to
 * 16 GiB of address space that is never touched (overcommitted, or a clean
 * out-of-memory error), which libFuzzer's malloc limit reports as a crash.
 * No command of the store gets an array back, so the harness bounds arrays,
 * through hiredis's own hook, rather than the store.
 */
#define FUZZ_MAX_ELEMENTS 4096

static redisReplyObjectFunctions bounded;
static void *(*create_array)(const redisReadTask *task, int elements);

static void *create_bounded_array(const redisReadTask *task, int elements)
{
    return elements > FUZZ_MAX_ELEMENTS ? NULL : create_array(task, elements);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    redisReader *reader = redisReaderCreate();
    FUZZ_CHECK(reader != NULL);
    if (create_array == NULL) {
        bounded = *reader->fn;
        create_array = bounded.createArray;
        bounded.createArray = create_bounded_array;
    }
    reader->fn = &bounded;
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
