/* Descriptors for the codec tests (test_descriptor): built by hand, and
 * compared field by field. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "descriptor_samples.h"

/* A segment with every kind of field: keys present, absent and empty, a
 * key with every printable byte and some UTF-8, two locations. */
ferry_descriptor_t *ferry_test_sample_desc(size_t n_buffers, uint64_t seed)
{
    static const char *const names[] = {"tcp", "ucx", "local"};
    ferry_descriptor_t *desc = ferry_descriptor_new();
    cr_assert_not_null(desc);
    desc->name = strdup("segment \"one\" \xc3\xa9");
    desc->generation = 0xfedcba9876543210ull ^ seed;
    desc->revision = 7 + seed;
    desc->host_id = strdup("host-a");
    desc->rpc = strdup("10.0.0.1:7000");
    desc->transports = calloc(3, sizeof(*desc->transports));
    desc->n_transports = 3;
    for (size_t t = 0; t < 3; t++) {
        desc->transports[t].name = strdup(names[t]);
        desc->transports[t].endpoint = strdup(t == 1 ? "AAECAwQ=" : "127.0.0.1:4567");
    }
    char packed[200];
    size_t n = 0;
    for (int c = 1; c < 128; c++)
        packed[n++] = (char)c;
    strcpy(packed + n, "\xe2\x82\xac\xf0\x9f\x98\x80");
    desc->buffers = calloc(n_buffers ? n_buffers : 1, sizeof(*desc->buffers));
    desc->n_buffers = n_buffers;
    for (size_t i = 0; i < n_buffers; i++) {
        ferry_desc_buffer_t *b = &desc->buffers[i];
        b->addr = 0x7f0000000000ull + i * 0x10000 + (seed % 7) * 0x1000;
        b->length = 1 + (i * 977 + seed) % 0x10000;
        b->location = strdup(i % 5 == 3 ? "cuda:1" : "cpu");
        b->access = (unsigned[]){FERRY_REG_REMOTE, FERRY_REG_REMOTE_READ,
                                 FERRY_REG_REMOTE_WRITE}[i % 3];
        b->keys = calloc(3, sizeof(char *));
        b->keys[0] = strdup("");
        if (i % 4 != 2) {
            char key[300];
            snprintf(key, sizeof(key), "%s-%zu", i % 11 == 1 ? packed : "rkey", i);
            b->keys[1] = strdup(key);
        }
    }
    cr_assert_eq(ferry_descriptor_finish(desc), FERRY_OK);
    return desc;
}

void ferry_test_expect_same_desc(const ferry_descriptor_t *a, const ferry_descriptor_t *b)
{
    cr_assert_str_eq(a->name, b->name);
    cr_assert_eq(a->generation, b->generation);
    cr_assert_str_eq(a->host_id, b->host_id);
    cr_assert_str_eq(a->rpc, b->rpc);
    cr_assert_eq(a->n_transports, b->n_transports);
    for (size_t t = 0; t < a->n_transports; t++) {
        cr_assert_str_eq(a->transports[t].name, b->transports[t].name);
        cr_assert_str_eq(a->transports[t].endpoint, b->transports[t].endpoint);
    }
    cr_assert_eq(a->n_buffers, b->n_buffers);
    for (size_t i = 0; i < a->n_buffers; i++) {
        const ferry_desc_buffer_t *x = &a->buffers[i], *y = &b->buffers[i];
        cr_assert(x->addr == y->addr && x->length == y->length && x->access == y->access,
                  "buffer %zu", i);
        cr_assert_str_eq(x->location, y->location);
        for (size_t t = 0; t < a->n_transports; t++) {
            if (x->keys[t] == NULL)
                cr_assert_null(y->keys[t], "buffer %zu key %zu", i, t);
            else
                cr_assert_str_eq(x->keys[t], y->keys[t], "buffer %zu key %zu", i, t);
        }
    }
}

