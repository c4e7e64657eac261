/* Handles, settings, plugins and status strings of the public API. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <stdlib.h>
#include <string.h>

TestSuite(api, .timeout = 60);

Test(api, status_strings)
{
    cr_assert_str_eq(ferry_status_string(FERRY_OK), "success");
    cr_assert_str_eq(ferry_status_string(FERRY_ERR_OVERLAP),
                     "range partially overlaps a registered range");
    cr_assert_not_null(ferry_status_string((ferry_status_t)-12345));
}

Test(api, stale_and_foreign_handles_are_errors)
{
    ferry_engine_h a, b;
    ferry_segment_h seg_a;
    ferry_batch_h batch;
    cr_assert_eq(ferry_engine_create(NULL, &a), FERRY_OK);
    cr_assert_eq(ferry_engine_create(NULL, &b), FERRY_OK);
    cr_assert_eq(ferry_segment_open(a, ferry_engine_segment_name(a), &seg_a), FERRY_OK);
    /* a's segment handle used with b */
    cr_assert_eq(ferry_segment_close(b, seg_a), FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_notify_send(b, seg_a, "x", 1), FERRY_ERR_INVALID_HANDLE);
    /* a batch of b with a's segment */
    cr_assert_eq(ferry_batch_create(b, 4, &batch), FERRY_OK);
    char buf[8];
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = buf, .target = seg_a,
                           .target_offset = 0, .length = 8};
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_ERR_INVALID_HANDLE, "freed batch");
    cr_assert_eq(ferry_batch_wait(batch, 0), FERRY_ERR_INVALID_HANDLE);
    /* Its slot given to a new batch (handles reuse freed slots, the newest
     * first): the old handle differs only in its generation, and names
     * nothing still. */
    ferry_batch_h reused;
    cr_assert_eq(ferry_batch_create(b, 4, &reused), FERRY_OK);
    cr_assert_eq((uint32_t)(uintptr_t)reused, (uint32_t)(uintptr_t)batch, "slot not reused");
    cr_assert_eq(ferry_batch_wait(batch, 0), FERRY_ERR_INVALID_HANDLE, "a reused slot");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_ERR_INVALID_HANDLE, "a reused slot");
    cr_assert_eq(ferry_batch_destroy(reused), FERRY_OK, "the new batch is still there");
    /* made-up handles */
    cr_assert_eq(ferry_batch_submit((ferry_batch_h)(uintptr_t)0xdeadbeefcafeull, &req, 1),
                 FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_register((ferry_engine_h)(uintptr_t)12345, buf, 8, "cpu", 0),
                 FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_register(NULL, buf, 8, "cpu", 0), FERRY_ERR_INVALID_HANDLE);
    /* the kind is checked too: a segment handle is no engine */
    cr_assert_eq(ferry_register((ferry_engine_h)seg_a, buf, 8, "cpu", 0),
                 FERRY_ERR_INVALID_HANDLE);
    cr_assert_eq(ferry_segment_close(a, seg_a), FERRY_OK);
    cr_assert_eq(ferry_segment_close(a, seg_a), FERRY_ERR_INVALID_HANDLE, "closed segment");
    ferry_engine_destroy(a);
    cr_assert_eq(ferry_register(a, buf, 8, "cpu", 0), FERRY_ERR_INVALID_HANDLE,
                 "destroyed engine");
    ferry_engine_destroy(a); /* harmless */
    ferry_engine_destroy(b);
}

Test(api, batch_limits_and_busy_destroy)
{
    ferry_engine_h engine;
    ferry_segment_h self;
    ferry_batch_h batch;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(ferry_batch_create(engine, 0, &batch), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_batch_create(engine, 2, &batch), FERRY_OK);
    static char buf[4096];
    cr_assert_eq(ferry_register(engine, buf, sizeof(buf), "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    ferry_request_t reqs[3];
    for (int i = 0; i < 3; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = buf, .target = self,
                                    .target_offset = (uint64_t)(uintptr_t)buf, .length = 10};
    cr_assert_eq(ferry_batch_submit(batch, reqs, 3), FERRY_ERR_TOO_MANY);
    reqs[1].opcode = (ferry_opcode_t)7;
    cr_assert_eq(ferry_batch_submit(batch, reqs, 2), FERRY_ERR_INVALID_PARAM);
    reqs[1].opcode = FERRY_OP_READ;
    reqs[1].length = 0;
    cr_assert_eq(ferry_batch_submit(batch, reqs, 2), FERRY_ERR_INVALID_PARAM);
    ferry_xfer_status_t xs;
    cr_assert_eq(ferry_batch_status(batch, 0, &xs), FERRY_ERR_INVALID_PARAM,
                 "nothing was queued");
    reqs[1].length = 10;
    cr_assert_eq(ferry_batch_submit(batch, reqs, 2), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 1000), FERRY_OK);
    cr_assert_eq(ferry_batch_status(batch, 1, &xs), FERRY_OK);
    cr_assert_eq(xs.state, FERRY_XFER_COMPLETED);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    ferry_segment_close(engine, self);
    ferry_engine_destroy(engine);
}

Test(api, missing_plugins_are_named_errors)
{
    ferry_engine_h engine;
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_TRANSPORTS, .transports = "rdmax"};
    cr_assert_eq(ferry_engine_create(&config, &engine), FERRY_ERR_PLUGIN_NOT_FOUND);
    config = (ferry_config_t){.field_mask = FERRY_CONFIG_FIELD_METADATA,
                              .metadata = "nosuchstore://127.0.0.1:1"};
    cr_assert_eq(ferry_engine_create(&config, &engine), FERRY_ERR_PLUGIN_NOT_FOUND);
    config = (ferry_config_t){.field_mask = FERRY_CONFIG_FIELD_TRANSPORTS,
                              .transports = "^tcp,shm,ucx,file"};
    cr_assert_neq(ferry_engine_create(&config, &engine), FERRY_OK, "no transport left");
}

Test(api, config_fields_and_variables)
{
    ferry_engine_h engine;
    setenv("FERRY_SEGMENT_NAME", "from-variable", 1);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_str_eq(ferry_engine_segment_name(engine), "from-variable");
    ferry_engine_destroy(engine);
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_NAME, .name = "from-config"};
    cr_assert_eq(ferry_engine_create(&config, &engine), FERRY_OK);
    cr_assert_str_eq(ferry_engine_segment_name(engine), "from-config", "the field wins");
    ferry_engine_destroy(engine);
    unsetenv("FERRY_SEGMENT_NAME");
    setenv("FERRY_TCP_SLICE_SIZE", "lots", 1);
    cr_assert_neq(ferry_engine_create(NULL, &engine), FERRY_OK, "a bad value is an error");
    unsetenv("FERRY_TCP_SLICE_SIZE");
    setenv("FERRY_RPC_ADDRESS", "127.0.0.1:notaport", 1);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_ERR_INVALID_PARAM);
    unsetenv("FERRY_RPC_ADDRESS");
    setenv("FERRY_COPY_THREADS", "many", 1);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_ERR_INVALID_PARAM);
    setenv("FERRY_COPY_THREADS", "2", 1);
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    ferry_engine_destroy(engine);
}

Test(api, chosen_name_resolves_through_p2p)
{
    ferry_engine_h owner, user;
    ferry_segment_h seg;
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_NAME, .name = "kv-cache-0"};
    cr_assert_eq(ferry_engine_create(&config, &owner), FERRY_OK);
    cr_assert_eq(ferry_engine_create(NULL, &user), FERRY_OK);
    char *json;
    /* the owner's RPC address, from its own descriptor */
    cr_assert_eq(ferry_segment_open(owner, "kv-cache-0", &seg), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(owner, seg, &json), FERRY_OK);
    const char *rpc = strstr(json, "\"rpc\":\"") + 7;
    char name[128];
    snprintf(name, sizeof(name), "kv-cache-0@%.*s", (int)strcspn(rpc, "\""), rpc);
    char wrong[128];
    snprintf(wrong, sizeof(wrong), "kv-cache-1@%.*s", (int)strcspn(rpc, "\""), rpc);
    free(json);
    ferry_segment_close(owner, seg);
    cr_assert_eq(ferry_segment_open(user, name, &seg), FERRY_OK);
    cr_assert_eq(ferry_segment_close(user, seg), FERRY_OK);
    cr_assert_eq(ferry_segment_open(user, wrong, &seg), FERRY_ERR_SEGMENT_NOT_FOUND);
    ferry_engine_destroy(user);
    ferry_engine_destroy(owner);
}

/* ferry_alloc memory: registered at once, reachable through the engine's own
 * segment, released only by ferry_free; misuse gets a clear status. */
static void check_alloc_and_free(const char *transports)
{
    setenv("FERRY_TRANSPORTS", transports, 1);
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    unsigned char *mem = NULL;
    cr_assert_eq(ferry_alloc(engine, 0, "cpu", 0, (void **)&mem), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_alloc(engine, 4096, "cpu", 0, NULL), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_alloc(engine, 4096, "nowhere:3", 0, (void **)&mem),
                 FERRY_ERR_UNSUPPORTED, "no transport allocates at an unknown location");
    cr_assert_eq(ferry_alloc(engine, (1u << 20) + 5, NULL, 0, (void **)&mem), FERRY_OK);
    cr_assert_not_null(mem);
    memset(mem, 0x5a, (1u << 20) + 5);

    /* The buffer is published: a write through our own segment lands in it. */
    ferry_segment_h self;
    ferry_batch_h batch;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    char text[] = "allocated";
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = text, .target = self,
                           .target_offset = (uint64_t)(uintptr_t)(mem + 100),
                           .length = sizeof(text)};
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 5000), FERRY_OK);
    cr_assert_str_eq((char *)mem + 100, "allocated");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);

    cr_assert_eq(ferry_unregister(engine, mem), FERRY_ERR_INVALID_PARAM,
                 "the last registration of ferry_alloc memory goes with ferry_free");
    cr_assert_eq(ferry_register(engine, mem, (1u << 20) + 5, "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_free(engine, mem), FERRY_ERR_BUSY, "registered again on top");
    cr_assert_eq(ferry_unregister(engine, mem), FERRY_OK);
    char plain[64];
    cr_assert_eq(ferry_register(engine, plain, sizeof(plain), "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_free(engine, plain), FERRY_ERR_INVALID_PARAM, "not from ferry_alloc");
    cr_assert_eq(ferry_unregister(engine, plain), FERRY_OK);
    cr_assert_eq(ferry_free(engine, mem + 1), FERRY_ERR_NOT_REGISTERED);
    cr_assert_eq(ferry_free(engine, mem), FERRY_OK);
    cr_assert_eq(ferry_free(engine, mem), FERRY_ERR_NOT_REGISTERED, "freed twice");
    cr_assert_eq(ferry_free((ferry_engine_h)(uintptr_t)12345, mem), FERRY_ERR_INVALID_HANDLE);

    /* What is left at destroy is freed with the engine (ASan sees leaks). */
    cr_assert_eq(ferry_alloc(engine, 8192, "cpu", FERRY_REG_REMOTE_READ, (void **)&mem),
                 FERRY_OK);
    ferry_segment_close(engine, self);
    ferry_engine_destroy(engine);
    unsetenv("FERRY_TRANSPORTS");
}

Test(api, alloc_and_free_from_the_heap)
{
    check_alloc_and_free("tcp");
}

Test(api, alloc_and_free_from_every_transport_found)
{
    /* With the ucx module built, ucx provides the memory (ucp_mem_map). */
    check_alloc_and_free("");
}
