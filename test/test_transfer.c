/* Two-process transfers over a native transport, bytes verified: built
 * once for tcp (test_transfer) and once for shm (test_transfer_shm). */
#include <criterion/criterion.h>
#include <ferry/ferry.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "one_request.h"
#include "peer_process.h"
#include "put_get.h"
#include "test_clock.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)
#ifndef TRANSFER_TRANSPORT
#define TRANSFER_TRANSPORT "tcp"
#endif

static peer_process_t peer;
static ferry_engine_h engine;
static ferry_segment_h segment;
static unsigned char *local;
static size_t local_size = 72 * MIB;

static void setup(void)
{
    /* this suite is about one transport; peers inherit it */
    setenv("FERRY_TRANSPORTS", TRANSFER_TRANSPORT, 1);
    cr_assert_eq(peer_start(&peer, NULL), 0, "test peer did not start");
    cr_assert_str_eq(peer_cmd(&peer, "reg 0 %zu", (size_t)70 * MIB), "OK");
    cr_assert_eq(ferry_engine_create(NULL, &engine), FERRY_OK);
    cr_assert_eq(ferry_segment_open(engine, peer.name, &segment), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&local, 4096, local_size), 0);
    cr_assert_eq(ferry_register(engine, local, local_size, "cpu", 0), FERRY_OK);
}

static void teardown(void)
{
    ferry_unregister(engine, local);
    ferry_segment_close(engine, segment);
    ferry_engine_destroy(engine);
    free(local);
    peer_stop(&peer);
}

static ferry_status_t transfer(ferry_opcode_t op, void *buf, uint64_t remote, size_t length)
{
    return one_request_served_by(engine, op, buf, segment, remote, length, TRANSFER_TRANSPORT);
}

TestSuite(transfer, .init = setup, .fini = teardown, .timeout = 120);

Test(transfer, write_then_read_sizes_1B_to_64MiB_unaligned)
{
    static const size_t sizes[] = {1, 7, 4096, 65537, MIB + 3, 64 * MIB};
    put_get_sizes(engine, &peer, segment, local, sizes, sizeof(sizes) / sizeof(sizes[0]),
                  TRANSFER_TRANSPORT);
}

Test(transfer, unregistered_local_buffer_works)
{
    unsigned char buf[1000];
    test_pattern_fill(buf, sizeof(buf), 9);
    cr_assert_eq(transfer(FERRY_OP_WRITE, buf, peer.arena + 1, sizeof(buf)), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check 1 %zu 9", sizeof(buf)), "OK");
}

/* A batch remembers the local registration its last request used, to skip
 * the lookup next time; unregistering must make it forget (ASan in CI sees
 * any use of the freed entry), and a new registration in the same place is
 * found afresh. */
Test(transfer, batch_reused_after_its_local_buffer_is_unregistered)
{
    size_t length = 4096;
    unsigned char *buf = malloc(2 * length);
    cr_assert_not_null(buf);
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    for (unsigned round = 0; round < 4; round++) {
        int registered = round % 2 == 0;
        if (registered) /* the second time a different length: a new entry */
            cr_assert_eq(ferry_register(engine, buf, length + round, "cpu", 0), FERRY_OK);
        test_pattern_fill(buf, length, 40 + round);
        ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = buf, .target = segment,
                               .target_offset = peer.arena + 8192, .length = length};
        cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK, "round %u", round);
        cr_assert_eq(ferry_batch_wait(batch, 60000), FERRY_OK, "round %u", round);
        cr_assert_str_eq(peer_cmd(&peer, "check 8192 %zu %u", length, 40 + round), "OK");
        if (registered)
            cr_assert_eq(ferry_unregister(engine, buf), FERRY_OK);
    }
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    free(buf);
}

struct worker {
    int index;
    ferry_status_t status;
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    size_t region = 4 * MIB, block = 256 * 1024 + 13;
    unsigned char *mine = local + (size_t)w->index * region;
    uint64_t theirs = peer.arena + (uint64_t)w->index * region;
    ferry_batch_h batch;
    w->status = ferry_batch_create(engine, 16, &batch);
    for (int round = 0; round < 8 && w->status == FERRY_OK; round++) {
        ferry_request_t reqs[8];
        for (int i = 0; i < 8; i++) {
            test_pattern_fill(mine + (size_t)i * block, block, (unsigned)(w->index * 100 + round));
            reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE,
                                        .local = mine + (size_t)i * block, .target = segment,
                                        .target_offset = theirs + (uint64_t)i * block,
                                        .length = block};
        }
        w->status = ferry_batch_submit(batch, reqs, 8);
        if (w->status == FERRY_OK)
            w->status = ferry_batch_wait(batch, 60000);
        /* read it back into the second half of the region */
        for (int i = 0; i < 8 && w->status == FERRY_OK; i++) {
            ferry_request_t back = {.opcode = FERRY_OP_READ, .local = mine + 2 * MIB + 17,
                                    .target = segment,
                                    .target_offset = theirs + (uint64_t)i * block, .length = block};
            w->status = ferry_batch_submit(batch, &back, 1);
            if (w->status == FERRY_OK)
                w->status = ferry_batch_wait(batch, 60000);
            if (w->status == FERRY_OK && test_pattern_check(mine + 2 * MIB + 17, block,
                                                            (unsigned)(w->index * 100 + round)) !=
                                             SIZE_MAX)
                w->status = FERRY_ERR_IO;
        }
    }
    ferry_batch_destroy(batch);
    return NULL;
}

Test(transfer, several_threads_share_one_engine)
{
    enum { THREADS = 6 };
    pthread_t tids[THREADS];
    struct worker workers[THREADS];
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (struct worker){.index = i};
        pthread_create(&tids[i], NULL, worker_main, &workers[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(tids[i], NULL);
        cr_assert_eq(workers[i].status, FERRY_OK, "thread %d: %s", i,
                     ferry_status_string(workers[i].status));
    }
}

Test(transfer, batch_of_many_small_requests)
{
    enum { N = 512 };
    ferry_batch_h batch;
    ferry_request_t reqs[N];
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    test_pattern_fill(local, N * 100, 77);
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = local + i * 100,
                                    .target = segment,
                                    .target_offset = peer.arena + 1000 + i * 100, .length = 100};
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 60000), FERRY_OK);
    for (int i = 0; i < N; i++) {
        ferry_xfer_status_t xs;
        cr_assert_eq(ferry_batch_status(batch, (size_t)i, &xs), FERRY_OK);
        cr_assert_eq(xs.state, FERRY_XFER_COMPLETED);
    }
    cr_assert_str_eq(peer_cmd(&peer, "check 1000 %d 77", N * 100), "OK");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
}

/*
 * Runs of requests that share their target buffer and their local
 * registration, and the places where either changes (a batch takes a run's
 * references together, src/core/batch.c): every request's bytes arrive,
 * also when reads and writes alternate, and a local buffer unregisters at
 * once after the wait (no hold left behind), also after a submit refused
 * midway through a run.
 */
Test(transfer, batch_of_runs_over_several_local_buffers)
{
    enum { N = 96, L = 300 };
    size_t at = 2 * MIB;
    unsigned char *whole = malloc(N * L), *other = malloc(N * L), *plain = malloc(N * L);
    cr_assert(whole != NULL && other != NULL && plain != NULL);
    cr_assert_eq(ferry_register(engine, other, N * L, "cpu", 0), FERRY_OK);
    test_pattern_fill(whole, N * L, 31);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++) {
        /* runs of 12 from local, 6 from other, 6 from unregistered memory */
        unsigned char *base = i % 24 < 12 ? local : i % 24 < 18 ? other : plain;
        memcpy(base + i * L, whole + i * L, L);
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE, .local = base + i * L,
                                    .target = segment, .target_offset = peer.arena + at + i * L,
                                    .length = L};
    }
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&peer, "sum %zu %d", at, N * L));
    reqs[N / 2 + 1].target_offset = peer.arena + 70 * MIB - 10;
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_ERR_OUT_OF_RANGE);
    cr_assert_str_eq(peer_cmd(&peer, "sum %zu %d", at, N * L), before);
    reqs[N / 2 + 1].target_offset = peer.arena + at + (N / 2 + 1) * L;
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 60000), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %d 31", at, N * L), "OK");

    for (int i = 1; i < N; i += 2) {
        reqs[i].opcode = FERRY_OP_READ;
        memset(reqs[i].local, 0, L);
    }
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 60000), FERRY_OK);
    for (int i = 0; i < N; i++)
        cr_assert_eq(memcmp(reqs[i].local, whole + i * L, L), 0, "request %d", i);
    cr_assert_eq(ferry_unregister(engine, other), FERRY_OK);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    free(whole);
    free(other);
    free(plain);
}

/*
 * The peer polls for the notify and, the moment it arrives, looks at its
 * memory: all of the batch's 32 MiB must be there already (a notify sent
 * when it is attached, not after the data, arrives while they are still
 * on their way).  Then a plain notify.
 */
Test(transfer, notify_attached_to_batch_arrives_after_its_data)
{
    enum { N = 4 };
    const size_t each = 8 * MIB;
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, N, &batch), FERRY_OK);
    test_pattern_fill(local, N * each, 31);
    ferry_request_t reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE,
                                    .local = local + i * each,
                                    .target = segment,
                                    .target_offset = peer.arena + i * each,
                                    .length = each};
    cr_assert_str_eq(peer_cmd(&peer, "notifycheck 60000 0 %zu 31", N * each), "POLLING");
    cr_assert_eq(ferry_batch_submit(batch, reqs, N), FERRY_OK);
    cr_assert_eq(ferry_batch_notify(batch, segment, "done", 4), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 60000), FERRY_OK);
    peer_reply(&peer);
    cr_assert_eq(strncmp(peer.reply, "NOTIFY ", 7), 0, "%s", peer.reply);
    cr_assert(strstr(peer.reply, " done OK") != NULL,
              "the notify arrived before its batch's data: %s", peer.reply);

    cr_assert_eq(ferry_notify_send(engine, segment, "plain", 5), FERRY_OK);
    cr_assert(strstr(peer_cmd(&peer, "notify 5000"), " plain") != NULL, "%s", peer.reply);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
}

Test(transfer, own_segment_is_reachable)
{
    ferry_segment_h self;
    cr_assert_eq(ferry_segment_open(engine, ferry_engine_segment_name(engine), &self), FERRY_OK);
    test_pattern_fill(local, 1000, 5);
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = local, .target = self,
                           .target_offset = (uint64_t)(uintptr_t)(local + MIB),
                           .length = 1000};
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
    cr_assert_eq(ferry_batch_wait(batch, 1000), FERRY_OK);
    cr_assert_eq(test_pattern_check(local + MIB, 1000, 5), SIZE_MAX);
    ferry_xfer_status_t xs;
    cr_assert_eq(ferry_batch_status(batch, 0, &xs), FERRY_OK);
    cr_assert_str_eq(xs.transport, "local");
    /* outside our own buffers: refused at submit */
    req.target_offset = (uint64_t)(uintptr_t)(local + local_size);
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_ERR_OUT_OF_RANGE);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    cr_assert_eq(ferry_segment_close(engine, self), FERRY_OK);
}

Test(transfer, request_outside_remote_buffers_is_refused)
{
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu 4096 3", 70 * MIB), "OK");
    char before[64];
    snprintf(before, sizeof(before), "%s", peer_cmd(&peer, "sum %zu 4096", 70 * MIB));
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE, .local = local, .target = segment,
                           .target_offset = peer.arena + 70 * MIB - 10, .length = 100};
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_ERR_OUT_OF_RANGE);
    cr_assert_str_eq(peer_cmd(&peer, "sum %zu 4096", 70 * MIB), before);
    /* The exact end: a request ending at the buffer's last byte is served,
     * one ending a byte later is refused (by the initiator, before
     * anything moves: over shm nobody else would check). */
    test_pattern_fill(local, 4096, 12);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, peer.arena + 70 * MIB - 4096, 4096), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check %zu 4096 12", 70 * MIB - 4096), "OK");
    test_pattern_fill(local, 4096, 13);
    req.target_offset = peer.arena + 70 * MIB - 4095;
    req.length = 4096;
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_ERR_OUT_OF_RANGE);
    req.opcode = FERRY_OP_READ;
    cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_ERR_OUT_OF_RANGE);
    cr_assert_str_eq(peer_cmd(&peer, "check %zu 4096 12", 70 * MIB - 4096), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "sum %zu 4096", 70 * MIB), before);
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
}

/* A read-only remote buffer is never written and a write-only one never
 * read: refused (FERRY_ERR_REMOTE_REFUSED) before anything moves, which
 * over shm is the only check there is.  The allowed direction works. */
Test(transfer, remote_flags_are_kept)
{
    const size_t ro = 72 * MIB, wo = 76 * MIB;
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu r", ro, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu w", wo, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 41", ro, MIB), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 42", wo, MIB), "OK");
    test_pattern_fill(local, MIB, 43);
    cr_assert_eq(one_request(engine, FERRY_OP_WRITE, local, segment, peer.arena + ro, MIB, NULL),
                 FERRY_ERR_REMOTE_REFUSED, "a write into a read-only buffer");
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu 41", ro, MIB), "OK",
                     "the read-only buffer was written");
    memset(local + MIB, 0, MIB);
    cr_assert_eq(
        one_request(engine, FERRY_OP_READ, local + MIB, segment, peer.arena + wo, MIB, NULL),
        FERRY_ERR_REMOTE_REFUSED, "a read of a write-only buffer");
    cr_assert_eq(test_pattern_check(local + MIB, MIB, 42), 0, "the write-only buffer was read");

    cr_assert_eq(transfer(FERRY_OP_READ, local + MIB, peer.arena + ro, MIB), FERRY_OK);
    cr_assert_eq(test_pattern_check(local + MIB, MIB, 41), SIZE_MAX);
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, peer.arena + wo, MIB), FERRY_OK);
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu 43", wo, MIB), "OK");
}

/* A batch sent again (the same request) after the owner unregistered the
 * buffer its last round wrote: the owner's INVALIDATE replaced the
 * descriptor, so the round is not sent with the old one; the write is
 * refused and the memory, the owner's alone now, keeps what it put there
 * (over shm nobody else would refuse it). */
Test(transfer, a_batch_sent_again_does_not_reuse_a_replaced_descriptor)
{
    const size_t off = 72 * MIB, length = 64 * 1024;
    cr_assert_str_eq(peer_cmd(&peer, "reg %zu %zu", off, MIB), "OK");
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    test_pattern_fill(local, length, 45);
    ferry_request_t req = {.opcode = FERRY_OP_WRITE,
                           .local = local,
                           .target = segment,
                           .target_offset = peer.arena + off,
                           .length = length};
    for (int round = 0; round < 2; round++) {
        cr_assert_eq(ferry_batch_submit(batch, &req, 1), FERRY_OK);
        cr_assert_eq(ferry_batch_wait(batch, 30000), FERRY_OK);
    }
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu 45", off, length), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "unreg %zu", off), "OK");
    cr_assert_str_eq(peer_cmd(&peer, "fill %zu %zu 46", off, length), "OK");
    ferry_status_t status = ferry_batch_submit(batch, &req, 1);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, 30000);
    cr_assert_neq(status, FERRY_OK, "a write to an unregistered buffer");
    cr_assert_str_eq(peer_cmd(&peer, "check %zu %zu 46", off, length), "OK",
                     "the unregistered buffer was written");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
}

/* The state letter of /proc/self/task/TID/stat or /proc/PID/task/TID/stat
 * ('S' sleeping, 'T' stopped, ...), with wchan (where it sleeps) when asked;
 * 0 when the task is gone. */
static char task_state(const char *task_dir, char *wchan, size_t wchan_size)
{
    char path[128], text[512];
    snprintf(path, sizeof(path), "%s/stat", task_dir);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    size_t n = fread(text, 1, sizeof(text) - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *paren = strrchr(text, ')'); /* the name may hold spaces */
    if (paren == NULL || paren[1] != ' ')
        return 0;
    if (wchan != NULL) {
        snprintf(path, sizeof(path), "%s/wchan", task_dir);
        wchan[0] = '\0';
        if ((f = fopen(path, "r")) != NULL) {
            wchan[fread(wchan, 1, wchan_size - 1, f)] = '\0';
            fclose(f);
        }
    }
    return paren[2];
}

/* Every thread of the peer has stopped (SIGSTOP lands asynchronously, and
 * one thread still running could answer a write). */
static int peer_all_stopped(pid_t pid)
{
    char dir[64], task[320];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
    DIR *tasks = opendir(dir);
    cr_assert_not_null(tasks);
    int all = 1;
    for (struct dirent *e; (e = readdir(tasks)) != NULL && all;) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(task, sizeof(task), "%s/%s", dir, e->d_name);
        char state = task_state(task, NULL, 0);
        all = state == 'T' || state == 't' || state == 0;
    }
    closedir(tasks);
    return all;
}

typedef struct waiter {
    ferry_batch_h batch;
    atomic_int tid;
    atomic_int returned;
    ferry_status_t status;
} waiter_t;

static void *wait_in_thread(void *arg)
{
    waiter_t *w = arg;
    atomic_store(&w->tid, (int)syscall(SYS_gettid));
    w->status = ferry_batch_wait(w->batch, 60000);
    atomic_store(&w->returned, 1);
    return NULL;
}

/* The waiter sleeps in the kernel on a futex: in ferry_batch_wait, past its
 * spin, on the batch's pending word (nothing else there sleeps). */
static int waiter_asleep(const waiter_t *w)
{
    char task[64], wchan[128];
    snprintf(task, sizeof(task), "/proc/self/task/%d", atomic_load(&w->tid));
    if (atomic_load(&w->tid) == 0 || task_state(task, wchan, sizeof(wchan)) != 'S')
        return 0;
    /* where the kernel hides wchan it reads "0" */
    return strstr(wchan, "futex") != NULL || strcmp(wchan, "0") == 0;
}

/* Poll cond(w) every millisecond for up to seconds. */
static int within(double seconds, int (*cond)(const waiter_t *), const waiter_t *w)
{
    for (double start = test_now(); !cond(w); usleep(1000))
        if (test_now() - start > seconds)
            return 0;
    return 1;
}

static int waiter_returned(const waiter_t *w)
{
    return atomic_load(&w->returned);
}

static int waiter_asleep_or_returned(const waiter_t *w)
{
    return waiter_returned(w) || waiter_asleep(w);
}

/* ferry_batch_wait returns when its batch completes, not at its time limit,
 * the waiter woken by the last completion: one small write, then four, each
 * waited for (60 s limit) by a thread that is asleep in the wait before the
 * peer, stopped meanwhile, may answer.  Without the peer's answer nothing
 * completes over tcp, so the wake-up is what is tested, every time, not a
 * race (a waiter woken one request early sleeps again and is never woken:
 * mutant batch-wakes-one-early).  shm completes in submit: the waiter
 * returns without sleeping. */
Test(transfer, wait_returns_when_the_batch_completes)
{
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 4, &batch), FERRY_OK);
    test_pattern_fill(local, 4 * 4096, 47);
    ferry_request_t reqs[4];
    for (int i = 0; i < 4; i++)
        reqs[i] = (ferry_request_t){.opcode = FERRY_OP_WRITE,
                                    .local = local + i * 4096,
                                    .target = segment,
                                    .target_offset = peer.arena + i * 4096,
                                    .length = 4096};
    cr_assert_eq(transfer(FERRY_OP_WRITE, local, peer.arena, 1), FERRY_OK); /* connected */
    for (size_t n = 1; n <= 4; n += 3) {
        peer_kill(&peer, SIGSTOP);
        for (double start = test_now(); !peer_all_stopped(peer.pid); usleep(1000))
            cr_assert_lt(test_now() - start, 10.0, "the peer did not stop");
        cr_assert_eq(ferry_batch_submit(batch, reqs, n), FERRY_OK);
        waiter_t w = {.batch = batch};
        pthread_t thread;
        cr_assert_eq(pthread_create(&thread, NULL, wait_in_thread, &w), 0);
        cr_assert(within(10.0, waiter_asleep_or_returned, &w),
                  "the waiter neither slept nor returned");
        int slept = !waiter_returned(&w);
        peer_kill(&peer, SIGCONT);
        cr_assert(within(10.0, waiter_returned, &w),
                  "the wait for %zu write(s) was not woken when they completed", n);
        pthread_join(thread, NULL);
        cr_assert_eq(w.status, FERRY_OK);
        if (strcmp(TRANSFER_TRANSPORT, "tcp") == 0)
            cr_assert(slept, "over tcp the waiter returned before the stopped peer answered");
    }
    cr_assert_str_eq(peer_cmd(&peer, "check 0 %d 47", 4 * 4096), "OK");
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
}
