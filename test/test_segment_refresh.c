/*
 * Incremental refresh over p2p: a peer that holds a descriptor and refreshes
 * after its owner registered and unregistered buffers ends with exactly the
 * descriptor the owner serves whole, whether the owner sent the changes or
 * (its log too short) the whole descriptor.
 */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <stdlib.h>
#include <string.h>

#include "test_rng.h"
#include "../src/core/core.h"
#include "../src/rpc/rpc.h"

#define PAGE 4096

static ferry_engine_h make_engine(void)
{
    ferry_config_t config = {.field_mask = FERRY_CONFIG_FIELD_TRANSPORTS |
                                           FERRY_CONFIG_FIELD_METADATA,
                             .transports = "tcp", .metadata = "p2p"};
    ferry_engine_h engine;
    cr_assert_eq(ferry_engine_create(&config, &engine), FERRY_OK);
    return engine;
}

/* The descriptor the reader holds for its open segment. */
static ferry_descriptor_t *held(ferry_engine_h reader, ferry_segment_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(reader);
    ferry_segment_t *segment = ferry_handle_lookup((uint64_t)(uintptr_t)handle,
                                                   FERRY_HANDLE_SEGMENT, engine);
    cr_assert_not_null(segment);
    ferry_descriptor_t *desc;
    cr_assert_eq(ferry_segment_descriptor(engine, segment, &desc), FERRY_OK);
    return desc;
}

/* The reader's copy equals what the owner serves whole. */
static void expect_in_step(ferry_engine_h owner, ferry_engine_h reader, ferry_segment_h segment)
{
    ferry_descriptor_t *owners, *readers = held(reader, segment);
    cr_assert_eq(ferry_engine_local_descriptor(ferry_engine_lookup(owner), &owners, NULL),
                 FERRY_OK);
    cr_assert(ferry_descriptor_same(owners, readers), "%zu buffers at the owner, %zu held",
              owners->n_buffers, readers->n_buffers);
    cr_assert_eq(readers->revision, owners->revision);
    ferry_descriptor_unref(owners);
    ferry_descriptor_unref(readers);
}

static uint64_t rng_state = 0x1234567887654321ull;

static uint64_t rng(void)
{
    return test_rng_next(&rng_state);
}

Test(segment_refresh, changes_leave_the_peer_with_the_owners_descriptor, .timeout = 120)
{
    enum { SLOTS = 300 };
    static int used[SLOTS];
    unsigned char *arena;
    cr_assert_eq(posix_memalign((void **)&arena, PAGE, SLOTS * PAGE), 0);
    ferry_engine_h owner = make_engine(), reader = make_engine();
    for (size_t s = 0; s < SLOTS; s += 3) {
        cr_assert_eq(ferry_register(owner, arena + s * PAGE, PAGE, "cpu",
                                    s % 2 ? FERRY_REG_REMOTE_READ : FERRY_REG_REMOTE), FERRY_OK);
        used[s] = 1;
    }
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(reader, ferry_engine_segment_name(owner), &segment),
                 FERRY_OK);
    expect_in_step(owner, reader, segment);

    size_t incremental = 0;
    for (int round = 0; round < 60; round++) {
        /* some rounds publish several changes at once, some several times */
        int deferred = round % 3 == 1;
        for (int k = 0, n = 1 + (int)(rng() % 5); k < n; k++) {
            size_t s = rng() % SLOTS;
            if (used[s]) {
                cr_assert_eq(ferry_unregister(owner, arena + s * PAGE), FERRY_OK);
            } else {
                cr_assert_eq(ferry_register(owner, arena + s * PAGE, (1 + rng() % 4) * 512,
                                            "cpu", FERRY_REG_REMOTE |
                                                       (deferred ? FERRY_REG_DEFER_PUBLISH : 0)),
                             FERRY_OK);
            }
            used[s] = !used[s];
        }
        if (deferred)
            cr_assert_eq(ferry_publish(owner), FERRY_OK);
        if (round % 4 == 3)
            continue; /* the peer misses a few publishes now and then */
        cr_assert_eq(ferry_segment_refresh(reader, ferry_engine_segment_name(owner)), FERRY_OK);
        ferry_descriptor_t *after = held(reader, segment);
        /* changes applied: the new descriptor's pool leans on the old one's
         * (a whole fetch has none to lean on; every 32nd apply starts anew) */
        incremental += ferry_desc_pool_depth(after->pool) > 0;
        ferry_descriptor_unref(after);
        expect_in_step(owner, reader, segment);
    }
    cr_expect_gt(incremental, 30, "refreshes came as changes: %zu", incremental);

    ferry_segment_close(reader, segment);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    free(arena);
}

Test(segment_refresh, a_peer_behind_the_log_gets_the_whole_descriptor, .timeout = 120)
{
    /* more changes in one publish than the owner's log keeps (65,536) */
    enum { PAGES = 70000 };
    unsigned char *arena;
    cr_assert_eq(posix_memalign((void **)&arena, PAGE, (size_t)PAGES * PAGE), 0);
    ferry_engine_h owner = make_engine(), reader = make_engine();
    cr_assert_eq(ferry_register(owner, arena, PAGE, "cpu", FERRY_REG_REMOTE), FERRY_OK);
    ferry_segment_h segment;
    cr_assert_eq(ferry_segment_open(reader, ferry_engine_segment_name(owner), &segment),
                 FERRY_OK);
    ferry_region_t *regions = calloc(PAGES - 1, sizeof(*regions));
    for (size_t i = 1; i < PAGES; i++)
        regions[i - 1] = (ferry_region_t){.addr = arena + i * PAGE, .length = PAGE,
                                          .location = "cpu"};
    cr_assert_eq(ferry_register_batch(owner, regions, PAGES - 1, FERRY_REG_REMOTE), FERRY_OK);
    cr_assert_eq(ferry_segment_refresh(reader, ferry_engine_segment_name(owner)), FERRY_OK);
    expect_in_step(owner, reader, segment);
    ferry_descriptor_t *desc = held(reader, segment);
    cr_assert_eq(desc->n_buffers, PAGES);
    cr_assert_eq(ferry_desc_pool_depth(desc->pool), 0, "fetched whole, not applied");
    ferry_descriptor_unref(desc);

    /* and the log starts again from there */
    cr_assert_eq(ferry_unregister(owner, arena + PAGE), FERRY_OK);
    cr_assert_eq(ferry_segment_refresh(reader, ferry_engine_segment_name(owner)), FERRY_OK);
    expect_in_step(owner, reader, segment);
    desc = held(reader, segment);
    cr_assert_eq(ferry_desc_pool_depth(desc->pool), 1, "applied");
    ferry_descriptor_unref(desc);

    ferry_segment_close(reader, segment);
    ferry_engine_destroy(reader);
    ferry_engine_destroy(owner);
    free(regions);
    free(arena);
}

/* A FETCH with the optional fields, as an engine of this version sends it. */
static char *fetch_with(const char *rpc, const ferry_rpc_fetch_t *m, size_t *length_p)
{
    ferry_wire_writer_t out = {0};
    char *reply = NULL;
    cr_assert_eq(ferry_rpc_fetch_since_write(&out, m), FERRY_OK);
    cr_assert_eq(ferry_rpc_call(rpc, FERRY_RPC_FETCH, out.data, out.length, 2000, 1 << 20,
                                (void **)&reply, length_p), FERRY_OK);
    free(out.data);
    return reply;
}

/* What an older engine sends (no accept bits) gets JSON, all it reads; an
 * engine of this version gets the compact form, or the changes since. */
Test(segment_refresh, the_owner_answers_each_reader_in_its_form, .timeout = 60)
{
    unsigned char *page;
    cr_assert_eq(posix_memalign((void **)&page, PAGE, 2 * PAGE), 0);
    ferry_engine_h owner = make_engine();
    cr_assert_eq(ferry_register(owner, page, PAGE, "cpu", FERRY_REG_REMOTE), FERRY_OK);
    const char *rpc = ferry_engine_segment_name(owner);
    ferry_wire_writer_t old = {0};
    cr_assert_eq(ferry_rpc_fetch_write(&old, "", "127.0.0.1:1"), FERRY_OK);
    char *reply = NULL;
    size_t length = 0;
    cr_assert_eq(ferry_rpc_call(rpc, FERRY_RPC_FETCH, old.data, old.length, 2000, 1 << 20,
                                (void **)&reply, &length), FERRY_OK);
    cr_assert_eq(reply[0], '{', "%s", reply);
    free(reply);
    free(old.data);

    ferry_descriptor_t *desc;
    cr_assert_eq(ferry_engine_local_descriptor(ferry_engine_lookup(owner), &desc, NULL),
                 FERRY_OK);
    ferry_rpc_fetch_t m = {.from = "127.0.0.1:1", .accept = FERRY_RPC_ACCEPT_COMPACT};
    reply = fetch_with(rpc, &m, &length);
    cr_assert_eq(ferry_descriptor_text_form(reply, length), FERRY_DESC_FORM_COMPACT);
    free(reply);

    cr_assert_eq(ferry_register(owner, page + PAGE, PAGE, "cpu", FERRY_REG_REMOTE), FERRY_OK);
    m.accept |= FERRY_RPC_ACCEPT_CHANGES;
    m.generation = desc->generation;
    m.revision = desc->revision;
    reply = fetch_with(rpc, &m, &length);
    cr_assert(strncmp(reply, FERRY_DESC_CHANGES_MAGIC, strlen(FERRY_DESC_CHANGES_MAGIC)) == 0,
              "%s", reply);
    cr_assert_not_null(strstr(reply, "steps 1\n"), "%s", reply);
    free(reply);

    /* another generation: the whole descriptor */
    m.generation ^= 1;
    reply = fetch_with(rpc, &m, &length);
    cr_assert_eq(ferry_descriptor_text_form(reply, length), FERRY_DESC_FORM_COMPACT);
    free(reply);
    ferry_descriptor_unref(desc);
    ferry_engine_destroy(owner);
    free(page);
}
