/*
 * The threads engine: FERRY_FILE_THREADS threads take ops from one queue
 * and do each with preadv2/pwritev2 to its last byte (short transfers go
 * on, EINTR and EAGAIN are retried).  Used where io_uring is missing or
 * refused, or when FERRY_FILE_ENGINE=threads.
 *
 * What an I/O costs here beside its system call is its hand-offs between
 * threads (a wake-up is tens of microseconds on a loaded VM), so:
 * - start first tries each page-cache op on the submitting thread with
 *   RWF_NOWAIT: the kernel does it only if it need not wait (a copy from
 *   or to cached pages), else says EAGAIN and the op is queued.  Submit
 *   never waits for the device.
 * - a thread that runs out of work looks for more, yielding its core
 *   between looks (one thread at a time, so it costs at most one core),
 *   until no op was queued for FERRY_FILE_SPIN_US: the next request of a
 *   steady stream is taken without a wake-up, and a stream whose gaps
 *   are longer than the spin (callers each doing their own direct I/O)
 *   does not send it to sleep and wake it again for every op.
 * - that thread leaves a lone op queued less than FRESH_US ago: its
 *   submitter is most likely about to wait for it, and then does it
 *   itself (progress, below), as a psync job would; taken by a pool
 *   thread, the op costs the submitter a sleep and a wake-up instead.
 * - sleeping threads wait on one futex word: start wakes, once per chain
 *   of ops, only as many as the spinning thread does not cover.
 * - a thread takes its share of a long queue at once (one lock for many).
 * - the waiting thread (progress) does a queued op itself, so that an op
 *   that no pool thread has taken yet (its wake-up is late) costs neither
 *   that wake-up nor the waiter's.
 *
 * lock guards head and tail.  queued, spinning, sleepers and seq are
 * atomics read without it; only the sleep protocol depends on them (no
 * lost wake-up): a thread that will sleep reads seq, counts itself in
 * sleepers, then reads queued; start adds to queued, then reads sleepers
 * and bumps seq before waking (all sequentially consistent), so either
 * the sleeper sees the op or start sees the sleeper and changes seq.
 * stop sets stopping and wakes everyone; the threads empty the queue, then
 * leave, and stop joins them.
 */
#include "file.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/uio.h>

/* Inline (RWF_NOWAIT) attempts and the waiter's ops are this small at
 * most: more would hold the submitting or waiting thread too long. */
#define INLINE_MAX ((size_t)256 << 10)
/* An op queued this recently is left to its submitter's wait by the
 * spinning thread (worth_taking). */
#define FRESH_US 20

typedef struct pool {
    ferry_file_t *file;
    pthread_mutex_t lock;
    ferry_file_op_t *head, **tail;
    atomic_uint queued;   /* ops in the queue */
    atomic_uint spinning; /* 0 or 1: the thread looking for work awake */
    atomic_uint sleepers; /* threads in (or going into) the futex wait */
    atomic_uint seq;      /* the futex word: changes when there is work */
    atomic_int stopping;
    atomic_uint_fast64_t last_start_us; /* when start last queued an op */
    unsigned spin_us;
    unsigned n_threads;
    pthread_t *threads;
} pool_t;

static ssize_t do_io(ferry_file_op_t *op, int flags)
{
    struct iovec iov = {.iov_base = op->buffer, .iov_len = op->left};
    return op->write ? pwritev2(op->fd, &iov, 1, (off_t)op->offset, op->rw_flags | flags)
                     : preadv2(op->fd, &iov, 1, (off_t)op->offset, flags);
}

static void do_op(ferry_file_t *file, ferry_file_op_t *op)
{
    ferry_status_t status;
    do {
        ssize_t n = do_io(op, 0);
        status = ferry_file_op_advance(op, n < 0 ? -(long)errno : (long)n);
    } while (status == FERRY_INPROGRESS);
    ferry_file_op_finish(file, op, status);
}

/* The first max ops of the queue (linked by next), or NULL. */
static ferry_file_op_t *take(pool_t *pool, unsigned max)
{
    pthread_mutex_lock(&pool->lock);
    ferry_file_op_t *first = pool->head, *last = NULL;
    unsigned n = 0;
    for (ferry_file_op_t *op = first; op != NULL && n < max; op = op->next, n++)
        last = op;
    if (last != NULL) {
        pool->head = last->next;
        if (pool->head == NULL)
            pool->tail = &pool->head;
        last->next = NULL;
        atomic_fetch_sub(&pool->queued, n);
    }
    pthread_mutex_unlock(&pool->lock);
    return first;
}

/* This thread's share of the queue: all of it split among the threads. */
static ferry_file_op_t *take_share(pool_t *pool)
{
    unsigned queued = atomic_load(&pool->queued);
    if (queued == 0)
        return NULL;
    return take(pool, 1 + (queued - 1) / pool->n_threads);
}

/* Microseconds from then to now; 0 when another thread's clock read
 * (then) came after ours (now). */
static uint64_t since(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

/* Whether the spinning thread should take the queue's ops now: not while
 * the only one is fresh, which its submitter will most likely do itself in
 * ferry_batch_wait (progress) a few microseconds from now. */
static int worth_taking(pool_t *pool, uint64_t now)
{
    unsigned queued = atomic_load_explicit(&pool->queued, memory_order_relaxed);
    if (queued == 0)
        return 0;
    return queued > 1 ||
           since(now, atomic_load_explicit(&pool->last_start_us, memory_order_relaxed)) >= FRESH_US;
}

/* Look for work awake, if no other thread does, until no op came for
 * spin_us; NULL when none came (or stopping). */
static ferry_file_op_t *spin_for_work(pool_t *pool)
{
    unsigned expected = 0;
    if (pool->spin_us == 0 || !atomic_compare_exchange_strong(&pool->spinning, &expected, 1))
        return NULL;
    ferry_file_op_t *ops = NULL;
    uint64_t last = ferry_time_us();
    while (!atomic_load_explicit(&pool->stopping, memory_order_relaxed)) {
        uint64_t now = ferry_time_us();
        if (worth_taking(pool, now) && (ops = take_share(pool)) != NULL)
            break;
        uint64_t started = atomic_load_explicit(&pool->last_start_us, memory_order_relaxed);
        if (started > last)
            last = started; /* a steady stream keeps one thread looking */
        if (since(now, last) >= pool->spin_us) {
            ops = take_share(pool); /* not asleep with an op queued */
            break;
        }
        /* not a pause: with fewer cores than busy threads (a VM), the
         * core is better given to whoever has work, such as a thread whose
         * I/O completed, or the submitter */
        sched_yield();
    }
    atomic_store(&pool->spinning, 0);
    return ops;
}

/* Sleep until start changes seq (or stop); the queue may still be empty
 * after (another thread was first). */
static void sleep_for_work(pool_t *pool)
{
    unsigned seq = atomic_load(&pool->seq);
    atomic_fetch_add(&pool->sleepers, 1);
    if (atomic_load(&pool->queued) == 0 && !atomic_load(&pool->stopping))
        ferry_futex_wait(&pool->seq, seq, NULL);
    atomic_fetch_sub(&pool->sleepers, 1);
}

static void *pool_thread(void *arg)
{
    pool_t *pool = arg;
    for (;;) {
        ferry_file_op_t *ops = take_share(pool);
        if (ops == NULL) {
            if (atomic_load(&pool->stopping))
                break; /* and nothing left */
            ops = spin_for_work(pool);
            if (ops == NULL)
                sleep_for_work(pool);
        }
        for (ferry_file_op_t *op = ops, *next; op != NULL; op = next) {
            next = op->next;
            op->next = NULL;
            do_op(pool->file, op);
        }
    }
    return NULL;
}

/* Wake the sleepers that n new ops need, beyond the spinning thread. */
static void wake_for(pool_t *pool, unsigned n)
{
    unsigned sleepers = atomic_load(&pool->sleepers);
    if (sleepers == 0)
        return;
    unsigned cover = atomic_load(&pool->spinning);
    if (n <= cover)
        return;
    atomic_fetch_add(&pool->seq, 1);
    ferry_futex_wake(&pool->seq, (int)FERRY_MIN(n - cover, sleepers));
}

static void pool_stop(void *engine)
{
    pool_t *pool = engine;
    atomic_store(&pool->stopping, 1);
    atomic_fetch_add(&pool->seq, 1);
    ferry_futex_wake(&pool->seq, INT_MAX);
    for (unsigned i = 0; i < pool->n_threads; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->lock);
    free(pool->threads);
    free(pool);
}

static ferry_status_t pool_create(ferry_file_t *file, void **engine_p)
{
    pool_t *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return FERRY_ERR_NO_MEMORY;
    pool->file = file;
    pool->tail = &pool->head;
    pool->spin_us = file->settings.spin_us;
    pthread_mutex_init(&pool->lock, NULL);
    pool->threads = calloc(file->settings.threads, sizeof(*pool->threads));
    if (pool->threads == NULL) {
        pool_stop(pool);
        return FERRY_ERR_NO_MEMORY;
    }
    for (; pool->n_threads < file->settings.threads; pool->n_threads++) {
        if (pthread_create(&pool->threads[pool->n_threads], NULL, pool_thread, pool) != 0) {
            ferry_error("file: cannot start I/O thread %u", pool->n_threads);
            pool_stop(pool);
            return FERRY_ERR_NO_RESOURCE;
        }
    }
    *engine_p = pool;
    return FERRY_OK;
}

/* Do op here if the kernel can without waiting (page cache); 1 when it
 * finished.  Whatever the kernel would wait for, or refuses (RWF_NOWAIT
 * unsupported, an error), is left to a pool thread, which does it again
 * without RWF_NOWAIT and reports any error. */
static int try_inline(ferry_file_t *file, ferry_file_op_t *op)
{
    int kind = op->write ? FERRY_FILE_NOWAIT_WRITE : FERRY_FILE_NOWAIT_READ;
    if (op->fd != op->target->fd || op->left > INLINE_MAX || op->rw_flags != 0 ||
        (atomic_load_explicit(&op->target->nowait_refused, memory_order_relaxed) & kind))
        return 0;
    for (;;) {
        ssize_t n = do_io(op, RWF_NOWAIT);
        if (n < 0 && errno == EOPNOTSUPP)
            atomic_fetch_or(&op->target->nowait_refused, kind);
        if (n <= 0)
            return 0;
        if (ferry_file_op_advance(op, (long)n) != FERRY_INPROGRESS)
            break; /* done (an overrun is FERRY_ERR_IO: finished too) */
    }
    ferry_file_op_finish(file, op, op->left == 0 ? FERRY_OK : FERRY_ERR_IO);
    return 1;
}

static void pool_start(void *engine, ferry_file_op_t *ops)
{
    pool_t *pool = engine;
    ferry_file_op_t *first = NULL, **link = &first, *last = NULL;
    unsigned n = 0;
    for (ferry_file_op_t *op = ops, *next; op != NULL; op = next) {
        next = op->next;
        op->next = NULL;
        if (try_inline(pool->file, op))
            continue;
        *link = op;
        link = &op->next;
        last = op;
        n++;
    }
    if (n == 0)
        return;
    atomic_store_explicit(&pool->last_start_us, ferry_time_us(), memory_order_relaxed);
    pthread_mutex_lock(&pool->lock);
    *pool->tail = first;
    pool->tail = &last->next;
    atomic_fetch_add(&pool->queued, n);
    pthread_mutex_unlock(&pool->lock);
    wake_for(pool, n);
}

/* A waiting thread (ferry_batch_wait's spin) does the next queued op
 * itself, as a synchronous engine would: the op is done without waking a
 * pool thread, and its completion is seen without a wake-up of the
 * waiter.  Only a small one (a waiter with a timeout must not be held by
 * a gigabyte's I/O); a pool thread does the others. */
static unsigned pool_progress(void *engine)
{
    pool_t *pool = engine;
    if (atomic_load_explicit(&pool->queued, memory_order_relaxed) == 0 ||
        pthread_mutex_trylock(&pool->lock) != 0)
        return 0;
    ferry_file_op_t *op = pool->head;
    if (op != NULL && op->left <= INLINE_MAX) {
        pool->head = op->next;
        if (pool->head == NULL)
            pool->tail = &pool->head;
        op->next = NULL;
        atomic_fetch_sub(&pool->queued, 1);
    } else {
        op = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    if (op == NULL)
        return 0;
    do_op(pool->file, op);
    return 1;
}

const ferry_file_engine_ops_t ferry_file_pool_ops = {
    .name = "threads",
    .create = pool_create,
    .start = pool_start,
    .stop = pool_stop,
    .progress = pool_progress,
};
