/*
 * The io_uring engine: one ring per transport, FERRY_FILE_QUEUE_DEPTH
 * entries (its completion queue twice that, so it never overflows), one
 * submit (one system call) per ferry_file_submit however many slices it
 * carries, and one reaper thread that finishes ops and continues short
 * ones from where they stopped.
 *
 * lock guards the submission queue (submitters and the reaper's
 * continuations share it), in_flight and stopping.  reap_lock guards the
 * completion queue: the reaper takes it after the kernel woke it, and a
 * thread that drives progress (ferry_batch_wait's spin) tries it, so that a
 * completion the kernel posted at once (a page-cache read) finishes on the
 * waiting thread, without a wake-up of the reaper and then of the waiter.
 * An op counts in in_flight from its first submission to its finish, so
 * that there is always a free submission entry for a continuation.  stop
 * waits for in_flight to reach 0, then sends a NOP with no op: whoever
 * reaps it sets `stopped`, on which the reaper leaves (progress no longer
 * reaps once stopping is set, so the reaper is the one).
 *
 * The seat (README.md, "Waiting in the ring"): a caller of ferry_batch_wait
 * whose round is all this transport's blocks in the ring itself
 * (io_uring_enter with GETEVENTS), as fio's thread does, instead of on its
 * batch's futex behind the reaper.  One thread at a time sits: it holds
 * reap_lock from before its first look at done() until it leaves, so no
 * other thread takes a completion it waits for between that look and its
 * sleep in the kernel (which only sees completions not yet taken); it
 * finishes every completion it takes, other batches' too.  `seat` is odd
 * while someone sits and counts the sittings.  A caller that finds reap_lock
 * taken sleeps its own way (w->sleep), counted in `sleepers`.  The reaper
 * naps (a futex, NAP_US at most) while the seat is taken or was taken since
 * its last look and nobody sleeps beside it: in the ring beside a sitter it
 * would wake for every completion.  So an op nobody waits for in the ring
 * is reaped at the latest NAP_US after the last sitter left (or at once by a
 * progress call).  With sleepers it stays in the ring (behind reap_lock while
 * someone sits: the sitter reaps and their batches' futexes wake them);
 * the sitter that leaves and the sleeper that arrives wake a napping
 * reaper (each looks at the other's word after writing its own).  Ops ended
 * outside the ring (file_gpu.c) kick the sitter with a NOP.
 */
#include <config.h>

#include "file.h"

#ifdef HAVE_LIBURING

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* io_uring lengths are 32-bit: a longer op goes in pieces, as a short
 * transfer would. */
#define PIECE_MAX ((size_t)1 << 30)
/* The reaper's nap while callers sit in the ring: what it adds at most to
 * an op nobody waits for after the last sitter left; and it wakes this often
 * while callers keep sitting (1,000 times a second: 0.01 per I/O at 100k). */
#define NAP_US 1000
/* A sitter looks at done() at least this often: a request of its batch
 * finished without an event in the ring (a submit to the same batch from
 * another thread, to another transport, after the wait chose this one). */
#define SIT_RECHECK_MS 100

/* user_data of kick's NOPs (stop's have NULL) */
static char kick_tag;

typedef struct uring {
    ferry_file_t *file;
    struct io_uring ring;
    pthread_mutex_t lock;
    pthread_cond_t space;
    unsigned in_flight, depth;
    atomic_int stopping;
    /* Counts ops handed to the kernel (release) and is read (acquire)
     * before their completions are taken: the order the kernel gives
     * between a submit and its completion, made visible to
     * ThreadSanitizer, which does not see through the rings. */
    atomic_uint_fast64_t submitted;
    pthread_mutex_t reap_lock;
    int stopped;             /* reap_lock: the NOP of stop was reaped */
    pthread_t reaper;
    /* The seat (above): odd while a caller sits; sleepers beside it; nap is
     * the reaper's futex word, 1 while it naps. */
    atomic_uint seat;
    atomic_uint sleepers;
    atomic_uint nap;
    int ext_arg;             /* the kernel takes a timeout with GETEVENTS */
} uring_t;

static void wake_reaper(uring_t *u)
{
    if (atomic_exchange(&u->nap, 0) == 1)
        ferry_futex_wake(&u->nap, 1);
}

/* Queue op's next piece; caller holds lock, and in_flight leaves room. */
static void prepare(uring_t *u, ferry_file_op_t *op)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    unsigned length = (unsigned)FERRY_MIN(op->left, PIECE_MAX);
    if (op->write) {
        io_uring_prep_write(sqe, op->fd, op->buffer, length, op->offset);
        sqe->rw_flags = op->rw_flags;
    } else {
        io_uring_prep_read(sqe, op->fd, op->buffer, length, op->offset);
    }
    io_uring_sqe_set_data(sqe, op);
}

static void submit_locked(uring_t *u)
{
    int n;
    do
        n = io_uring_submit(&u->ring);
    while (n == -EINTR || n == -EAGAIN);
    if (n < 0)
        ferry_error("file: io_uring_submit: %s", strerror(-n));
}

static void uring_start(void *engine, ferry_file_op_t *ops)
{
    uring_t *u = engine;
    pthread_mutex_lock(&u->lock);
    for (ferry_file_op_t *op = ops, *next; op != NULL; op = next) {
        next = op->next;
        op->next = NULL;
        while (u->in_flight >= u->depth) {
            submit_locked(u); /* what is queued goes before we wait */
            wake_reaper(u);   /* room comes from reaping: not after a nap */
            pthread_cond_wait(&u->space, &u->lock);
        }
        u->in_flight++;
        prepare(u, op);
        atomic_fetch_add_explicit(&u->submitted, 1, memory_order_release);
    }
    submit_locked(u);
    pthread_mutex_unlock(&u->lock);
}

/* One completion: continue the op, or finish it (returns 1). */
static int complete(uring_t *u, ferry_file_op_t *op, int res)
{
    ferry_status_t status = ferry_file_op_advance(op, res);
    if (status == FERRY_INPROGRESS) {
        pthread_mutex_lock(&u->lock);
        prepare(u, op);
        submit_locked(u);
        pthread_mutex_unlock(&u->lock);
        return 0;
    }
    ferry_file_op_finish(u->file, op, status);
    return 1;
}

/* stop's NOP, reaped by a progressing thread that got in before stopping
 * showed: another one, so that the reaper (waiting in the kernel) sees one. */
static void stop_again(uring_t *u)
{
    pthread_mutex_lock(&u->lock);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    submit_locked(u);
    pthread_mutex_unlock(&u->lock);
}

/* Finish what the completion queue holds; caller holds reap_lock.
 * Returns how many completions it took. */
static unsigned reap_locked(uring_t *u, int is_reaper)
{
    struct io_uring_cqe *cqe;
    unsigned finished = 0, seen = 0, head;
    io_uring_for_each_cqe(&u->ring, head, cqe)
    {
        /* after the completion was seen (its submit's add is then
         * visible), not before the loop: a sitter or progress call may
         * look at the queue before the submitter added */
        (void)atomic_load_explicit(&u->submitted, memory_order_acquire);
        ferry_file_op_t *op = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        seen++;
        if (op == (void *)&kick_tag)
            continue;
        if (op == NULL) {
            if (is_reaper)
                u->stopped = 1;
            else
                stop_again(u);
            continue;
        }
        finished += (unsigned)complete(u, op, res);
    }
    io_uring_cq_advance(&u->ring, seen);
    if (finished > 0) {
        pthread_mutex_lock(&u->lock);
        u->in_flight -= finished;
        pthread_cond_broadcast(&u->space);
        pthread_mutex_unlock(&u->lock);
    }
    return seen;
}

/* Whether the reaper keeps out of the ring: callers sit or sat since its
 * last look, and nobody relies on it. */
static int should_nap(uring_t *u, unsigned *seen)
{
    if (atomic_load(&u->stopping) || atomic_load(&u->sleepers) > 0)
        return 0;
    unsigned seat = atomic_load(&u->seat);
    int sat = (seat & 1) || seat != *seen;
    *seen = seat;
    return sat;
}

static void nap(uring_t *u)
{
    struct timespec deadline;
    ferry_deadline_after_us(&deadline, CLOCK_MONOTONIC, NAP_US);
    atomic_store(&u->nap, 1);
    /* after announcing the nap: a sleeper or stop that came first is seen */
    if (!atomic_load(&u->stopping) && atomic_load(&u->sleepers) == 0)
        ferry_futex_wait(&u->nap, 1, &deadline);
    atomic_store(&u->nap, 0);
}

static void *reaper(void *arg)
{
    uring_t *u = arg;
    unsigned seen = 0;
    for (int stop = 0; !stop;) {
        if (should_nap(u, &seen)) {
            nap(u);
            continue;
        }
        /* The kernel wakes us when the queue is not empty; what is there
         * is taken under reap_lock (a progressing or sitting thread may
         * have been first).  Not io_uring_wait_cqe: it reads the queue's
         * head without the lock. */
        int rc = io_uring_enter(u->ring.ring_fd, 0, 1, IORING_ENTER_GETEVENTS, NULL);
        /* liburing returns -errno where it makes the system call itself,
         * else -1 and errno */
        int err = rc == -1 ? errno : -rc;
        if (rc < 0 && err != EINTR && err != EAGAIN && err != EBUSY) {
            ferry_error("file: io_uring_enter: %s", strerror(err));
            break;
        }
        /* a sitter takes what came, and holds reap_lock until it leaves */
        if ((atomic_load(&u->seat) & 1) && atomic_load(&u->sleepers) == 0 &&
            !atomic_load(&u->stopping))
            continue;
        pthread_mutex_lock(&u->reap_lock);
        reap_locked(u, 1);
        stop = u->stopped;
        pthread_mutex_unlock(&u->reap_lock);
    }
    return NULL;
}

static unsigned uring_progress(void *engine)
{
    uring_t *u = engine;
    /* the queue's head is the reaper's too: looked at under reap_lock */
    if (atomic_load_explicit(&u->stopping, memory_order_relaxed) ||
        pthread_mutex_trylock(&u->reap_lock) != 0)
        return 0;
    unsigned n = io_uring_cq_ready(&u->ring) > 0 ? reap_locked(u, 0) : 0;
    pthread_mutex_unlock(&u->reap_lock);
    return n;
}

/* The caller sleeps its own way, the reaper in the ring for it. */
static ferry_status_t sleep_beside(uring_t *u, const ferry_wait_t *w)
{
    atomic_fetch_add(&u->sleepers, 1);
    if (!(atomic_load(&u->seat) & 1)) /* else the sitter wakes it when it leaves */
        wake_reaper(u);
    ferry_status_t status = w->sleep(w->arg, w->deadline);
    atomic_fetch_sub(&u->sleepers, 1);
    return status;
}

/* How long the sitter's next sleep in the kernel may last: 0 when the
 * deadline has passed. */
static long long sit_ns(const ferry_wait_t *w)
{
    long long ns = (long long)SIT_RECHECK_MS * 1000000;
    if (w->deadline != NULL) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        long long left = (long long)(w->deadline->tv_sec - now.tv_sec) * 1000000000 +
                         (w->deadline->tv_nsec - now.tv_nsec);
        ns = left < ns ? left : ns;
    }
    return ns > 0 ? ns : 0;
}

/* Sit in the ring (caller holds reap_lock and the seat) until done, the
 * deadline (FERRY_ERR_TIMEOUT) or a reason to leave (FERRY_ERR_BUSY). */
static ferry_status_t sit(uring_t *u, const ferry_wait_t *w)
{
    for (;;) {
        if (io_uring_cq_ready(&u->ring) > 0)
            reap_locked(u, 0);
        if (w->done(w->arg))
            return FERRY_OK;
        if (atomic_load_explicit(&u->stopping, memory_order_relaxed))
            return FERRY_ERR_BUSY;
        long long ns = sit_ns(w);
        if (ns == 0)
            return FERRY_ERR_TIMEOUT;
        struct __kernel_timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
        struct io_uring_getevents_arg arg = {.ts = (uint64_t)(uintptr_t)&ts};
        int rc = io_uring_enter2(u->ring.ring_fd, 0, 1,
                                 IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
                                 (sigset_t *)&arg, sizeof(arg));
        int err = rc == -1 ? errno : -rc;
        if (rc < 0 && err != EINTR && err != EAGAIN && err != EBUSY && err != ETIME) {
            ferry_error("file: io_uring_enter (waiting in the ring): %s", strerror(err));
            return FERRY_ERR_BUSY;
        }
    }
}

static ferry_status_t uring_wait(void *engine, const ferry_wait_t *w)
{
    uring_t *u = engine;
    if (!u->ext_arg || atomic_load(&u->stopping) || pthread_mutex_trylock(&u->reap_lock) != 0)
        return sleep_beside(u, w);
    atomic_fetch_add(&u->seat, 1);
    /* the seat before done(): a kick (uring_kick) sees one or the other */
    atomic_thread_fence(memory_order_seq_cst);
    ferry_status_t status = sit(u, w);
    atomic_fetch_add(&u->seat, 1);
    pthread_mutex_unlock(&u->reap_lock);
    if (atomic_load(&u->sleepers) > 0)
        wake_reaper(u);
    return status == FERRY_ERR_BUSY ? sleep_beside(u, w) : status;
}

static void uring_kick(void *engine)
{
    uring_t *u = engine;
    /* the op's end (slice_done) before the seat: see uring_wait */
    atomic_thread_fence(memory_order_seq_cst);
    if (!(atomic_load(&u->seat) & 1))
        return;
    pthread_mutex_lock(&u->lock);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    if (sqe != NULL) { /* else the sitter looks again within SIT_RECHECK_MS */
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data(sqe, &kick_tag);
        submit_locked(u);
    }
    pthread_mutex_unlock(&u->lock);
}

static void uring_stop(void *engine)
{
    uring_t *u = engine;
    pthread_mutex_lock(&u->lock);
    atomic_store(&u->stopping, 1);
    wake_reaper(u); /* it reaps what is in flight, then stop's NOP */
    while (u->in_flight > 0)
        pthread_cond_wait(&u->space, &u->lock);
    struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    submit_locked(u);
    pthread_mutex_unlock(&u->lock);
    pthread_join(u->reaper, NULL);
    io_uring_queue_exit(&u->ring);
    pthread_cond_destroy(&u->space);
    pthread_mutex_destroy(&u->lock);
    pthread_mutex_destroy(&u->reap_lock);
    free(u);
}

static ferry_status_t uring_create(ferry_file_t *file, void **engine_p)
{
    uring_t *u = calloc(1, sizeof(*u));
    if (u == NULL)
        return FERRY_ERR_NO_MEMORY;
    u->file = file;
    /* one entry more than the ops in flight: the NOP that stops the reaper */
    u->depth = file->settings.queue_depth;
    struct io_uring_params params;
    memset(&params, 0, sizeof(params));
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = 2 * (u->depth + 1);
    int rc = io_uring_queue_init_params(u->depth + 1, &u->ring, &params);
    if (rc < 0) {
        ferry_info("file: io_uring_queue_init(%u): %s", u->depth + 1, strerror(-rc));
        free(u);
        return FERRY_ERR_UNSUPPORTED;
    }
    u->ext_arg = (params.features & IORING_FEAT_EXT_ARG) != 0;
    pthread_mutex_init(&u->lock, NULL);
    pthread_mutex_init(&u->reap_lock, NULL);
    pthread_cond_init(&u->space, NULL);
    if (pthread_create(&u->reaper, NULL, reaper, u) != 0) {
        ferry_error("file: cannot start the io_uring reaper thread");
        io_uring_queue_exit(&u->ring);
        pthread_cond_destroy(&u->space);
        pthread_mutex_destroy(&u->lock);
        pthread_mutex_destroy(&u->reap_lock);
        free(u);
        return FERRY_ERR_NO_RESOURCE;
    }
    *engine_p = u;
    return FERRY_OK;
}

static const ferry_file_engine_ops_t uring_ops = {
    .name = "uring",
    .create = uring_create,
    .start = uring_start,
    .stop = uring_stop,
    .progress = uring_progress,
    .wait = uring_wait,
    .kick = uring_kick,
};

const ferry_file_engine_ops_t *const ferry_file_uring_ops = &uring_ops;

#else

const ferry_file_engine_ops_t *const ferry_file_uring_ops = NULL;

#endif
