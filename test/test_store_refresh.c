/*
 * Incremental refresh through the shared stores (etcd, redis), against real
 * servers (service_process.c): a reader that refreshes through the store's
 * change records ends with exactly the descriptor a fresh open gets (the
 * store's checkpoint and the records after it) and its owner holds; a
 * record missing is filled by the owner's RPC, a forged one is refused by
 * the owner's confirmation, never a wrong descriptor used; plugins without
 * the new operations (older ones) keep working, whole.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service_process.h"
#include "test_held.h"
#include "test_rng.h"
#include "../src/core/core.h"

#define PAGE 4096
#define SLOTS 300

static void setup(void)
{
    setenv("FERRY_TRANSPORTS", "tcp", 1);
    /* No test here stops a server: a long bound only keeps a loaded
     * machine's slow answer (etcd took over 1 s in a loaded distcheck)
     * from failing a test about change records. */
    setenv("FERRY_ETCD_TIMEOUT", "15000ms", 1);
    setenv("FERRY_REDIS_TIMEOUT", "15000ms", 1);
}

TestSuite(store_refresh, .init = setup, .fini = service_cleanup_all, .timeout = 120);

static void start(service_t *svc, service_kind_t kind)
{
    const char *missing = service_missing(kind);
    if (missing != NULL)
        cr_skip_test("%s", missing);
    cr_assert_eq(service_start(svc, kind, NULL), 0);
}

static ferry_engine_h engine_on(const char *uri, const char *name)
{
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_METADATA |
                                           FERRY_CONFIG_FIELD_TRANSPORTS,
                             .metadata = uri, .transports = "tcp"};
    if (name != NULL) {
        config.field_mask |= FERRY_CONFIG_FIELD_NAME;
        config.name = name;
    }
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(&config, &engine), FERRY_OK);
    return engine;
}

/* The engine as a plugin without publish_changes / fetch_changes sees it:
 * its ops table as an older plugin's, shorter by the new members. */
static void as_older_plugin(ferry_engine_h handle)
{
    static ferry_metadata_ops_t older[4];
    static int used;
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    cr_assert_lt(used, 4);
    older[used] = *engine->metadata;
    older[used].size = offsetof(ferry_metadata_ops_t, publish_changes);
    engine->metadata = &older[used++];
}

/* What an engine that opens the segment now gets: the store's whole
 * descriptor (a checkpoint) and the change records after it. */
static ferry_descriptor_t *fetched_whole(const char *uri, const char *name)
{
    ferry_engine_h fresh = engine_on(uri, NULL);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(fresh, name, &segment), FERRY_OK);
    ferry_descriptor_t *desc = held(fresh, segment);
    ferry_segment_close(fresh, segment);
    ferry_engine_destroy(fresh);
    return desc;
}

/* Whether the reader's copy equals what a fresh open gets and what the
 * owner holds; returns whether it was made by applying changes (its pool
 * leans on the one before; a whole fetch has none to lean on). */
static int expect_in_step(ferry_engine_h owner, ferry_engine_h reader, ferry_segment_h segment,
                          const char *uri, const char *name)
{
    ferry_descriptor_t *owners, *readers = held(reader, segment);
    ferry_descriptor_t *whole = fetched_whole(uri, name);
    cr_assert_eq(ferry_engine_local_descriptor(ferry_engine_lookup(owner), &owners, NULL),
                 FERRY_OK);
    cr_assert(ferry_descriptor_same(whole, readers), "%zu buffers opened, %zu held",
              whole->n_buffers, readers->n_buffers);
    cr_assert(ferry_descriptor_same(owners, readers));
    cr_assert_eq(readers->revision, owners->revision);
    cr_assert_eq(whole->revision, owners->revision);
    int applied = ferry_desc_pool_depth(readers->pool) > 0;
    ferry_descriptor_unref(whole);
    ferry_descriptor_unref(owners);
    ferry_descriptor_unref(readers);
    return applied;
}

static int expect_same_as_owner(ferry_engine_h owner, ferry_engine_h reader,
                                ferry_segment_h segment)
{
    ferry_descriptor_t *owners, *readers = held(reader, segment);
    cr_assert_eq(ferry_engine_local_descriptor(ferry_engine_lookup(owner), &owners, NULL),
                 FERRY_OK);
    cr_assert(ferry_descriptor_same(owners, readers));
    cr_assert_eq(readers->revision, owners->revision);
    int applied = ferry_desc_pool_depth(readers->pool) > 0;
    ferry_descriptor_unref(owners);
    ferry_descriptor_unref(readers);
    return applied;
}

typedef struct world {
    unsigned char *arena;
    int used[SLOTS];
    uint64_t rng;
} world_t;

static void world_init(world_t *w, ferry_engine_h owner)
{
    cr_assert_eq(posix_memalign((void **)&w->arena, PAGE, SLOTS * PAGE), 0);
    memset(w->used, 0, sizeof(w->used));
    w->rng = 0x5eed5eed12345678ull;
    for (size_t s = 0; s < SLOTS; s += 3) {
        cr_assert_eq(ferry_register(owner, w->arena + s * PAGE, PAGE, "cpu",
                                    s % 2 ? FERRY_REG_REMOTE_READ : FERRY_REG_REMOTE), FERRY_OK);
        w->used[s] = 1;
    }
}

/* A few registrations and removals, published at once or one by one. */
static void change_some(world_t *w, ferry_engine_h owner, int round)
{
    int deferred = round % 3 == 1;
    for (int k = 0, n = 1 + (int)(test_rng_next(&w->rng) % 5); k < n; k++) {
        size_t s = test_rng_next(&w->rng) % SLOTS;
        if (w->used[s])
            cr_assert_eq(ferry_unregister(owner, w->arena + s * PAGE), FERRY_OK);
        else
            cr_assert_eq(ferry_register(owner, w->arena + s * PAGE,
                                        (1 + test_rng_next(&w->rng) % 4) * 512, "cpu",
                                        FERRY_REG_REMOTE |
                                            (deferred ? FERRY_REG_DEFER_PUBLISH : 0)),
                         FERRY_OK);
        w->used[s] = !w->used[s];
    }
    if (deferred)
        cr_assert_eq(ferry_publish(owner), FERRY_OK);
}

/* Random changes, the reader refreshing after most of them (it misses a
 * few publishes now and then); returns how many refreshes were applied
 * changes. */
static size_t random_refreshes(const char *uri, int owner_older, int reader_older)
{
    ferry_engine_h owner = engine_on(uri, "owner"), reader = engine_on(uri, "reader");
    if (owner_older)
        as_older_plugin(owner);
    if (reader_older)
        as_older_plugin(reader);
    world_t w;
    world_init(&w, owner);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(reader, "owner", &segment), FERRY_OK);
    expect_in_step(owner, reader, segment, uri, "owner");
    size_t applied = 0;
    /* past the owner's checkpoint interval (128 records) twice */
    for (int round = 0; round < 300; round++) {
        change_some(&w, owner, round);
        if (round % 4 == 3)
            continue;
        cr_assert_eq(ferry_segment_refresh(reader, "owner"), FERRY_OK);
        applied += round % 10 == 0 ? expect_in_step(owner, reader, segment, uri, "owner")
                                   : expect_same_as_owner(owner, reader, segment);
    }
    ferry_segment_close(reader, segment);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    free(w.arena);
    return applied;
}

Test(store_refresh, redis_refresh_by_records_equals_a_whole_fetch)
{
    service_t redis;
    start(&redis, SERVICE_REDIS);
    size_t applied = random_refreshes(redis.uri, 0, 0);
    cr_expect_gt(applied, 150, "refreshes came as change records: %zu", applied);
    service_cleanup(&redis);
}

Test(store_refresh, etcd_refresh_by_records_equals_a_whole_fetch)
{
    service_t etcd;
    start(&etcd, SERVICE_ETCD);
    size_t applied = random_refreshes(etcd.uri, 0, 0);
    cr_expect_gt(applied, 150, "refreshes came as change records: %zu", applied);
    service_cleanup(&etcd);
}

/* A store plugin without the operations (a third party's, an older one)
 * publishes whole on every change, and readers fetch whole: with the same
 * plugin on both sides, or a reader of this version. */
Test(store_refresh, older_plugins_fetch_whole)
{
    service_t redis;
    start(&redis, SERVICE_REDIS);
    cr_expect_eq(random_refreshes(redis.uri, 1, 1), 0, "both without records");
    cr_expect_eq(random_refreshes(redis.uri, 1, 0), 0, "an owner without records");
    service_cleanup(&redis);
}

/* ---- a record missing, or forged ---- */

static uint64_t revision_of(ferry_engine_h owner)
{
    ferry_descriptor_t *desc;
    cr_assert_eq(ferry_engine_local_descriptor(ferry_engine_lookup(owner), &desc, NULL),
                 FERRY_OK);
    uint64_t revision = desc->revision;
    ferry_descriptor_unref(desc);
    return revision;
}

/* (The head goes too when revision is the newest.) */
static void redis_drop_record(service_t *redis, uint64_t revision)
{
    char score[32];
    snprintf(score, sizeof(score), "%" PRIu64, revision);
    const char *argv[] = {"ZREMRANGEBYSCORE", "ferry/segments/owner/changes/log", score, score};
    cr_assert_eq(redis_call(redis->port, 4, argv, NULL, NULL, 0, NULL), ':');
}

static void etcd_drop_record(service_t *etcd, uint64_t revision)
{
    char key[128], key64[256], json[512], out[1024];
    snprintf(key, sizeof(key), "ferry/segments/owner/changes/%016" PRIx64, revision);
    base64_encode(key, strlen(key), key64);
    snprintf(json, sizeof(json), "{\"key\":\"%s\"}", key64);
    cr_assert_eq(http_call(etcd->port, "POST", "/v3/kv/deleterange",
                           "Content-Type: application/json\r\n", json, strlen(json), out,
                           sizeof(out), NULL), 200);
    cr_assert_not_null(strstr(out, "\"deleted\":\"1\""), "%s", out);
}

static void missing_record_fetches_whole(service_t *svc)
{
    const char *uri = svc->uri;
    ferry_engine_h owner = engine_on(svc->uri, "owner"), reader = engine_on(svc->uri, "reader");
    world_t w;
    world_init(&w, owner);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(reader, "owner", &segment), FERRY_OK);
    for (int round = 0; round < 3; round++)
        change_some(&w, owner, 0);
    uint64_t newest = revision_of(owner);
    /* the middle one of the three */
    if (svc->kind == SERVICE_REDIS)
        redis_drop_record(svc, newest - 1);
    else
        etcd_drop_record(svc, newest - 1);
    cr_assert_eq(ferry_segment_refresh(reader, "owner"), FERRY_OK);
    expect_in_step(owner, reader, segment, uri, "owner");
    ferry_descriptor_t *desc = held(reader, segment);
    cr_assert_eq(atomic_load(&desc->confirmed), FERRY_DESC_CONFIRMED, "the owner filled the gap");
    ferry_descriptor_unref(desc);
    /* and from there on, records again */
    change_some(&w, owner, 0);
    cr_assert_eq(ferry_segment_refresh(reader, "owner"), FERRY_OK);
    cr_assert(expect_in_step(owner, reader, segment, uri, "owner"), "applied");
    ferry_segment_close(reader, segment);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    free(w.arena);
}

Test(store_refresh, redis_missing_record_falls_back_to_the_whole_descriptor)
{
    service_t redis;
    start(&redis, SERVICE_REDIS);
    missing_record_fetches_whole(&redis);
    service_cleanup(&redis);
}

Test(store_refresh, etcd_missing_record_falls_back_to_the_whole_descriptor)
{
    service_t etcd;
    start(&etcd, SERVICE_ETCD);
    missing_record_fetches_whole(&etcd);
    service_cleanup(&etcd);
}

/* A record that adds a buffer the owner never registered. */
static char *forged_record(const ferry_descriptor_t *base, uint64_t revision)
{
    static char *no_keys[FERRY_MAX_TRANSPORTS];
    ferry_desc_buffer_t forged = {.addr = 0x1000, .length = PAGE, .location = "cpu",
                                  .access = FERRY_REG_REMOTE, .keys = no_keys};
    ferry_desc_step_t step = {.revision = revision, .n_added = 1, .added = &forged};
    ferry_desc_changes_t changes = {.generation = base->generation, .from = revision - 1,
                                    .n_transports = base->n_transports, .n_steps = 1,
                                    .steps = &step};
    char *text;
    cr_assert_eq(ferry_desc_changes_encode(&changes, revision - 1, &text, NULL), FERRY_OK);
    return text;
}

/* The owner confirms a descriptor made from records by its changes since
 * the confirmed one before, and refuses one made from a forged record. */
Test(store_refresh, confirmation_by_changes_refuses_a_forged_record)
{
    service_t redis;
    start(&redis, SERVICE_REDIS);
    const char *uri = redis.uri;
    ferry_engine_h owner = engine_on(uri, "owner"), reader = engine_on(uri, "reader");
    ferry_engine_t *engine = ferry_engine_lookup(reader);
    world_t w;
    world_init(&w, owner);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(reader, "owner", &segment), FERRY_OK);
    ferry_descriptor_t *first = held(reader, segment);
    cr_assert(ferry_engine_descriptor_confirmed(engine, first), "confirmed whole");

    change_some(&w, owner, 0);
    cr_assert_eq(ferry_segment_refresh(reader, "owner"), FERRY_OK);
    cr_assert(expect_in_step(owner, reader, segment, uri, "owner"));
    ferry_descriptor_t *second = held(reader, segment);
    cr_assert_eq(second->confirm_base, first, "made from the confirmed one");
    cr_assert(ferry_engine_descriptor_confirmed(engine, second), "confirmed by changes");
    cr_assert_null(second->confirm_base, "used once");

    /* the owner publishes one more change; the store's record of it is
     * replaced by one that adds a buffer */
    change_some(&w, owner, 0);
    uint64_t newest = revision_of(owner);
    char *forged = forged_record(second, newest), score[32], head[64];
    snprintf(score, sizeof(score), "%" PRIu64, newest);
    snprintf(head, sizeof(head), "head:%" PRIx64, second->generation);
    redis_drop_record(&redis, newest); /* and the head, at the same score */
    const char *zadd[] = {"ZADD", "ferry/segments/owner/changes/log", score, forged, score,
                          head};
    cr_assert_eq(redis_call(redis.port, 6, zadd, NULL, NULL, 0, NULL), ':');
    cr_assert_eq(ferry_segment_refresh(reader, "owner"), FERRY_OK);
    ferry_descriptor_t *third = held(reader, segment);
    cr_assert_not_null(ferry_descriptor_find(third, 0x1000, 1), "the forged record applied");
    cr_assert_not(ferry_engine_descriptor_confirmed(engine, third), "and was refused");

    free(forged);
    ferry_descriptor_unref(third);
    ferry_descriptor_unref(second);
    ferry_descriptor_unref(first);
    ferry_segment_close(reader, segment);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    free(w.arena);
    service_cleanup(&redis);
}
