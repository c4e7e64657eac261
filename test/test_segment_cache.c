/* The segment cache against a slow p2p owner that counts its fetches. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "../src/rpc/rpc.h"

static atomic_int fetches;
static atomic_ullong generation = 0x1111;
static char owner_rpc[64];

/* A p2p owner: answers FETCH after 200 ms with a one-buffer descriptor. */
static ferry_status_t owner_handler(void *arg, int type, const void *payload, size_t length,
                                    int *reply_type_p, void **reply_p, size_t *reply_length_p)
{
    if (type != FERRY_RPC_FETCH)
        return FERRY_ERR_UNSUPPORTED;
    atomic_fetch_add(&fetches, 1);
    usleep(200000);
    char json[512];
    snprintf(json, sizeof(json),
             "{\"version\":1,\"name\":\"%s\",\"generation\":\"0x%llx\",\"host\":\"h\","
             "\"rpc\":\"%s\",\"transports\":{\"tcp\":\"127.0.0.1:1\"},\"buffers\":[{\"addr\":"
             "\"0x10000\",\"length\":\"4096\",\"location\":\"cpu\",\"access\":\"rw\","
             "\"keys\":{\"tcp\":\"\"}}],\"files\":[]}",
             owner_rpc, (unsigned long long)atomic_load(&generation), owner_rpc);
    *reply_type_p = FERRY_RPC_FETCH_REPLY;
    *reply_p = strdup(json);
    *reply_length_p = strlen(json);
    return FERRY_OK;
}

static ferry_rpc_server_t *owner;
static ferry_engine_h engine;

static void setup(void)
{
    int port;
    ferry_rpc_server_limits_t limits = {.max_frame = 1 << 20, .timeout_ms = 2000,
                                        .idle_timeout_ms = 20000, .max_conns = 256};
    cr_assert_eq(ferry_rpc_server_start("127.0.0.1", 0, &limits, owner_handler, NULL, &owner,
                                        &port), FERRY_OK);
    snprintf(owner_rpc, sizeof(owner_rpc), "127.0.0.1:%d", port);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
}

static void teardown(void)
{
    ferry_engine_destroy(engine);
    ferry_rpc_server_stop(owner);
}

TestSuite(segment_cache, .init = setup, .fini = teardown, .timeout = 60);

static void *open_it(void *arg)
{
    ferry_segment_h *seg = arg;
    cr_assert_eq(ferry_segment_open(engine, owner_rpc, seg), FERRY_OK);
    return NULL;
}

Test(segment_cache, concurrent_opens_share_one_fetch)
{
    enum { THREADS = 8 };
    pthread_t tids[THREADS];
    ferry_segment_h segs[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&tids[i], NULL, open_it, &segs[i]);
    for (int i = 0; i < THREADS; i++)
        pthread_join(tids[i], NULL);
    cr_assert_eq(atomic_load(&fetches), 1, "%d fetches for one name", atomic_load(&fetches));
    for (int i = 1; i < THREADS; i++)
        cr_assert_eq(segs[i], segs[0], "one handle per name");
    /* the handle stays valid until the last close */
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(ferry_segment_close(engine, segs[i]), FERRY_OK);
    cr_assert_eq(ferry_segment_close(engine, segs[0]), FERRY_ERR_INVALID_HANDLE);
}

Test(segment_cache, refresh_sees_a_new_generation)
{
    ferry_segment_h seg;
    char *json;
    cr_assert_eq(ferry_segment_open(engine, owner_rpc, &seg), FERRY_OK);
    atomic_store(&generation, 0x2222);
    cr_assert_eq(ferry_segment_describe(engine, seg, &json), FERRY_OK);
    cr_assert(strstr(json, "0x1111") != NULL, "cached until refreshed");
    free(json);
    cr_assert_eq(ferry_segment_refresh(engine, owner_rpc), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, seg, &json), FERRY_OK);
    cr_assert(strstr(json, "0x2222") != NULL, "%s", json);
    free(json);
    cr_assert_eq(ferry_segment_refresh(engine, NULL), FERRY_OK);
    cr_assert_eq(ferry_segment_refresh(engine, "not-open:1"), FERRY_ERR_SEGMENT_NOT_FOUND);
    cr_assert_eq(atomic_load(&fetches), 3);
    cr_assert_eq(ferry_segment_close(engine, seg), FERRY_OK);
}

Test(segment_cache, missing_range_refreshes_once_then_fails)
{
    ferry_segment_h seg;
    ferry_batch_h batch;
    char buf[16];
    cr_assert_eq(ferry_segment_open(engine, owner_rpc, &seg), FERRY_OK);
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = buf, .target = seg,
                           .target_offset = 0x20000, .length = sizeof(buf)};
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_ERR_OUT_OF_RANGE);
    cr_assert_eq(atomic_load(&fetches), 2, "open + one refresh");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(ferry_segment_close(engine, seg), FERRY_OK);
}
