/*
 * ferry_copy_many and the copy helpers (src/util/copy_pool.c): every byte
 * lands where it should and nothing around it changes, whether the caller
 * copies alone or shares the job; helpers really take a share; concurrent
 * callers, start/stop counting and a forked child stay correct.
 */
#include <criterion/criterion.h>

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/util/util.h"

#define GUARD 64

/* Items of assorted sizes (some empty, odd offsets, several spanning the
 * helpers' 128 KiB chunks) from src into dst, guard bytes between them. */
typedef struct layout {
    ferry_copy_item_t items[16];
    size_t count;
    unsigned char *src, *dst;
    size_t bytes;
} layout_t;

static void layout_make(layout_t *l, unsigned seed, int to_peer)
{
    static const size_t sizes[] = {0, 1, 63, 4096, 131071, 131073, 300000, 1 << 20, 7, 0,
                                   2 << 20, 65536, 129, 777777, 3, 262144};
    l->count = sizeof(sizes) / sizeof(sizes[0]);
    l->bytes = 0;
    for (size_t i = 0; i < l->count; i++)
        l->bytes += sizes[i] + GUARD + 1;
    l->src = malloc(l->bytes);
    l->dst = malloc(l->bytes);
    cr_assert(l->src != NULL && l->dst != NULL);
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < l->bytes; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l->src[i] = (unsigned char)(x >> 56);
    }
    memset(l->dst, 0xee, l->bytes);
    size_t offset = 1; /* odd: unaligned */
    for (size_t i = 0; i < l->count; i++) {
        l->items[i] = (ferry_copy_item_t){l->dst + offset, l->src + offset, sizes[i], to_peer};
        offset += sizes[i] + GUARD;
    }
}

static void layout_check(const layout_t *l)
{
    size_t offset = 1;
    for (size_t i = 0; i < l->count; i++) {
        size_t n = l->items[i].length;
        cr_assert(memcmp(l->dst + offset, l->src + offset, n) == 0, "item %zu (%zu B) differs",
                  i, n);
        for (size_t g = 0; g < GUARD; g++)
            cr_assert_eq(l->dst[offset + n + g], 0xee, "guard after item %zu written", i);
        offset += n + GUARD;
    }
    cr_assert_eq(l->dst[0], 0xee, "byte before the first item written");
}

static void layout_free(layout_t *l)
{
    free(l->src);
    free(l->dst);
}

Test(copy, alone_without_helpers)
{
    for (int to_peer = 0; to_peer <= 1; to_peer++) {
        layout_t l;
        layout_make(&l, 1 + (unsigned)to_peer, to_peer);
        ferry_copy_many(l.items, l.count);
        layout_check(&l);
        layout_free(&l);
    }
}

Test(copy, helpers_take_a_share_and_every_byte_lands)
{
    ferry_copy_helpers_start(2, 4096);
    uint64_t before = ferry_copy_helped_bytes();
    /* A helper that wakes late takes nothing: try until one took a share
     * (each job is ~5 MiB; a loaded host still runs a woken thread soon). */
    for (int round = 0; round < 2000 && ferry_copy_helped_bytes() == before; round++) {
        layout_t l;
        layout_make(&l, 10 + (unsigned)round, round & 1);
        ferry_copy_many(l.items, l.count);
        layout_check(&l);
        layout_free(&l);
    }
    cr_assert_gt(ferry_copy_helped_bytes(), before, "no helper ever took a share");
    ferry_copy_helpers_stop();
}

static void *copy_in_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int round = 0; round < 20; round++) {
        layout_t l;
        layout_make(&l, seed * 100 + (unsigned)round, round & 1);
        ferry_copy_many(l.items, l.count);
        layout_check(&l);
        layout_free(&l);
    }
    return NULL;
}

Test(copy, concurrent_callers)
{
    ferry_copy_helpers_start(2, 4096);
    pthread_t threads[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&threads[i], NULL, copy_in_thread, (void *)(i + 1));
    for (int i = 0; i < 4; i++)
        pthread_join(threads[i], NULL);
    ferry_copy_helpers_stop();
}

Test(copy, start_and_stop_are_counted)
{
    ferry_copy_helpers_start(1, 4096);
    ferry_copy_helpers_start(3, 1); /* the first one's settings stay */
    ferry_copy_helpers_stop();
    copy_in_thread((void *)7); /* still one user: helpers still there */
    ferry_copy_helpers_stop();
    ferry_copy_helpers_stop(); /* one too many: nothing happens */
    copy_in_thread((void *)8); /* none left: the caller copies alone */
}

Test(copy, forked_child_copies_and_stops_without_the_parents_helpers)
{
#ifdef __SANITIZE_THREAD__
    /* TSan kills a child of a multi-threaded fork that starts threads
     * ("not supported"); the plain and ASan runs cover this. */
    cr_skip_test("a thread after a multi-threaded fork: not under ThreadSanitizer");
#endif
    ferry_copy_helpers_start(2, 4096);
    pid_t child = fork();
    cr_assert_geq(child, 0);
    if (child == 0) {
        alarm(20); /* a hang fails the test instead of stalling it */
        layout_t l;
        layout_make(&l, 99, 1);
        ferry_copy_many(l.items, l.count);
        int same = memcmp(l.items[7].dst, l.items[7].src, l.items[7].length) == 0;
        ferry_copy_helpers_stop(); /* the parent's count: nothing to join here */
        ferry_copy_helpers_start(1, 4096);
        ferry_copy_many(l.items, l.count);
        ferry_copy_helpers_stop();
        _exit(same ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    ferry_copy_helpers_stop();
}

Test(copy, threads_setting)
{
    unsigned n = 99;
    cr_assert_eq(ferry_copy_threads_parse("auto", &n), FERRY_OK);
    cr_assert(n <= 1);
    cr_assert_eq(ferry_copy_threads_parse("0", &n), FERRY_OK);
    cr_assert_eq(n, 0);
    cr_assert_eq(ferry_copy_threads_parse("16", &n), FERRY_OK);
    cr_assert_eq(n, 16);
    cr_assert_eq(ferry_copy_threads_parse("17", &n), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_copy_threads_parse("-1", &n), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_copy_threads_parse("two", &n), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_copy_threads_parse("2x", &n), FERRY_ERR_INVALID_PARAM);
}
