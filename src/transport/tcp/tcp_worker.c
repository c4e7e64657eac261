/*
 * tcp I/O threads: a fixed number per transport instance, each an epoll
 * loop over the sockets placed on it, a task queue other threads post to
 * (woken by an eventfd) and a timer tick for the connections' deadlines.
 *
 * Events are level-triggered: a handler that stops early (its budget spent,
 * the socket would block) is called again while there is work, so no
 * socket starves the others and none is forgotten.  A handler frees its
 * own object only from its own event, a task or the tick, never while
 * another event of the same epoll_wait could still point at it.
 */
#include "tcp.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define EVENTS_PER_WAIT 64
/* The timers' resolution: deadlines are TIMEOUT-sized (seconds). */
#define TICK_MS 50

static _Thread_local ferry_tcp_worker_t *current_worker;

ferry_tcp_worker_t *ferry_tcp_worker_self(void)
{
    return current_worker;
}

unsigned ferry_tcp_auto_threads(void)
{
    cpu_set_t set;
    long cpus = 0;
    if (sched_getaffinity(0, sizeof(set), &set) == 0)
        cpus = CPU_COUNT(&set);
    if (cpus <= 0)
        cpus = sysconf(_SC_NPROCESSORS_ONLN);
    /* Two at least: a connection's sending and another's receiving overlap
     * even on a small machine (measured, doc/performance.md). */
    long threads = cpus / 2;
    return (unsigned)FERRY_MAX(2, FERRY_MIN(threads, (long)FERRY_TCP_AUTO_THREADS_MAX));
}

int ferry_tcp_worker_watch(ferry_tcp_worker_t *worker, int op, int fd, uint32_t events,
                           ferry_tcp_handler_t *handler)
{
    struct epoll_event ev = {.events = events, .data.ptr = handler};
    if (epoll_ctl(worker->epfd, op, fd, &ev) == 0)
        return 0;
    ferry_error("tcp: epoll_ctl: %s", strerror(errno));
    return -1;
}

void ferry_tcp_worker_post(ferry_tcp_worker_t *worker, ferry_tcp_task_t *task)
{
    task->next = NULL;
    task->done = 0;
    pthread_mutex_lock(&worker->lock);
    int was_empty = worker->tasks_head == NULL;
    if (worker->tasks_tail != NULL)
        worker->tasks_tail->next = task;
    else
        worker->tasks_head = task;
    worker->tasks_tail = task;
    pthread_mutex_unlock(&worker->lock);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t rc = write(worker->wake_fd, &one, sizeof(one)); /* full: a wake-up is pending */
        (void)rc;
    }
}

void ferry_tcp_worker_call(ferry_tcp_worker_t *worker, void (*fn)(void *), void *arg)
{
    if (current_worker == worker || !worker->started) {
        fn(arg);
        return;
    }
    ferry_tcp_task_t task = {.run = fn, .arg = arg, .waited = 1};
    ferry_tcp_worker_post(worker, &task);
    pthread_mutex_lock(&worker->lock);
    while (!task.done)
        pthread_cond_wait(&worker->done, &worker->lock);
    pthread_mutex_unlock(&worker->lock);
}

static void run_tasks(ferry_tcp_worker_t *worker)
{
    pthread_mutex_lock(&worker->lock);
    ferry_tcp_task_t *task = worker->tasks_head;
    worker->tasks_head = worker->tasks_tail = NULL;
    pthread_mutex_unlock(&worker->lock);
    while (task != NULL) {
        ferry_tcp_task_t *next = task->next;
        int waited = task->waited;
        task->run(task->arg);
        /* A posted task may be gone once it ran (a connection it closed);
         * a caller waiting in ferry_tcp_worker_call owns its task until done. */
        if (!waited) {
            task = next;
            continue;
        }
        pthread_mutex_lock(&worker->lock);
        task->done = 1;
        pthread_cond_broadcast(&worker->done);
        pthread_mutex_unlock(&worker->lock);
        task = next;
    }
}

static void wake_event(ferry_tcp_handler_t *handler, uint32_t events)
{
    (void)events;
    ferry_tcp_worker_t *worker = (ferry_tcp_worker_t *)((char *)handler -
                                                        offsetof(ferry_tcp_worker_t, wake_handler));
    uint64_t count;
    ssize_t rc = read(worker->wake_fd, &count, sizeof(count));
    (void)rc;
}

static void *worker_main(void *arg)
{
    ferry_tcp_worker_t *worker = arg;
    current_worker = worker;
    struct epoll_event events[EVENTS_PER_WAIT];
    for (;;) {
        /* Without connections nothing has a deadline: sleep until a task. */
        int timeout = worker->conns != NULL || worker->targets != NULL ? TICK_MS : -1;
        int n = epoll_wait(worker->epfd, events, EVENTS_PER_WAIT, timeout);
        if (n < 0 && errno != EINTR) {
            ferry_error("tcp: epoll_wait: %s", strerror(errno));
            n = 0;
        }
        for (int i = 0; i < n; i++) {
            ferry_tcp_handler_t *handler = events[i].data.ptr;
            handler->on_event(handler, events[i].events);
        }
        run_tasks(worker);
        uint64_t now = ferry_time_ms();
        if (now >= worker->next_tick_ms) {
            worker->next_tick_ms = now + TICK_MS;
            ferry_tcp_target_tick(worker, now);
            ferry_tcp_conn_tick(worker, now);
        }
        pthread_mutex_lock(&worker->lock);
        int exiting = worker->exiting && worker->tasks_head == NULL;
        pthread_mutex_unlock(&worker->lock);
        if (exiting)
            break;
    }
    current_worker = NULL;
    return NULL;
}

static ferry_status_t worker_init(ferry_tcp_t *tcp, ferry_tcp_worker_t *worker, unsigned index)
{
    worker->tcp = tcp;
    worker->index = index;
    worker->wake_handler.on_event = wake_event;
    pthread_mutex_init(&worker->lock, NULL);
    pthread_cond_init(&worker->done, NULL);
    worker->epfd = epoll_create1(EPOLL_CLOEXEC);
    worker->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    worker->scratch = malloc(FERRY_TCP_SCRATCH);
    if (worker->epfd < 0 || worker->wake_fd < 0) {
        ferry_error("tcp: cannot create an epoll set: %s", strerror(errno));
        return FERRY_ERR_NO_RESOURCE;
    }
    if (worker->scratch == NULL)
        return FERRY_ERR_NO_MEMORY;
    if (ferry_tcp_worker_watch(worker, EPOLL_CTL_ADD, worker->wake_fd, EPOLLIN,
                               &worker->wake_handler) != 0)
        return FERRY_ERR_NO_RESOURCE;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, FERRY_TCP_WORKER_STACK);
    int rc = pthread_create(&worker->thread, &attr, worker_main, worker);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        ferry_error("tcp: cannot start an I/O thread: %s", strerror(rc));
        return FERRY_ERR_NO_RESOURCE;
    }
    worker->started = 1;
    return FERRY_OK;
}

ferry_status_t ferry_tcp_workers_start(ferry_tcp_t *tcp)
{
    tcp->workers = calloc(tcp->n_workers, sizeof(*tcp->workers));
    if (tcp->workers == NULL)
        return FERRY_ERR_NO_MEMORY;
    for (unsigned i = 0; i < tcp->n_workers; i++)
        tcp->workers[i].epfd = tcp->workers[i].wake_fd = -1;
    for (unsigned i = 0; i < tcp->n_workers; i++) {
        ferry_status_t status = worker_init(tcp, &tcp->workers[i], i);
        if (status != FERRY_OK)
            return status; /* ferry_tcp_workers_stop and _free undo what was done */
    }
    return FERRY_OK;
}

void ferry_tcp_workers_stop(ferry_tcp_t *tcp)
{
    for (unsigned i = 0; tcp->workers != NULL && i < tcp->n_workers; i++) {
        ferry_tcp_worker_t *worker = &tcp->workers[i];
        if (!worker->started)
            continue;
        pthread_mutex_lock(&worker->lock);
        worker->exiting = 1;
        pthread_mutex_unlock(&worker->lock);
        uint64_t one = 1;
        ssize_t rc = write(worker->wake_fd, &one, sizeof(one));
        (void)rc;
        pthread_join(worker->thread, NULL);
        worker->started = 0;
    }
}

void ferry_tcp_workers_free(ferry_tcp_t *tcp)
{
    for (unsigned i = 0; tcp->workers != NULL && i < tcp->n_workers; i++) {
        ferry_tcp_worker_t *worker = &tcp->workers[i];
        if (worker->epfd >= 0)
            close(worker->epfd);
        if (worker->wake_fd >= 0)
            close(worker->wake_fd);
        free(worker->scratch);
        pthread_cond_destroy(&worker->done);
        pthread_mutex_destroy(&worker->lock);
    }
    free(tcp->workers);
    tcp->workers = NULL;
}

ferry_tcp_worker_t *ferry_tcp_worker_next(ferry_tcp_t *tcp)
{
    return &tcp->workers[atomic_fetch_add(&tcp->next_worker, 1) % tcp->n_workers];
}

/* Wait for fd to be ready for `events`; FERRY_ERR_TIMEOUT once timeout_ms
 * passed since `since`. */
static ferry_status_t sync_wait(int fd, short events, uint64_t since, unsigned timeout_ms)
{
    int wait = -1;
    if (timeout_ms != 0) {
        uint64_t now = ferry_time_ms();
        if (now - since >= timeout_ms)
            return FERRY_ERR_TIMEOUT;
        wait = (int)(since + timeout_ms - now);
    }
    struct pollfd pfd = {.fd = fd, .events = events};
    if (poll(&pfd, 1, wait) < 0 && errno != EINTR)
        return FERRY_ERR_IO;
    return FERRY_OK;
}

ferry_status_t ferry_tcp_sync_send(int fd, const void *buf, size_t len, unsigned timeout_ms)
{
    const char *p = buf;
    uint64_t since = ferry_time_ms();
    while (len > 0) {
        ssize_t sent = send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent > 0) {
            p += sent;
            len -= (size_t)sent;
            since = ferry_time_ms();
            continue;
        }
        if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return FERRY_ERR_PEER_FAILED;
        ferry_status_t status = sync_wait(fd, POLLOUT, since, timeout_ms);
        if (status != FERRY_OK)
            return status;
    }
    return FERRY_OK;
}

ferry_status_t ferry_tcp_sync_recv(int fd, void *buf, size_t len, unsigned timeout_ms)
{
    char *p = buf;
    uint64_t since = ferry_time_ms();
    while (len > 0) {
        ssize_t got = recv(fd, p, len, MSG_DONTWAIT);
        if (got > 0) {
            p += got;
            len -= (size_t)got;
            since = ferry_time_ms();
            continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return FERRY_ERR_PEER_FAILED;
        ferry_status_t status = sync_wait(fd, POLLIN, since, timeout_ms);
        if (status != FERRY_OK)
            return status;
    }
    return FERRY_OK;
}
