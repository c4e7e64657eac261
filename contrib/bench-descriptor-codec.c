/*
 * The descriptor codecs alone, in CPU time (so that other load on the
 * machine counts little): encode and decode of an N-buffer descriptor (one
 * tcp key per buffer, as an engine publishes with FERRY_TRANSPORTS=tcp) in
 * the compact form and in JSON, and applying a one-buffer change to it.
 * Internal functions: built against the build tree's convenience library.
 *
 *   cc -O2 -Iinclude -Isrc -o /tmp/bench-codec contrib/bench-descriptor-codec.c \
 *      build/.libs/libferry_internal.a -ljansson -lcurl -lpthread -ldl
 *   /tmp/bench-codec 100000
 *
 * JSON is skipped past 64 MiB (about 700,000 buffers): its decoder refuses it.
 */
#include "core/core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

static ferry_descriptor_t *make(size_t n)
{
    ferry_descriptor_t *d = ferry_descriptor_new();
    d->name = strdup("127.0.0.1:40000");
    d->host_id = strdup("host");
    d->rpc = strdup("127.0.0.1:40000");
    d->revision = 1;
    d->transports = calloc(1, sizeof(*d->transports));
    d->n_transports = 1;
    d->transports[0] = (ferry_desc_transport_t){strdup("tcp"), strdup("127.0.0.1:40001")};
    d->pool = ferry_desc_pool_new(NULL);
    d->buffers = calloc(n ? n : 1, sizeof(*d->buffers));
    d->n_buffers = n;
    for (size_t i = 0; i < n; i++) {
        ferry_desc_buffer_t *b = &d->buffers[i];
        b->addr = 0x7f0000000000ull + i * 4096;
        b->length = 4096;
        b->access = FERRY_REG_REMOTE;
        b->location = ferry_desc_pool_strndup(d->pool, "cpu", 3);
        b->keys = ferry_desc_pool_alloc(d->pool, sizeof(char *));
        b->keys[0] = ferry_desc_pool_strndup(d->pool, "", 0);
    }
    return d;
}

static void codec(const ferry_descriptor_t *d, ferry_desc_form_t form, const char *name)
{
    char *text;
    size_t length;
    double start = cpu_ms();
    if (ferry_descriptor_encode_as(d, form, &text, &length) != FERRY_OK)
        exit(1);
    double encoded = cpu_ms();
    ferry_descriptor_t *back;
    if (ferry_descriptor_decode(text, length, &back) != FERRY_OK)
        exit(1);
    double decoded = cpu_ms();
    printf("%-8s %10zu bytes  encode %9.2f ms (%5.1f M buffers/s)  decode %9.2f ms "
           "(%5.1f M buffers/s)\n", name, length, encoded - start,
           d->n_buffers / (encoded - start) / 1e3, decoded - encoded,
           d->n_buffers / (decoded - encoded) / 1e3);
    ferry_descriptor_unref(back);
    free(text);
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 100000;
    ferry_descriptor_t *d = make(n);
    printf("%zu buffers\n", n);
    codec(d, FERRY_DESC_FORM_COMPACT, "compact");
    if (n < 700000)
        codec(d, FERRY_DESC_FORM_JSON, "json");

    ferry_desc_changes_t changes;
    ferry_desc_changes_init(&changes, d->generation, d->revision, 1);
    ferry_desc_step_t step = {.revision = d->revision + 1, .n_removed = 1};
    uint64_t removed = n ? d->buffers[n / 2].addr : 1;
    step.removed = &removed;
    changes.steps = &step;
    changes.n_steps = 1;
    int rounds = 20;
    double start = cpu_ms();
    for (int r = 0; r < rounds; r++) {
        ferry_descriptor_t *next;
        if (ferry_descriptor_apply(d, &changes, &next) != FERRY_OK)
            return 1;
        ferry_descriptor_unref(next);
    }
    printf("apply one change: %.3f ms\n", (cpu_ms() - start) / rounds);
    ferry_descriptor_unref(d);
    return 0;
}
