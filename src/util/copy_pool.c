/*
 * Copy helpers: threads that take a share of a large same-host copy (ucx
 * into or out of a peer's attached memory, cxl into the window), so that a
 * copy uses the memory bandwidth of more than one core.  On this project's
 * 2-core VM one thread copies 64 KiB blocks of a 4 MiB window at about 13
 * GB/s and two at 23-27 GB/s; 4 MiB blocks 5.8 and 11.3 GB/s.
 *
 * A copy of at least FERRY_COPY_PARALLEL_MIN bytes (one ferry_copy_many
 * call) becomes a job: its bytes are claimed CHUNK at a time, the caller's
 * from the front and the helpers' from the back, so a helper that is not
 * running (the core is busy elsewhere) takes nothing and the caller copies
 * the rest itself; the caller only ever waits for chunks a helper has
 * started.  From both ends, because a job is usually the same copy again
 * (a benchmark's window, a buffer sent each step): each core copies about
 * the same part each time and keeps its lines in its own cache; chunks
 * taken in turn from one counter moved the lines between the cores every
 * job (4 MiB jobs, one thread 27-38 GB/s, two in turn 17-29, two from the
 * ends 28-52: doc/performance.md, "OSU put at 64 KiB").  A helper sleeps
 * on the pool's condition variable between jobs: one that polled would
 * run as much as a busy thread sharing its core and be preempted holding a
 * chunk as often (0.79-0.83x of one thread at 64 KiB next to an MPI rank
 * spinning).
 *
 * One job at a time: a caller that finds the slot taken copies alone.  The
 * helpers are process-wide, like FERRY_COPY_NT_MIN: the first engine starts
 * them with its settings, the last one destroyed joins them.
 *
 * Lifetime of a job (it lives on the caller's stack): a helper counts
 * itself inside before it loads the job pointer, and the caller clears the
 * pointer before it waits for nobody to be inside, so a helper either sees
 * no job or is waited for.
 *
 * Where helpers run: never on the caller's CPU, where a helper only takes
 * turns with the caller (and makes it wait for its chunk).  The caller that
 * owns the job slot keeps the helpers' affinity to the CPUs the process
 * may use less its own, set again only when it finds itself on another
 * CPU (a system call per helper then, none per job); the scheduler woke a
 * helper on the caller's CPU for most jobs before (21 of 22 jobs in one
 * OSU run), and the helper had to preempt the caller to move itself off.
 * A caller that waits long for a helper's chunk lets it anywhere again.
 */
#include "util.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHUNK               (128 * 1024)
#define INLINE_ITEMS        64
#define STALL_US            200
#define RELEASE_US          50

typedef struct copy_job {
    const ferry_copy_item_t *items;
    const size_t *ends;       /* ends[i]: the job offset just past item i */
    const unsigned char *nt;  /* nt[i]: item i goes with non-temporal stores */
    size_t count, total;
    /* Chunks not claimed yet: [front, back), front in the low 32 bits
     * (the caller's next), back in the high 32 (one past the helpers' next). */
    _Atomic uint64_t unclaimed;
    atomic_size_t done;       /* bytes copied */
} copy_job_t;

static struct {
    pthread_mutex_t life;     /* start and stop, held across the join */
    pthread_mutex_t lock;     /* sleeping helpers, started */
    pthread_cond_t wake;
    pthread_cond_t ready;     /* signalled as each helper first goes to sleep */
    unsigned started;         /* lock: helpers that reached their first sleep */
    unsigned users;           /* life: engines that started the helpers */
    unsigned n_threads;       /* life */
    pthread_t threads[FERRY_COPY_MAX_THREADS];
    atomic_int tids[FERRY_COPY_MAX_THREADS]; /* each helper's thread id (0: not yet) */
    cpu_set_t allowed;        /* life: the CPUs the process had when the helpers started */
    int kept_off;             /* busy owner: the CPU the helpers are kept off (-1: none) */
    atomic_uint running;      /* helpers there are (0: every copy is the caller's) */
    atomic_size_t parallel_min;
    atomic_int stop;
    atomic_int busy;          /* a caller owns the job slot */
    unsigned skip, backoff;   /* busy owner: jobs to copy alone after a stall; the next count */
    copy_job_t *_Atomic job;
    atomic_uint inside;       /* helpers that may be looking at job */
    atomic_uint_fast64_t posted;
    atomic_uint sleepers;
    atomic_uint_fast64_t helped; /* bytes the helpers copied, ever */
} pool = {.kept_off = -1,
          .life = PTHREAD_MUTEX_INITIALIZER,
          .lock = PTHREAD_MUTEX_INITIALIZER,
          .ready = PTHREAD_COND_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

/* Copy [offset, offset + n) of the job, which may span items. */
static void job_copy(const copy_job_t *job, size_t offset, size_t n)
{
    size_t lo = 0, hi = job->count - 1;
    while (lo < hi) { /* the first item that ends past offset */
        size_t mid = lo + (hi - lo) / 2;
        if (job->ends[mid] > offset)
            hi = mid;
        else
            lo = mid + 1;
    }
    for (size_t i = lo; n > 0 && i < job->count; i++) {
        size_t start = job->ends[i] - job->items[i].length;
        size_t piece = FERRY_MIN(n, job->ends[i] - offset);
        if (piece == 0)
            continue;
        const ferry_copy_item_t *item = &job->items[i];
        unsigned char *dst = (unsigned char *)item->dst + (offset - start);
        const unsigned char *src = (const unsigned char *)item->src + (offset - start);
        if (item->to_peer)
            ferry_copy_piece(dst, src, piece, job->nt[i]);
        else
            memcpy(dst, src, piece);
        offset += piece;
        n -= piece;
    }
}

/* The next chunk from the front (the caller) or the back (a helper); 0
 * when none is left. */
static int job_claim(copy_job_t *job, int from_back, size_t *chunk_p)
{
    uint64_t word = atomic_load_explicit(&job->unclaimed, memory_order_relaxed);
    for (;;) {
        uint64_t front = word & UINT32_MAX, back = word >> 32;
        if (front >= back)
            return 0;
        uint64_t claimed = from_back ? (back - 1) << 32 | front : back << 32 | (front + 1);
        if (atomic_compare_exchange_weak_explicit(&job->unclaimed, &word, claimed,
                                                  memory_order_relaxed, memory_order_relaxed)) {
            *chunk_p = from_back ? back - 1 : front;
            return 1;
        }
    }
}

/* Returns the bytes this thread copied. */
static size_t job_work(copy_job_t *job, int from_back)
{
    size_t mine = 0, chunk;
    while (job_claim(job, from_back, &chunk)) {
        size_t offset = chunk * CHUNK;
        size_t n = FERRY_MIN((size_t)CHUNK, job->total - offset);
        job_copy(job, offset, n);
        mine += n;
        /* release: the caller that sees every byte done sees them copied */
        atomic_fetch_add_explicit(&job->done, n, memory_order_release);
    }
    return mine;
}

static void *helper_main(void *arg)
{
    atomic_int *tid = arg;
    atomic_store(tid, (int)syscall(SYS_gettid));
    int ready = 0;
    uint64_t seen = atomic_load(&pool.posted);
    while (!atomic_load_explicit(&pool.stop, memory_order_relaxed)) {
        uint64_t posted = atomic_load(&pool.posted);
        if (posted != seen) {
            seen = posted;
            atomic_fetch_add(&pool.inside, 1);
            copy_job_t *job = atomic_load(&pool.job);
            if (job != NULL)
                atomic_fetch_add_explicit(&pool.helped, job_work(job, 1), memory_order_relaxed);
            atomic_fetch_sub(&pool.inside, 1);
            continue;
        }
        pthread_mutex_lock(&pool.lock);
        if (!ready) {
            ready = 1;
            pool.started++;
            pthread_cond_broadcast(&pool.ready);
        }
        atomic_fetch_add(&pool.sleepers, 1);
        while (atomic_load(&pool.posted) == seen && !atomic_load(&pool.stop))
            pthread_cond_wait(&pool.wake, &pool.lock);
        atomic_fetch_sub(&pool.sleepers, 1);
        pthread_mutex_unlock(&pool.lock);
    }
    return NULL;
}

static void copy_serial(const ferry_copy_item_t *items, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        if (items[i].to_peer)
            ferry_copy_to_peer(items[i].dst, items[i].src, items[i].length);
        else
            memcpy(items[i].dst, items[i].src, items[i].length);
    }
}

/* Busy owner: the helpers' affinity excludes the CPU we run on (see the
 * top).  Where that leaves them no CPU, or a call fails, they stay as
 * they are; the next job tries again. */
static void keep_helpers_off_caller_cpu(void)
{
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu == pool.kept_off || cpu >= CPU_SETSIZE)
        return;
    cpu_set_t others = pool.allowed;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0)
        return;
    for (unsigned i = 0; i < FERRY_COPY_MAX_THREADS; i++) {
        pid_t tid = atomic_load_explicit(&pool.tids[i], memory_order_relaxed);
        if (tid != 0 && sched_setaffinity(tid, sizeof(others), &others) != 0)
            return;
    }
    pool.kept_off = cpu;
}

/* Busy owner: the helpers may run on every CPU again (until the next job). */
static void let_helpers_anywhere(void)
{
    for (unsigned i = 0; i < FERRY_COPY_MAX_THREADS; i++) {
        pid_t tid = atomic_load_explicit(&pool.tids[i], memory_order_relaxed);
        if (tid != 0)
            sched_setaffinity(tid, sizeof(pool.allowed), &pool.allowed);
    }
    pool.kept_off = -1;
}

void ferry_copy_many(const ferry_copy_item_t *items, size_t count)
{
    /* A run that writes one destination again and again (a buffer
     * rewritten in a loop, as ucx_perftest does) stays with the caller:
     * two threads storing to the same lines only pass them back and forth
     * (64 KiB blocks: 42 GB/s alone, 19 shared). */
    size_t total = 0;
    int rewrites = 0;
    for (size_t i = 0; i < count; i++) {
        total += items[i].length;
        rewrites |= i > 0 && items[i].dst == items[i - 1].dst;
    }
    /* acquire: a pool seen running is seen with what its start set (allowed) */
    if (count == 0 || rewrites || atomic_load_explicit(&pool.running, memory_order_acquire) == 0 ||
        total < atomic_load_explicit(&pool.parallel_min, memory_order_relaxed) ||
        (total + CHUNK - 1) / CHUNK > UINT32_MAX || atomic_exchange(&pool.busy, 1) != 0) {
        copy_serial(items, count);
        return;
    }
    if (pool.skip > 0) { /* helpers made us wait lately */
        pool.skip--;
        atomic_store(&pool.busy, 0);
        copy_serial(items, count);
        return;
    }
    size_t inline_ends[INLINE_ITEMS];
    unsigned char inline_nt[INLINE_ITEMS];
    size_t *ends = inline_ends;
    unsigned char *nt = inline_nt;
    if (count > INLINE_ITEMS) {
        ends = malloc(count * sizeof(*ends));
        nt = malloc(count);
        if (ends == NULL || nt == NULL) {
            free(ends);
            free(nt);
            atomic_store(&pool.busy, 0);
            copy_serial(items, count);
            return;
        }
    }
    for (size_t i = 0, end = 0; i < count; i++) {
        end += items[i].length;
        ends[i] = end;
        nt[i] = items[i].to_peer && ferry_copy_nt_wanted(items[i].dst, items[i].length);
    }
    keep_helpers_off_caller_cpu();
    copy_job_t job = {.items = items, .ends = ends, .nt = nt, .count = count, .total = total};
    atomic_init(&job.unclaimed, (uint64_t)((total + CHUNK - 1) / CHUNK) << 32);
    atomic_init(&job.done, 0);
    atomic_store(&pool.job, &job);
    atomic_fetch_add(&pool.posted, 1);
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.lock);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
    }
    uint64_t start = ferry_time_us();
    job_work(&job, 0);
    uint64_t own = ferry_time_us();
    /* What is left is chunks helpers started.  A helper still at it after
     * RELEASE_US (a chunk takes a few) was preempted on the CPU we keep it
     * on: it may come to ours, where our yield lets it finish. */
    for (unsigned spins = 0, released = 0;
         atomic_load_explicit(&job.done, memory_order_acquire) < total; spins++) {
        if (spins < 64) {
            ferry_cpu_relax();
            continue;
        }
        if (!released && ferry_time_us() - own > RELEASE_US) {
            let_helpers_anywhere();
            released = 1;
        }
        sched_yield();
    }
    /* A helper that shares its core with a busy thread (another rank
     * spinning in MPI) can be preempted holding a chunk, and we wait for
     * its next time slice, milliseconds: after a wait of over STALL_US and
     * a quarter of our own copying, copy alone for the next 4, 8, ... 256
     * large copies, then try again.  (A short wait, a helper that started
     * late or was woken on our core, is no reason.) */
    uint64_t waited = ferry_time_us() - own;
    if (waited > STALL_US && waited * 4 > own - start) {
        pool.backoff = pool.backoff == 0 ? 4 : FERRY_MIN(pool.backoff * 2, 256u);
        pool.skip = pool.backoff;
    } else {
        pool.backoff /= 2;
    }
    atomic_store(&pool.job, NULL);
    while (atomic_load(&pool.inside) > 0)
        ferry_cpu_relax();
    atomic_store(&pool.busy, 0);
    if (ends != inline_ends) {
        free(ends);
        free(nt);
    }
}

uint64_t ferry_copy_helped_bytes(void)
{
    return atomic_load_explicit(&pool.helped, memory_order_relaxed);
}

ferry_status_t ferry_copy_threads_parse(const char *text, unsigned *threads_p)
{
    if (text == NULL || strcmp(text, "auto") == 0 || *text == '\0') {
        /* One helper where this process may run on a second CPU: not in
         * a rank bound to one core. */
        cpu_set_t cpus;
        *threads_p = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) >= 2;
        return FERRY_OK;
    }
    char *end;
    errno = 0;
    unsigned long n = strtoul(text, &end, 10);
    if (errno != 0 || *end != '\0' || n > FERRY_COPY_MAX_THREADS || *text == '-') {
        ferry_error("FERRY_COPY_THREADS=%s is not auto or a count of 0..%d", text,
                    FERRY_COPY_MAX_THREADS);
        return FERRY_ERR_INVALID_PARAM;
    }
    *threads_p = (unsigned)n;
    return FERRY_OK;
}

/* A forked child has none of the parent's helpers: it starts from zero. */
static void pool_after_fork(void)
{
    pthread_mutex_init(&pool.life, NULL);
    pthread_mutex_init(&pool.lock, NULL);
    pthread_cond_init(&pool.wake, NULL);
    pthread_cond_init(&pool.ready, NULL);
    pool.users = pool.n_threads = pool.started = 0;
    atomic_store(&pool.running, 0);
    atomic_store(&pool.stop, 0);
    atomic_store(&pool.busy, 0);
    pool.skip = pool.backoff = 0;
    pool.kept_off = -1;
    for (unsigned i = 0; i < FERRY_COPY_MAX_THREADS; i++)
        atomic_store(&pool.tids[i], 0);
    atomic_store(&pool.job, NULL);
    atomic_store(&pool.inside, 0);
    atomic_store(&pool.sleepers, 0);
}

static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void register_atfork(void)
{
    pthread_atfork(NULL, NULL, pool_after_fork);
}

/* Start returns once its helpers got as far as their first sleep (a
 * second at most): the first large copy finds them there, and a process
 * that forks right after never copies a thread that was still starting
 * inside some library's locks (AddressSanitizer's allocator in a forked
 * test child stayed locked for good that way). */
static void wait_until_started(void)
{
    struct timespec deadline;
    ferry_deadline_after_ms(&deadline, CLOCK_REALTIME, 1000);
    pthread_mutex_lock(&pool.lock);
    while (pool.started < pool.n_threads &&
           pthread_cond_timedwait(&pool.ready, &pool.lock, &deadline) == 0)
        ;
    pthread_mutex_unlock(&pool.lock);
}

void ferry_copy_helpers_start(unsigned threads, size_t parallel_min)
{
    pthread_once(&atfork_once, register_atfork);
    pthread_mutex_lock(&pool.life);
    if (pool.users++ == 0) {
        atomic_store(&pool.stop, 0);
        atomic_store(&pool.parallel_min, parallel_min);
        if (sched_getaffinity(0, sizeof(pool.allowed), &pool.allowed) != 0)
            CPU_ZERO(&pool.allowed); /* then never kept off a CPU */
        for (unsigned i = 0; i < threads && i < FERRY_COPY_MAX_THREADS; i++) {
            int rc = pthread_create(&pool.threads[i], NULL, helper_main, &pool.tids[i]);
            if (rc != 0) {
                ferry_warn("copy helpers: %u of %u started: %s", i, threads, strerror(rc));
                break;
            }
            pool.n_threads++;
        }
        atomic_store(&pool.running, pool.n_threads);
        wait_until_started();
    }
    pthread_mutex_unlock(&pool.life);
}

void ferry_copy_helpers_stop(void)
{
    pthread_mutex_lock(&pool.life);
    if (pool.users > 0 && --pool.users == 0) {
        atomic_store(&pool.running, 0);
        pthread_mutex_lock(&pool.lock);
        atomic_store(&pool.stop, 1);
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.lock);
        for (unsigned i = 0; i < pool.n_threads; i++) {
            pthread_join(pool.threads[i], NULL);
            atomic_store(&pool.tids[i], 0);
        }
        pool.kept_off = -1;
        pool.n_threads = 0;
        pool.started = 0;
    }
    pthread_mutex_unlock(&pool.life);
}
