#include "unregister_race.h"

#include <criterion/criterion.h>

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct writer {
    ferry_engine_h engine;
    ferry_segment_h segment;
    uint64_t remote;
    unsigned char *local;
    const char *via;
    atomic_int *stop;
    atomic_long done; /* writes that completed */
    pthread_t thread;
} writer_t;

static void *write_loop(void *arg)
{
    writer_t *w = arg;
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(w->engine, 1, &batch), FERRY_OK);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = w->local, .target = w->segment,
                           .target_offset = w->remote, .length = UNREGISTER_RACE_BLOCK,
                           .transport = w->via};
    while (!atomic_load(w->stop)) {
        /* Refused while the range is gone: keep trying, as an eager peer would. */
        if (ferry_batch_submit(batch, &req, 1) == FERRY_OK &&
            ferry_batch_wait(batch, 30000) == FERRY_OK)
            atomic_fetch_add(&w->done, 1);
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    return NULL;
}

static long writes_done(writer_t *writers)
{
    long done = 0;
    for (int i = 0; i < UNREGISTER_RACE_WRITERS; i++)
        done += atomic_load(&writers[i].done);
    return done;
}

void unregister_under_writers(ferry_engine_h engine, ferry_segment_h segment,
                              peer_process_t *peer, uintptr_t remote, const char *via)
{
    enum { WRITERS = UNREGISTER_RACE_WRITERS, BLOCK = UNREGISTER_RACE_BLOCK };
    size_t range = UNREGISTER_RACE_RANGE;
    unsigned char *local = malloc(range);
    cr_assert_not_null(local);
    memset(local, 0xab, range);
    atomic_int stop = 0;
    writer_t writers[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        writers[i] = (writer_t){.engine = engine, .segment = segment,
                                .remote = remote + (uint64_t)i * BLOCK,
                                .local = local + (size_t)i * BLOCK, .via = via, .stop = &stop};
        cr_assert_eq(pthread_create(&writers[i].thread, NULL, write_loop, &writers[i]), 0);
    }
    for (int round = 0; round < 6; round++) {
        /* Writes must go through again before the range goes away, so each round
         * unregisters under writers that are landing, not under refused ones. The
         * wait is bounded by time, never by how fast a (sanitized) build writes. */
        long before = writes_done(writers);
        for (int waited = 0; waited < 1000 && writes_done(writers) < before + 2 * WRITERS;
             waited++)
            usleep(10000);
        cr_assert_geq(writes_done(writers), before + 2 * WRITERS,
                      "round %d: the writers did not write again within 10 s", round);
        cr_assert_str_eq(peer_cmd(peer, "aunreg 0x%" PRIxPTR, remote), "OK");
        cr_assert_str_eq(peer_cmd(peer, "afill 0x%" PRIxPTR " %zu %d", remote, range,
                                  90 + round),
                         "OK");
        usleep(80000);
        cr_assert_str_eq(peer_cmd(peer, "acheck 0x%" PRIxPTR " %zu %d", remote, range,
                                  90 + round),
                         "OK", "round %d: a write landed after ferry_unregister returned", round);
        cr_assert_str_eq(peer_cmd(peer, "areg 0x%" PRIxPTR " %zu", remote, range), "OK");
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(writers[i].thread, NULL);
    free(local);
}
