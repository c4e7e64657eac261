/* Registration rules, through the public API of one engine. */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include "../src/core/core.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static ferry_engine_h engine;
static char *arena;
#define ARENA (1 << 20)

static void setup(void)
{
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    arena = malloc(ARENA);
}

static void teardown(void)
{
    ferry_engine_destroy(engine);
    free(arena);
}

TestSuite(registry, .init = setup, .fini = teardown, .timeout = 60);

/* How many buffers the published descriptor lists. */
static int published_buffers(void)
{
    ferry_segment_h self;
    char *json;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, self, &json), FERRY_OK);
    int count = 0;
    for (const char *p = json; (p = strstr(p, "\"addr\"")) != NULL; p++)
        count++;
    free(json);
    ferry_segment_close(engine, self);
    return count;
}

Test(registry, argument_errors)
{
    cr_assert_eq(ferry_register(engine, NULL, 10, "cpu", 0), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_register(engine, arena, 0, "cpu", 0), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_register(engine, (void *)(UINTPTR_MAX - 10), 100, "cpu", 0),
                 FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_unregister(engine, arena), FERRY_ERR_NOT_REGISTERED);
    cr_assert_eq(ferry_register_batch(engine, NULL, 1, 0), FERRY_ERR_INVALID_PARAM);
}

Test(registry, partial_overlap_is_refused_adjacent_is_fine)
{
    cr_assert_eq(ferry_register(engine, arena + 1000, 1000, "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_register(engine, arena + 500, 600, "cpu", 0), FERRY_ERR_OVERLAP);
    cr_assert_eq(ferry_register(engine, arena + 1999, 10, "cpu", 0), FERRY_ERR_OVERLAP);
    cr_assert_eq(ferry_register(engine, arena + 1100, 10, "cpu", 0), FERRY_ERR_OVERLAP);
    cr_assert_eq(ferry_register(engine, arena + 900, 2000, "cpu", 0), FERRY_ERR_OVERLAP);
    cr_assert_eq(ferry_register(engine, arena + 1000, 999, "cpu", 0), FERRY_ERR_OVERLAP);
    cr_assert_eq(ferry_register(engine, arena + 2000, 1000, "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_register(engine, arena, 1000, "cpu", 0), FERRY_OK);
    cr_assert_eq(published_buffers(), 3);
}

Test(registry, identical_range_takes_a_reference)
{
    cr_assert_eq(ferry_register(engine, arena, 4096, "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_register(engine, arena, 4096, "cpu", 0), FERRY_OK);
    cr_assert_eq(ferry_unregister(engine, arena), FERRY_OK);
    cr_assert_eq(published_buffers(), 1, "one reference is left");
    cr_assert_eq(ferry_unregister(engine, arena), FERRY_OK);
    cr_assert_eq(published_buffers(), 0);
    cr_assert_eq(ferry_unregister(engine, arena), FERRY_ERR_NOT_REGISTERED);
}

/* Peers are told what was registered: the identical range again with
 * other flags or another location would leave them believing the first. */
Test(registry, identical_range_with_other_flags_or_location_is_refused)
{
    cr_assert_eq(ferry_register(engine, arena, 4096, "cpu", FERRY_REG_REMOTE), FERRY_OK);
    cr_assert_eq(ferry_register(engine, arena, 4096, "cpu", FERRY_REG_REMOTE_READ),
                 FERRY_ERR_INVALID_PARAM, "read-write, then read-only");
    cr_assert_eq(ferry_register(engine, arena, 4096, "cpu:1", 0), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_register(engine, arena, 4096, NULL, 0), FERRY_OK, "NULL is cpu, 0 is rw");
    cr_assert_eq(ferry_unregister(engine, arena), FERRY_OK);
    cr_assert_eq(ferry_unregister(engine, arena), FERRY_OK);
    cr_assert_eq(published_buffers(), 0, "refused calls took no reference");
    /* Unregistered, it takes the new flags; the descriptor says so. */
    cr_assert_eq(ferry_register(engine, arena, 4096, "cpu", FERRY_REG_REMOTE_READ), FERRY_OK);
    ferry_segment_h self;
    char *json;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    cr_assert_eq(ferry_segment_describe(engine, self, &json), FERRY_OK);
    cr_assert_not_null(strstr(json, "\"access\":\"r\""), "%s", json);
    free(json);
    ferry_segment_close(engine, self);
}

/* A location the owner could not publish would break every peer's open. */
Test(registry, malformed_locations_are_refused)
{
    static char huge[70000];
    memset(huge, 'a', sizeof(huge) - 1);
    const char *bad[] = {"\xff\xfe", "cpu\xc3", huge, "CPU", "cpu:", ":0", "cuda:0:1", "cpu 0",
                         "cpu\n", "1cpu"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_assert_eq(ferry_register(engine, arena, 4096, bad[i], 0), FERRY_ERR_INVALID_PARAM,
                     "location %zu", i);
        void *mem = NULL;
        cr_assert_eq(ferry_alloc(engine, 4096, bad[i], 0, &mem), FERRY_ERR_INVALID_PARAM,
                     "alloc location %zu", i);
    }
    const char *good[] = {"cpu", "cpu:1", "numa:3", "cxl", "", "cpu:GPU-5f2a.1_b"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        cr_assert_eq(ferry_register(engine, arena + 8192 * i, 4096, good[i], 0), FERRY_OK,
                     "location %s", good[i]);
    }
    cr_assert_eq(published_buffers(), (int)(sizeof(good) / sizeof(good[0])),
                 "the descriptor encodes and decodes");
}

/* Host memory is not device memory, whether or not a module for the
 * device kind is there: never published as such. */
Test(registry, host_memory_at_a_device_location_is_refused)
{
    const char *device[] = {"cuda:0", "hip:0", "rocm:3", "cuda:GPU-5f2a.1_b"};
    for (size_t i = 0; i < sizeof(device) / sizeof(device[0]); i++) {
        ferry_status_t status = ferry_register(engine, arena, 4096, device[i], 0);
        cr_assert(status == FERRY_ERR_INVALID_PARAM || status == FERRY_ERR_UNSUPPORTED,
                  "%s: %s", device[i], ferry_status_string(status));
    }
    cr_assert_eq(published_buffers(), 0);
}

Test(registry, batch_is_all_or_nothing)
{
    cr_assert_eq(ferry_register(engine, arena + 50000, 100, "cpu", 0), FERRY_OK);
    ferry_region_t regions[] = {
        {arena, 1000, "cpu"},
        {arena + 1000, 1000, "cpu"},
        {arena + 50050, 100, "cpu"}, /* overlaps the one above */
    };
    cr_assert_eq(ferry_register_batch(engine, regions, 3, 0), FERRY_ERR_OVERLAP);
    cr_assert_eq(published_buffers(), 1, "the first two were rolled back");
    cr_assert_eq(ferry_unregister(engine, arena), FERRY_ERR_NOT_REGISTERED);
    regions[2].addr = arena + 60000;
    cr_assert_eq(ferry_register_batch(engine, regions, 3, 0), FERRY_OK);
    cr_assert_eq(published_buffers(), 4);
}

Test(registry, deferred_publish)
{
    cr_assert_eq(ferry_register(engine, arena, 100, "cpu", FERRY_REG_REMOTE |
                                                           FERRY_REG_DEFER_PUBLISH), FERRY_OK);
    cr_assert_eq(published_buffers(), 0);
    cr_assert_eq(ferry_publish(engine), FERRY_OK);
    cr_assert_eq(published_buffers(), 1);
}

struct reg_worker {
    int index;
    int errors;
};

static void *reg_main(void *arg)
{
    struct reg_worker *w = arg;
    /* Each thread owns 64 ranges of 64 bytes, interleaved with the others'. */
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 64; i++) {
            char *addr = arena + (size_t)(i * 8 + w->index) * 128;
            w->errors += ferry_register(engine, addr, 64, "cpu", 0) != FERRY_OK;
            /* overlapping another thread's range is always refused */
            w->errors += ferry_register(engine, addr + 32, 128, "cpu", 0) != FERRY_ERR_OVERLAP;
        }
        for (int i = 0; i < 64; i++)
            w->errors += ferry_unregister(engine, arena + (size_t)(i * 8 + w->index) * 128) !=
                         FERRY_OK;
    }
    return NULL;
}

Test(registry, concurrent_registrations)
{
    pthread_t tids[8];
    struct reg_worker workers[8];
    for (int i = 0; i < 8; i++) {
        workers[i] = (struct reg_worker){.index = i};
        pthread_create(&tids[i], NULL, reg_main, &workers[i]);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(tids[i], NULL);
        cr_assert_eq(workers[i].errors, 0, "thread %d saw %d wrong results", i,
                     workers[i].errors);
    }
    cr_assert_eq(published_buffers(), 0);
}

Test(registry, many_ranges)
{
    enum { N = 4096 };
    for (int i = 0; i < N; i++)
        cr_assert_eq(ferry_register(engine, arena + (size_t)i * 200, 100, "cpu",
                                    FERRY_REG_REMOTE | FERRY_REG_DEFER_PUBLISH), FERRY_OK);
    cr_assert_eq(ferry_publish(engine), FERRY_OK);
    cr_assert_eq(published_buffers(), N);
    for (int i = N - 1; i >= 0; i -= 2)
        cr_assert_eq(ferry_unregister(engine, arena + (size_t)i * 200), FERRY_OK);
    cr_assert_eq(published_buffers(), N / 2);
}

/* The ordered set itself, against a plain array: 4,000 slots of which a
 * random half is registered and unregistered in random order, over and
 * over; after each step every lookup, overlap check and the in-order walk
 * agree with the array. */
#define SLOTS 4000
#define SLOT_BYTES 64

static int in_order_and_counted(ferry_registry_t *r, const int *present)
{
    ferry_registry_iter_t it;
    ferry_registry_iter_init(&it, r);
    size_t seen = 0, want = 0;
    uintptr_t last = 0;
    for (ferry_reg_entry_t *e; (e = ferry_registry_iter_next(&it)) != NULL; seen++) {
        if (seen > 0 && e->addr <= last)
            return 0;
        last = e->addr;
        if (!present[(e->addr - 0x10000) / SLOT_BYTES])
            return 0;
    }
    for (size_t i = 0; i < SLOTS; i++)
        want += present[i] != 0;
    /* balanced: an AVL tree of n entries is at most 1.45 log2(n + 2) high */
    int bound = 1;
    for (size_t n = want + 2; n > 1; n >>= 1)
        bound++;
    int high = r->root ? r->root->tree_height : 0;
    return seen == want && r->count == want && high <= bound * 145 / 100 + 1;
}

Test(registry_tree, random_inserts_and_removes_agree_with_an_array)
{
    ferry_registry_t r;
    ferry_registry_init(&r);
    static ferry_reg_entry_t *slot[SLOTS];
    static int present[SLOTS];
    memset(slot, 0, sizeof(slot));
    memset(present, 0, sizeof(present));
    srand(18);
    for (int step = 0; step < 40000; step++) {
        size_t i = (size_t)rand() % SLOTS;
        uintptr_t addr = 0x10000 + i * SLOT_BYTES;
        if (!present[i]) {
            ferry_reg_entry_t *found = NULL;
            /* half a slot, so neighbours never touch */
            cr_assert_eq(ferry_registry_check(&r, addr, SLOT_BYTES / 2, &found), FERRY_OK);
            cr_assert_null(found);
            slot[i] = ferry_reg_entry_new(addr, SLOT_BYTES / 2, "cpu", FERRY_REG_REMOTE);
            cr_assert_eq(ferry_registry_insert(&r, slot[i]), FERRY_OK);
            present[i] = 1;
        } else {
            ferry_registry_remove(&r, slot[i]);
            ferry_reg_entry_free(slot[i]);
            slot[i] = NULL;
            present[i] = 0;
        }
        size_t j = (size_t)rand() % SLOTS;
        uintptr_t probe = 0x10000 + j * SLOT_BYTES;
        ferry_reg_entry_t *held = ferry_registry_acquire(&r, probe + 1, 8, 0);
        cr_assert_eq(held != NULL, present[j] != 0, "step %d slot %zu", step, j);
        if (held) {
            cr_assert_eq(held, slot[j]);
            ferry_registry_release(&r, held);
        }
        cr_assert_eq(ferry_registry_find_start(&r, probe), present[j] ? slot[j] : NULL);
        ferry_reg_entry_t *same = NULL;
        ferry_status_t overlap = ferry_registry_check(&r, probe + 8, SLOT_BYTES, &same);
        int next_present = j + 1 < SLOTS && present[j + 1];
        cr_assert_eq(overlap == FERRY_ERR_OVERLAP, present[j] || next_present,
                     "step %d slot %zu", step, j);
        if (step % 997 == 0)
            cr_assert(in_order_and_counted(&r, present), "step %d", step);
    }
    cr_assert(in_order_and_counted(&r, present));
    for (size_t i = 0; i < SLOTS; i++) {
        if (present[i]) {
            ferry_registry_remove(&r, slot[i]);
            ferry_reg_entry_free(slot[i]);
        }
    }
    cr_assert_null(r.root);
    ferry_registry_fini(&r);
}
