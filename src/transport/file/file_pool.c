/*
 * The threads engine: FERRY_FILE_THREADS threads take ops from one queue
 * and do each with preadv2/pwritev2 to its last byte (short transfers go
 * on, EINTR and EAGAIN are retried).  Used where io_uring is missing or
 * refused, or when FERRY_FILE_ENGINE=threads.  lock guards the queue and
 * stopping; stop lets the threads empty the queue, then joins them.
 */
#include "file.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/uio.h>

typedef struct pool {
    ferry_file_t *file;
    pthread_mutex_t lock;
    pthread_cond_t work;
    ferry_file_op_t *head, **tail;
    int stopping;
    unsigned n_threads;
    pthread_t *threads;
} pool_t;

static void do_op(ferry_file_t *file, ferry_file_op_t *op)
{
    ferry_status_t status;
    do {
        struct iovec iov = {.iov_base = op->buffer, .iov_len = op->left};
        ssize_t n = op->write ? pwritev2(op->fd, &iov, 1, (off_t)op->offset, op->rw_flags)
                              : preadv2(op->fd, &iov, 1, (off_t)op->offset, 0);
        status = ferry_file_op_advance(op, n < 0 ? -(long)errno : (long)n);
    } while (status == FERRY_INPROGRESS);
    ferry_file_op_finish(file, op, status);
}

static void *pool_thread(void *arg)
{
    pool_t *pool = arg;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (pool->head == NULL && !pool->stopping)
            pthread_cond_wait(&pool->work, &pool->lock);
        ferry_file_op_t *op = pool->head;
        if (op == NULL)
            break; /* stopping, and nothing left */
        pool->head = op->next;
        if (pool->head == NULL)
            pool->tail = &pool->head;
        pthread_mutex_unlock(&pool->lock);
        op->next = NULL;
        do_op(pool->file, op);
        pthread_mutex_lock(&pool->lock);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

static void pool_stop(void *engine)
{
    pool_t *pool = engine;
    pthread_mutex_lock(&pool->lock);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i < pool->n_threads; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->work);
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
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->work, NULL);
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

static void pool_start(void *engine, ferry_file_op_t *ops)
{
    pool_t *pool = engine;
    ferry_file_op_t *last = ops;
    size_t n = 1;
    for (; last->next != NULL; last = last->next)
        n++;
    pthread_mutex_lock(&pool->lock);
    *pool->tail = ops;
    pool->tail = &last->next;
    if (n == 1)
        pthread_cond_signal(&pool->work);
    else
        pthread_cond_broadcast(&pool->work);
    pthread_mutex_unlock(&pool->lock);
}

/* A waiting thread (ferry_batch_wait's spin) does the next queued op
 * itself, as a synchronous engine would, instead of waking a pool thread
 * and then being woken by it. */
static unsigned pool_progress(void *engine)
{
    pool_t *pool = engine;
    if (pthread_mutex_trylock(&pool->lock) != 0)
        return 0;
    ferry_file_op_t *op = pool->head;
    if (op != NULL) {
        pool->head = op->next;
        if (pool->head == NULL)
            pool->tail = &pool->head;
    }
    pthread_mutex_unlock(&pool->lock);
    if (op == NULL)
        return 0;
    op->next = NULL;
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
