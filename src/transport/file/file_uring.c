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
 */
#include <config.h>

#include "file.h"

#ifdef HAVE_LIBURING

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>

/* io_uring lengths are 32-bit: a longer op goes in pieces, as a short
 * transfer would. */
#define PIECE_MAX ((size_t)1 << 30)

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
} uring_t;

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
    (void)atomic_load_explicit(&u->submitted, memory_order_acquire);
    io_uring_for_each_cqe(&u->ring, head, cqe)
    {
        ferry_file_op_t *op = io_uring_cqe_get_data(cqe);
        int res = cqe->res;
        seen++;
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

static void *reaper(void *arg)
{
    uring_t *u = arg;
    for (int stop = 0; !stop;) {
        /* The kernel wakes us when the queue is not empty; what is there
         * is taken under reap_lock (a progressing thread may have been
         * first).  Not io_uring_wait_cqe: it reads the queue's head
         * without the lock. */
        int rc = io_uring_enter(u->ring.ring_fd, 0, 1, IORING_ENTER_GETEVENTS, NULL);
        /* liburing returns -errno where it makes the system call itself,
         * else -1 and errno */
        int err = rc == -1 ? errno : -rc;
        if (rc < 0 && err != EINTR && err != EAGAIN && err != EBUSY) {
            ferry_error("file: io_uring_enter: %s", strerror(err));
            break;
        }
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

static void uring_stop(void *engine)
{
    uring_t *u = engine;
    pthread_mutex_lock(&u->lock);
    atomic_store(&u->stopping, 1);
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
};

const ferry_file_engine_ops_t *const ferry_file_uring_ops = &uring_ops;

#else

const ferry_file_engine_ops_t *const ferry_file_uring_ops = NULL;

#endif
