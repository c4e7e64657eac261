/*
 * Change sets (incremental refresh): a descriptor with changes applied is
 * the descriptor a full fetch gives, step by step or many steps at once;
 * change texts that are malformed, or do not fit the descriptor they are
 * applied to, are refused (FERRY_ERR_DECODE), never a crash.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_rng.h"
#include "../src/core/core.h"
#include "descriptor_samples.h"

#define SLOTS 400
#define SLOT_ADDR(slot) (0x100000ull + (uint64_t)(slot) * 0x1000)

static uint64_t rng_state = 0x853c49e6748fea9bull;

static uint64_t rng(void)
{
    return test_rng_next(&rng_state);
}

/* What the owner registered: one buffer per used slot. */
typedef struct model {
    int used[SLOTS];
    uint64_t length[SLOTS];
    unsigned access[SLOTS];
    char key[SLOTS][32];
} model_t;

static void fill_buffer(const model_t *m, size_t slot, ferry_desc_pool_t *pool,
                        ferry_desc_buffer_t *b)
{
    b->addr = SLOT_ADDR(slot);
    b->length = m->length[slot];
    b->access = m->access[slot];
    const char *location = slot % 3 ? "cpu" : "cuda:0";
    b->location = pool ? ferry_desc_pool_strndup(pool, location, strlen(location))
                       : strdup(location);
    b->keys = pool ? ferry_desc_pool_alloc(pool, 2 * sizeof(char *)) : calloc(2, sizeof(char *));
    b->keys[0] = pool ? ferry_desc_pool_strndup(pool, "", 0) : strdup("");
    b->keys[1] = slot % 4 == 1 ? NULL
                 : pool       ? ferry_desc_pool_strndup(pool, m->key[slot], strlen(m->key[slot]))
                              : strdup(m->key[slot]);
}

/* The descriptor a full fetch would give at this revision. */
static ferry_descriptor_t *full_desc(const model_t *m, uint64_t revision)
{
    ferry_descriptor_t *desc = ferry_descriptor_new();
    desc->name = strdup("seg");
    desc->generation = 0xabc;
    desc->revision = revision;
    desc->host_id = strdup("h");
    desc->rpc = strdup("127.0.0.1:1");
    desc->transports = calloc(2, sizeof(*desc->transports));
    desc->n_transports = 2;
    desc->transports[0] = (ferry_desc_transport_t){strdup("tcp"), strdup("127.0.0.1:2")};
    desc->transports[1] = (ferry_desc_transport_t){strdup("ucx"), strdup("AAEC")};
    desc->buffers = calloc(SLOTS, sizeof(*desc->buffers));
    for (size_t s = 0; s < SLOTS; s++)
        if (m->used[s])
            fill_buffer(m, s, NULL, &desc->buffers[desc->n_buffers++]);
    cr_assert_eq(ferry_descriptor_finish(desc), FERRY_OK);
    return desc;
}

static void set_slot(model_t *m, size_t slot)
{
    m->used[slot] = 1;
    m->length[slot] = 1 + rng() % 0x1000;
    m->access[slot] = (unsigned[]){FERRY_REG_REMOTE, FERRY_REG_REMOTE_READ,
                                   FERRY_REG_REMOTE_WRITE}[rng() % 3];
    snprintf(m->key[slot], sizeof(m->key[slot]), "k%llx", (unsigned long long)rng());
}

/* One random step on the model, recorded in step (strings in pool). */
static void random_step(model_t *m, uint64_t revision, ferry_desc_pool_t *pool,
                        ferry_desc_step_t *step)
{
    *step = (ferry_desc_step_t){.revision = revision};
    step->removed = calloc(SLOTS, sizeof(*step->removed));
    step->added = calloc(SLOTS, sizeof(*step->added));
    int changed[SLOTS] = {0};
    size_t n = 1 + rng() % (rng() % 8 ? 3 : 40);
    for (size_t k = 0; k < n; k++) {
        size_t slot = rng() % SLOTS;
        if (changed[slot] != 0)
            continue;
        if (m->used[slot] && rng() % 4 == 0) {
            /* the same address again with another length: removed and added */
            set_slot(m, slot);
            changed[slot] = 2;
        } else if (m->used[slot]) {
            m->used[slot] = 0;
            changed[slot] = 3;
        } else {
            set_slot(m, slot);
            changed[slot] = 4;
        }
    }
    for (size_t s = 0; s < SLOTS; s++) {
        if (changed[s] == 2 || changed[s] == 3)
            step->removed[step->n_removed++] = SLOT_ADDR(s);
        if (changed[s] == 2 || changed[s] == 4)
            fill_buffer(m, s, pool, &step->added[step->n_added++]);
    }
}

/* Through text, as a peer gets them. */
static void transmit(const ferry_desc_changes_t *changes, uint64_t since,
                     ferry_desc_changes_t *received)
{
    char *text = NULL;
    size_t length = 0;
    cr_assert_eq(ferry_desc_changes_encode(changes, since, &text, &length), FERRY_OK);
    cr_assert_eq(length, strlen(text));
    char *exact = malloc(length ? length : 1);
    memcpy(exact, text, length);
    cr_assert_eq(ferry_desc_changes_decode(exact, length, received), FERRY_OK, "%s", text);
    free(exact);
    free(text);
}

static void expect_same_text(const ferry_descriptor_t *a, const ferry_descriptor_t *b)
{
    ferry_test_expect_same_desc(a, b);
    char *x = NULL, *y = NULL;
    cr_assert_eq(ferry_descriptor_compact_encode(a, &x, NULL), FERRY_OK);
    cr_assert_eq(ferry_descriptor_compact_encode(b, &y, NULL), FERRY_OK);
    cr_assert_str_eq(x, y);
    free(x);
    free(y);
}

/* A pooled descriptor, as a peer holds one after a full fetch. */
static ferry_descriptor_t *fetched(const ferry_descriptor_t *desc)
{
    char *text = NULL;
    cr_assert_eq(ferry_descriptor_compact_encode(desc, &text, NULL), FERRY_OK);
    ferry_descriptor_t *back = NULL;
    cr_assert_eq(ferry_descriptor_decode(text, strlen(text), &back), FERRY_OK);
    free(text);
    return back;
}

Test(descriptor_changes, applied_changes_equal_a_full_fetch)
{
    model_t m = {0};
    for (size_t s = 0; s < SLOTS; s += 2)
        set_slot(&m, s);
    const uint64_t first = 5, steps = 60;
    ferry_descriptor_t *truth = full_desc(&m, first);
    ferry_descriptor_t *start = fetched(truth), *held = ferry_descriptor_ref(start);
    ferry_descriptor_t *at[61] = {ferry_descriptor_ref(start)};
    ferry_descriptor_unref(truth);

    ferry_desc_changes_t all;
    ferry_desc_changes_init(&all, 0xabc, first, 2);
    all.pool = ferry_desc_pool_new(NULL);
    all.steps = calloc(steps, sizeof(*all.steps));
    for (uint64_t r = 1; r <= steps; r++) {
        random_step(&m, first + r, all.pool, &all.steps[all.n_steps++]);
        /* step by step: the peer refreshes after every publish */
        ferry_desc_changes_t one;
        transmit(&all, first + r - 1, &one);
        cr_assert_eq(one.n_steps, 1);
        ferry_descriptor_t *next = NULL;
        cr_assert_eq(ferry_descriptor_apply(held, &one, &next), FERRY_OK, "step %llu",
                     (unsigned long long)r);
        ferry_desc_changes_fini(&one);
        ferry_descriptor_unref(held);
        held = next;
        cr_assert_eq(held->revision, first + r);
        truth = full_desc(&m, first + r);
        expect_same_text(held, truth);
        ferry_descriptor_unref(truth);
        at[r] = ferry_descriptor_ref(held);
    }
    truth = full_desc(&m, first + steps);
    /* many steps at once: a peer that slept through some publishes */
    for (uint64_t since = 0; since <= steps; since += 7) {
        ferry_desc_changes_t many;
        transmit(&all, first + since, &many);
        ferry_descriptor_t *caught_up = NULL;
        cr_assert_eq(ferry_descriptor_apply(at[since], &many, &caught_up), FERRY_OK);
        expect_same_text(caught_up, truth);
        ferry_descriptor_unref(caught_up);
        ferry_desc_changes_fini(&many);
    }
    for (uint64_t r = 0; r <= steps; r++)
        ferry_descriptor_unref(at[r]);
    ferry_descriptor_unref(truth);
    ferry_descriptor_unref(held);
    ferry_descriptor_unref(start);
    ferry_desc_changes_fini(&all);
}

/* A one-step change set adding (and removing) one buffer. */
static ferry_desc_changes_t one_change(uint64_t generation, uint64_t from, uint64_t addr,
                                       uint64_t length, uint64_t removed)
{
    ferry_desc_changes_t c;
    ferry_desc_changes_init(&c, generation, from, 2);
    c.pool = ferry_desc_pool_new(NULL);
    c.steps = calloc(1, sizeof(*c.steps));
    c.n_steps = 1;
    ferry_desc_step_t *step = &c.steps[0];
    step->revision = from + 1;
    step->removed = calloc(1, sizeof(uint64_t));
    step->added = calloc(1, sizeof(*step->added));
    if (removed)
        step->removed[step->n_removed++] = removed;
    if (length) {
        model_t m = {0};
        m.length[0] = length;
        m.access[0] = FERRY_REG_REMOTE;
        strcpy(m.key[0], "k");
        fill_buffer(&m, 0, c.pool, &step->added[0]);
        step->added[0].addr = addr;
        step->n_added = 1;
    }
    return c;
}

Test(descriptor_changes, changes_that_do_not_fit_are_refused)
{
    model_t m = {0};
    set_slot(&m, 1);
    m.length[1] = 0x1000;
    ferry_descriptor_t *truth = full_desc(&m, 3), *held = fetched(truth);
    ferry_log_level_current = -1;
    static const struct {
        uint64_t generation, from, addr, length, removed;
    } cases[] = {
        {0xabd, 3, SLOT_ADDR(5), 16, 0},                /* another generation */
        {0xabc, 2, SLOT_ADDR(5), 16, 0},                /* another revision */
        {0xabc, 3, SLOT_ADDR(1) + 16, 16, 0},           /* inside a kept buffer */
        {0xabc, 3, SLOT_ADDR(1), 0x1000, 0},            /* over a kept one, not removed */
        {0xabc, 3, SLOT_ADDR(1) - 8, 16, 0},            /* overlapping its start */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ferry_desc_changes_t c = one_change(cases[i].generation, cases[i].from, cases[i].addr,
                                            cases[i].length, cases[i].removed);
        ferry_descriptor_t *next = (ferry_descriptor_t *)1;
        cr_expect_eq(ferry_descriptor_apply(held, &c, &next), FERRY_ERR_DECODE, "case %zu", i);
        cr_expect_null(next);
        ferry_desc_changes_fini(&c);
    }
    /* removing what is not there is no error (the owner may show a removal
     * early), and replacing one buffer by another at its address works */
    ferry_desc_changes_t c = one_change(0xabc, 3, SLOT_ADDR(1), 0x800, SLOT_ADDR(1));
    ferry_descriptor_t *next = NULL;
    cr_assert_eq(ferry_descriptor_apply(held, &c, &next), FERRY_OK);
    cr_assert_eq(next->n_buffers, 1);
    cr_assert_eq(next->buffers[0].length, 0x800);
    ferry_descriptor_unref(next);
    ferry_desc_changes_fini(&c);
    c = one_change(0xabc, 3, 0, 0, SLOT_ADDR(7));
    cr_assert_eq(ferry_descriptor_apply(held, &c, &next), FERRY_OK);
    cr_assert_eq(next->n_buffers, 1);
    ferry_descriptor_unref(next);
    ferry_desc_changes_fini(&c);
    ferry_descriptor_unref(held);
    ferry_descriptor_unref(truth);
}

#define VALID_CHANGES "ferry:changes:1\ngeneration abc\nfrom 3\ntransports 2\nsteps 2\n" \
                      "step 4 1 1\n1000\n1000 10 rw 3:cpu 0: -\nstep 5 0 2\n"            \
                      "3000 10 r 3:cpu 0: 1:k\n4000 10 w 3:cpu - -\n"

Test(descriptor_changes, malformed_change_texts_are_refused)
{
    ferry_desc_changes_t c;
    cr_assert_eq(ferry_desc_changes_decode(VALID_CHANGES, strlen(VALID_CHANGES), &c), FERRY_OK);
    cr_assert_eq(c.n_steps, 2);
    cr_assert_eq(c.steps[1].n_added, 2);
    char *text = NULL;
    cr_assert_eq(ferry_desc_changes_encode(&c, 3, &text, NULL), FERRY_OK);
    cr_assert_str_eq(text, VALID_CHANGES, "the writer is canonical");
    free(text);
    ferry_desc_changes_fini(&c);

    ferry_log_level_current = -1;
    size_t length = strlen(VALID_CHANGES);
    for (size_t cut = 0; cut < length; cut++) {
        char *copy = malloc(cut ? cut : 1);
        memcpy(copy, VALID_CHANGES, cut);
        cr_expect_eq(ferry_desc_changes_decode(copy, cut, &c), FERRY_ERR_DECODE, "%zu", cut);
        free(copy);
    }
    static const char *const bad[] = {
        "ferry:changes:1\ngeneration abc\nfrom 3\ntransports 41\nsteps 0\n",
        "ferry:changes:1\ngeneration abc\nfrom 3\ntransports 0\nsteps 1\nstep 5 0 0\n",
        "ferry:changes:1\ngeneration abc\nfrom 3\ntransports 0\nsteps 1\nstep 4 2 0\n2\n1\n",
        "ferry:changes:1\ngeneration abc\nfrom 3\ntransports 0\nsteps 1\nstep 4 ffff 0\n1\n",
        "ferry:changes:1\ngeneration abc\nfrom 3\ntransports 0\nsteps 1\nstep 4 0 2\n"
        "1000 10 rw 0:\n1008 10 rw 0:\n",
        "ferry:changes:1\ngeneration abc\nfrom ffffffffffffffff\ntransports 0\nsteps 1\n"
        "step 0 0 0\n",
        "ferry:changes:1\ngeneration abc\nfrom 3\ntransports 0\nsteps 0\nx",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_eq(ferry_desc_changes_decode(bad[i], strlen(bad[i]), &c), FERRY_ERR_DECODE,
                     "case %zu", i);
}
