/*
 * ucx context and workers: configuration, the ucp context, one worker per
 * FERRY_UCX_WORKERS, each with its own progress thread.
 *
 * Progress model (FERRY_UCX_PROGRESS; ucx_backends/README.md has the measurements).
 * ferry_batch_wait drives the transport's progress op for FERRY_WAIT_SPIN
 * microseconds, then sleeps on a condition variable, so whatever is still
 * pending then must be completed by a thread of ours.
 * Callers post puts/gets and the flush behind them themselves (workers are
 * UCS_THREAD_MODE_MULTI), so whatever UCX finishes inline (CMA copies,
 * shared-memory puts) completes in the caller's thread without any handoff.
 * The progress thread:
 *   hybrid (default): polls while events keep coming and for SPIN
 *     microseconds after the last one (a submit counts), then arms the
 *     worker and sleeps on its event fd.  Latency-bound loops stay in the
 *     polling window; an idle engine costs no CPU; on a 2-core host two
 *     engines do not starve each other.  While a caller polls the worker
 *     (ferry_batch_wait's spin, ferry_engine_progress) the thread naps,
 *     longer each time, until the caller goes to sleep (progress_leave),
 *     and while a caller posts to it (submit) the thread is parked until
 *     the posting ends: a second user would only contend for the worker
 *     and for a core.
 *   wait: arms and sleeps whenever a progress call found nothing.
 *   poll: never sleeps (one core per worker; for dedicated cores only).
 * Sleeping threads wake for the next deadline sweep (TIMEOUT/4) while
 * requests are outstanding, else every 100 ms.
 */
#include "ucx.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* Resource names ("self/memory0 tcp/eth0 ...") of a context, malloc-ed. */
static char *context_resources(ucp_context_h context)
{
    char *text = NULL, *out = NULL;
    size_t size = 0, used = 0, cap = 0;
    FILE *stream = open_memstream(&text, &size);
    if (stream == NULL)
        return NULL;
    ucp_context_print_info(context, stream);
    fclose(stream);
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        const char *tail = strstr(line, "-- ");
        if (strstr(line, "resource") == NULL || tail == NULL)
            continue;
        tail += 3;
        size_t len = strcspn(tail, " \t");
        if (used + len + 2 > cap) {
            cap = (used + len + 2) * 2;
            char *grown = realloc(out, cap);
            if (grown == NULL)
                break;
            out = grown;
        }
        if (used)
            out[used++] = ' ';
        memcpy(out + used, tail, len);
        used += len;
        out[used] = '\0';
    }
    free(text);
    return out ? out : strdup("");
}

/*
 * UCX defaults the plugin changes, each only where the user set none of the
 * variables named and the context has a transport the key applies to.  A
 * key that no transport of the context reads makes UCX warn at every
 * worker's creation (and a tcp key with UCX_TLS=sm,self fails the worker's
 * interfaces), so the context is made again without it.
 *
 * MM_ERROR_HANDLING=y: UCX 1.13 (Debian) leaves posix and sysv shared
 * memory out of endpoints with peer error handling, and such an endpoint
 * silently falls back to TCP over loopback (about 50x slower).  Every
 * endpoint of ours uses peer error handling.  The uct tables share the MM_
 * prefix, the one key ucp_config_modify reaches both through.
 *
 * TX_SEG_SIZE=64K (tcp's UCX_TCP_TX_SEG_SIZE; ucp_config_modify matches the
 * key inside the transport's table, without its prefix): UCX's tcp lane
 * sends an active message in pieces of this size, each a system call that
 * over loopback also runs the receiver's TCP stack, and the 8 KiB default
 * cuts a 64 KiB write into eight (9 sendto per 64 KiB eager write -> 2;
 * 64 KiB writes 1.1 -> 2.2-2.5 GB/s, 1 MiB 1.2 -> 3.1-3.3 over loopback:
 * doc/performance.md).  A buffer of that size is taken per endpoint only
 * while a send is in progress; it stays within the default receive
 * segment, which the user's UCX_TCP_RX_SEG_SIZE may shrink, so either
 * variable set leaves both alone.
 *
 * USE_MT_MUTEX=y: our workers are UCS_THREAD_MODE_MULTI (callers post
 * while a progress thread progresses).  With UCX's default spinlock a
 * thread preempted inside UCX (two engines on two cores, or any
 * oversubscribed host) makes every other one spin for its whole time
 * slice: measured 2.8 ms per 4 KiB write instead of 75 us.  A mutex sleeps
 * instead.  The ucp layer reads it, whatever the transports ("").
 */
typedef struct changed_default {
    const char *key, *value;
    const char *variable;      /* the user's name of what changes, for ferry_info */
    const char *transports[3]; /* resource prefixes that read the key ("": any) */
    const char *user_keys[4];  /* any of these set: the user chose */
    const char *failure;       /* what is lost when UCX refuses it */
} changed_default_t;

static const changed_default_t changed_defaults[] = {
    {"USE_MT_MUTEX",
     "y",
     "UCX_USE_MT_MUTEX",
     {""},
     {"UCX_USE_MT_MUTEX"},
     "a thread preempted inside UCX makes the others spin"},
    {"MM_ERROR_HANDLING",
     "y",
     "UCX_POSIX/SYSV_ERROR_HANDLING",
     {"posix/", "sysv/", "xpmem/"},
     {"UCX_POSIX_ERROR_HANDLING", "UCX_SYSV_ERROR_HANDLING", "UCX_MM_ERROR_HANDLING",
      "UCX_XPMEM_ERROR_HANDLING"},
     "same-host peers may fall back to TCP"},
    {"TX_SEG_SIZE",
     "64K",
     "UCX_TCP_TX_SEG_SIZE",
     {"tcp/"},
     {"UCX_TCP_TX_SEG_SIZE", "UCX_TCP_RX_SEG_SIZE"},
     "large writes over tcp take more system calls"},
};

static int user_chose(const changed_default_t *d)
{
    for (size_t i = 0; i < FERRY_UCX_ARRAY_SIZE(d->user_keys); i++)
        if (d->user_keys[i] != NULL && getenv(d->user_keys[i]) != NULL)
            return 1;
    return 0;
}

/* The changed defaults (bit i: changed_defaults[i]) whose variables the
 * user left unset. */
static unsigned defaults_left_to_us(void)
{
    unsigned mask = 0;
    for (size_t i = 0; i < FERRY_UCX_ARRAY_SIZE(changed_defaults); i++)
        if (!user_chose(&changed_defaults[i]))
            mask |= 1u << i;
    return mask;
}

/* The changed defaults a transport of these resources ("self/memory0
 * tcp/lo ...") reads. */
static unsigned defaults_read_by(const char *resources)
{
    unsigned mask = 0;
    for (size_t i = 0; i < FERRY_UCX_ARRAY_SIZE(changed_defaults); i++)
        for (size_t t = 0; t < FERRY_UCX_ARRAY_SIZE(changed_defaults[i].transports); t++) {
            const char *transport = changed_defaults[i].transports[t];
            if (transport != NULL && resources != NULL && strstr(resources, transport) != NULL)
                mask |= 1u << i;
        }
    return mask;
}

static ferry_status_t config_read(unsigned defaults, ucp_config_t **config_p)
{
    ucp_config_t *config;
    ucs_status_t status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        ferry_error("ucx: cannot read the UCX_* configuration: %s", ucs_status_string(status));
        return FERRY_ERR_INVALID_PARAM;
    }
    for (size_t i = 0; i < FERRY_UCX_ARRAY_SIZE(changed_defaults); i++) {
        const changed_default_t *d = &changed_defaults[i];
        if (!(defaults & (1u << i)))
            continue;
        status = ucp_config_modify(config, d->key, d->value);
        if (status != UCS_OK)
            ferry_warn("ucx: cannot set %s=%s (%s); %s", d->key, d->value,
                       ucs_status_string(status), d->failure);
    }
    *config_p = config;
    return FERRY_OK;
}

static ferry_status_t context_init(unsigned defaults, unsigned workers, ucp_context_h *context_p)
{
    ucp_config_t *config;
    ferry_status_t result = config_read(defaults, &config);
    if (result != FERRY_OK)
        return result;
    ucp_params_t params = {
        .field_mask =
            UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_NAME,
        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = workers > 1,
        .name = "ferry",
    };
    ucs_status_t status = ucp_init(&params, config, context_p);
    ucp_config_release(config);
    if (status != UCS_OK) {
        ferry_error("ucx: ucp_init failed: %s", ucs_status_string(status));
        return status == UCS_ERR_NO_DEVICE ? FERRY_ERR_NO_RESOURCE : FERRY_ERR_UNSUPPORTED;
    }
    return FERRY_OK;
}

/* A context with the changed defaults the user left to us and its
 * transports read (UCX reads keys at worker creation, so a context made
 * with all of them only to list its resources costs no warning). */
static ferry_status_t context_create(unsigned workers, ucp_context_h *context_p, char **resources_p)
{
    unsigned wanted = defaults_left_to_us();
    ferry_status_t status = context_init(wanted, workers, context_p);
    if (status != FERRY_OK)
        return status;
    char *resources = context_resources(*context_p);
    unsigned defaults = wanted & defaults_read_by(resources);
    if (defaults != wanted) {
        ucp_cleanup(*context_p);
        status = context_init(defaults, workers, context_p);
        if (status != FERRY_OK) {
            free(resources);
            return status;
        }
    }
    *resources_p = resources;
    return FERRY_OK;
}

/* ---------------- progress threads ---------------- */

unsigned ferry_ucx_progress(void *ctx)
{
    ferry_ucx_t *ucx = ctx;
    unsigned events = 0;
    /* A caller spinning on its own memory for a peer's write (a ping-pong)
     * while nothing of its own is in flight and every endpoint talks over
     * shared memory polls the worker on every FERRY_UCX_IDLE_POLL_EVERY-th
     * call only: a multi-threaded worker's progress takes its lock, and
     * while the caller is inside it the write it waits for goes unseen
     * (measured: the 8 B ping-pong's half round trip 0.221 -> 0.213 us
     * polling every 8th call, 0.220 -> 0.212 us every 64th instead of every
     * 8th, medians of 7).  A message meanwhile waits some 64 calls of a
     * few nanoseconds each.  With network endpoints every
     * call polls: there progress is what receives the write (skipping
     * measured 9.9 -> 10.6 us over tcp). */
    for (unsigned i = 0; i < ucx->n_workers; i++) {
        ferry_ucx_worker_t *w = &ucx->workers[i];
        /* The worker's thread sees the count move and sleeps while we
         * poll: one poller per worker, no lock contention, no core taken
         * from the peer's pollers.  (A lost update between two callers
         * still moves it; no clock read here.)  The count also picks the
         * idle turns: no thread-local counter, whose every access in a
         * loaded module is a call to __tls_get_addr. */
        uint64_t polls = atomic_load_explicit(&w->caller_polls, memory_order_relaxed) + 1;
        atomic_store_explicit(&w->caller_polls, polls, memory_order_relaxed);
        if (polls % FERRY_UCX_IDLE_POLL_EVERY == 0 ||
            atomic_load_explicit(&w->busy, memory_order_relaxed) > 0 ||
            atomic_load_explicit(&w->net_eps, memory_order_relaxed) > 0)
            events += ucp_worker_progress(w->worker);
    }
    return events;
}

/* Why the thread parks (w->parked): a caller posts to the worker (until
 * the posting ends), or callers poll it (until one leaves or the nap is
 * over).  Each waker signals only a thread parked for its reason: a
 * submit's posting_end signalling a napping thread woke it for nothing,
 * two system calls per submit (8 B tcp writes 12.6 -> 22 us). */
typedef enum park_reason { PARK_NONE, PARK_POSTING, PARK_CALLER_POLLS } park_reason_t;

static void unpark(ferry_ucx_worker_t *w)
{
    pthread_mutex_lock(&w->park_lock);
    pthread_cond_signal(&w->park_cond);
    pthread_mutex_unlock(&w->park_lock);
}

void ferry_ucx_posting_begin(ferry_ucx_worker_t *w)
{
    atomic_fetch_add(&w->posting, 1);
}

void ferry_ucx_posting_end(ferry_ucx_worker_t *w)
{
    /* Both sides are sequentially consistent: either the thread sees
     * posting at 0 before it waits, or we see it parked and signal under
     * its lock, which it holds until it waits. */
    if (atomic_fetch_sub(&w->posting, 1) == 1 && atomic_load(&w->parked) == PARK_POSTING)
        unpark(w);
}

void ferry_ucx_progress_leave(void *ctx)
{
    ferry_ucx_t *ucx = ctx;
    for (unsigned i = 0; i < ucx->n_workers; i++) {
        ferry_ucx_worker_t *w = &ucx->workers[i];
        atomic_store(&w->caller_left, 1); /* the same handshake as posting_end's */
        if (atomic_load(&w->parked) == PARK_CALLER_POLLS)
            unpark(w);
    }
}

static int park_over(ferry_ucx_worker_t *w, park_reason_t reason)
{
    return atomic_load(&w->stop) ||
           (reason == PARK_POSTING ? atomic_load(&w->posting) == 0 : atomic_load(&w->caller_left));
}

/* Wait on park_cond for the reason's end, at most timeout_us.  Returns
 * whether a polling caller left meanwhile (and forgets that it did).
 *
 * While a caller posts, a thread that polled, or napped and woke to look,
 * would take the poster's core on a small host: over tcp the caller's
 * inline sends are most of a large write's work (1 MiB writes: 14,000
 * context switches of the caller per 2 s with a napping thread, and
 * 2.2 -> 1.8 GB/s).  The bound (FERRY_UCX_PARK_MAX_MS) is for posters that
 * never stop: the others' completions must not wait on them.
 * While callers poll, every wakeup to look takes a core from a poller
 * (FERRY_UCX_NAP_MAX_US). */
static int park(ferry_ucx_worker_t *w, park_reason_t reason, uint64_t timeout_us)
{
    struct timespec until;
    ferry_deadline_after_us(&until, CLOCK_MONOTONIC, timeout_us);
    pthread_mutex_lock(&w->park_lock);
    atomic_store(&w->parked, (int)reason);
    int rc = 0;
    while (!park_over(w, reason) && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&w->park_cond, &w->park_lock, &until);
    atomic_store(&w->parked, PARK_NONE);
    int left = atomic_exchange(&w->caller_left, 0);
    pthread_mutex_unlock(&w->park_lock);
    return left;
}

static void *progress_main(void *arg)
{
    ferry_ucx_worker_t *w = arg;
    ferry_ucx_t *ucx = w->ucx;
    const ferry_ucx_progress_mode_t mode = ucx->progress_mode;
    const uint64_t spin_us = ucx->settings.spin_us;
    const unsigned timeout = ucx->settings.timeout_ms;
    const unsigned tick_ms = timeout ? FERRY_UCX_MAX(timeout / 4, 1u) : 1000u;
    uint64_t next_sweep = ferry_ucx_time_ms() + tick_ms;
    uint64_t polls_seen = atomic_load(&w->caller_polls);
    uint64_t nap_us = 0; /* the last nap while callers polled, 0 when they did not */

    while (!atomic_load_explicit(&w->stop, memory_order_relaxed)) {
        /* While a caller posts to the worker or polls it (ferry_batch_wait's
         * spin, ferry_engine_progress) this thread keeps off it: two users
         * of one worker only contend for its lock, and on a small host
         * they take the core the peer's poller needs. */
        if (mode != FERRY_UCX_PROGRESS_POLL &&
            atomic_load_explicit(&w->posting, memory_order_relaxed) > 0 &&
            park(w, PARK_POSTING, FERRY_UCX_PARK_MAX_MS * 1000u))
            polls_seen = atomic_load(&w->caller_polls); /* a caller left: look now */
        uint64_t polls = atomic_load_explicit(&w->caller_polls, memory_order_relaxed);
        int caller_polls = mode != FERRY_UCX_PROGRESS_POLL && polls != polls_seen;
        polls_seen = polls;
        unsigned events = caller_polls ? 0 : ucp_worker_progress(w->worker);
        uint64_t now_ms = ferry_ucx_time_ms();
        int sweep = now_ms >= next_sweep;
        if (sweep)
            next_sweep = now_ms + tick_ms;
        if (sweep || atomic_load_explicit(&w->close_pending, memory_order_relaxed))
            ferry_ucx_worker_housekeeping(w, sweep);
        if (events) {
            if (mode == FERRY_UCX_PROGRESS_HYBRID)
                atomic_store_explicit(&w->last_activity_us, ferry_ucx_time_us(),
                                      memory_order_relaxed);
            continue;
        }
        if (mode == FERRY_UCX_PROGRESS_POLL)
            continue;
        if (caller_polls) {
            /* Nap unarmed (the events the caller handles do not wake us),
             * longer each time the caller is still at it, and look again
             * when it leaves (ferry_ucx_progress_leave) or the nap is over.
             * Napping SPIN each time woke both of a ping-pong's threads
             * 20,000 times a second, each taking a poller's core. */
            nap_us = nap_us ? FERRY_UCX_MIN(nap_us * 2, FERRY_UCX_NAP_MAX_US)
                            : FERRY_UCX_MAX(spin_us, 1u);
            if (park(w, PARK_CALLER_POLLS, nap_us))
                polls_seen = atomic_load(&w->caller_polls);
            continue;
        }
        nap_us = 0;
        if (mode == FERRY_UCX_PROGRESS_HYBRID &&
            (atomic_load_explicit(&w->busy, memory_order_relaxed) > 0 ||
             ferry_ucx_since(atomic_load_explicit(&w->last_activity_us, memory_order_relaxed),
                             ferry_ucx_time_us()) < spin_us)) {
            /* Our requests in flight (or a peer's just now): keep polling,
             * but let any other runnable thread have this core first. */
            sched_yield();
            continue;
        }
        ucs_status_t status = ucp_worker_arm(w->worker);
        if (status == UCS_ERR_BUSY)
            continue; /* events arrived meanwhile */
        int wait_ms = (int)(next_sweep > now_ms ? next_sweep - now_ms : 0);
        if (atomic_load(&w->busy) == 0)
            wait_ms = 100; /* nothing to time out; bounds the cost of a missed wakeup */
        if (status != UCS_OK)
            wait_ms = 1; /* cannot arm: degrade to a slow poll rather than stall */
        struct pollfd pfd = {.fd = w->efd, .events = POLLIN};
        atomic_store(&w->sleeping, 1);
        poll(&pfd, 1, wait_ms);
        atomic_store(&w->sleeping, 0);
    }
    return NULL;
}

static ferry_status_t thread_start(ferry_ucx_worker_t *w)
{
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, FERRY_UCX_THREAD_STACK);
    int rc = pthread_create(&w->thread, &attr, progress_main, w);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        ferry_error("ucx: cannot start a progress thread: %s", strerror(rc));
        return FERRY_ERR_NO_RESOURCE;
    }
    w->thread_started = 1;
    return FERRY_OK;
}

/* ---------------- workers ---------------- */

/* What ferry_ucx_context_stop undoes for every counted worker. */
static void worker_init(ferry_ucx_t *ucx, ferry_ucx_worker_t *w, unsigned index)
{
    w->ucx = ucx;
    w->index = index;
    w->efd = -1;
    pthread_mutex_init(&w->lock, NULL);
    pthread_mutex_init(&w->park_lock, NULL);
    pthread_condattr_t cond_attr;
    pthread_condattr_init(&cond_attr);
    pthread_condattr_setclock(&cond_attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->park_cond, &cond_attr);
    pthread_condattr_destroy(&cond_attr);
    w->eager_tail = &w->eager;
    /* Acknowledgement ids start anywhere: a target's refusal ring keyed by
     * (endpoint, id) does not match a restarted initiator's first runs. */
    if (getrandom(&w->eager_ids, sizeof(w->eager_ids), GRND_NONBLOCK) != sizeof(w->eager_ids))
        w->eager_ids = (uint64_t)ferry_ucx_time_us() * 0x9e3779b97f4a7c15ull;
}

static ferry_status_t worker_create(ferry_ucx_t *ucx, ferry_ucx_worker_t *w, char **address_p)
{
    ucp_worker_params_t params = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_MULTI,
    };
    ucs_status_t status = ucp_worker_create(ucx->context, &params, &w->worker);
    if (status != UCS_OK) {
        ferry_error("ucx: ucp_worker_create failed: %s", ucs_status_string(status));
        w->worker = NULL;
        return FERRY_ERR_NO_RESOURCE;
    }
    ucp_worker_attr_t attr = {.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE};
    if (ucp_worker_query(w->worker, &attr) == UCS_OK && attr.thread_mode != UCS_THREAD_MODE_MULTI) {
        ferry_error("ucx: this UCX has no multi-threaded workers (built without "
                    "--enable-mt)");
        return FERRY_ERR_UNSUPPORTED;
    }
    status = ucp_worker_get_efd(w->worker, &w->efd);
    if (status != UCS_OK) {
        ferry_error("ucx: ucp_worker_get_efd failed: %s", ucs_status_string(status));
        return FERRY_ERR_UNSUPPORTED;
    }
    ucp_address_t *address;
    size_t length;
    status = ucp_worker_get_address(w->worker, &address, &length);
    if (status != UCS_OK) {
        ferry_error("ucx: ucp_worker_get_address failed: %s", ucs_status_string(status));
        return FERRY_ERR_NO_RESOURCE;
    }
    *address_p = ferry_ucx_base64_encode(address, length);
    ucp_worker_release_address(w->worker, address);
    if (*address_p == NULL)
        return FERRY_ERR_NO_MEMORY;
    return ferry_ucx_am_register(w);
}

ferry_status_t ferry_ucx_context_start(ferry_ucx_t *ucx)
{
    char *resources = NULL;
    ferry_status_t status = context_create(ucx->settings.workers, &ucx->context, &resources);
    if (status != FERRY_OK)
        return status;
    ferry_debug("ucx: %s, resources: %s", ucp_get_version_string(), resources);
    free(resources);
    if ((status = ferry_ucx_eager_datatype_create(ucx)) != FERRY_OK)
        return status;

    ucx->workers = calloc(ucx->settings.workers, sizeof(*ucx->workers));
    if (ucx->workers == NULL)
        return FERRY_ERR_NO_MEMORY;
    char identity[160];
    size_t prefix = strlen(FERRY_UCX_ENDPOINT_PREFIX);
    memcpy(identity, FERRY_UCX_ENDPOINT_PREFIX, prefix);
    ferry_process_identity(identity + prefix, sizeof(identity) - prefix - 1);
    strcat(identity, ":");
    size_t used = strlen(identity), cap = used + 1;
    if ((ucx->address = strdup(identity)) == NULL)
        return FERRY_ERR_NO_MEMORY;
    for (unsigned i = 0; i < ucx->settings.workers; i++) {
        ferry_ucx_worker_t *w = &ucx->workers[i];
        worker_init(ucx, w, i);
        ucx->n_workers++;
        char *address = NULL;
        status = worker_create(ucx, w, &address);
        if (status == FERRY_OK) {
            size_t len = strlen(address);
            if (used + len + 2 > cap) {
                cap = (used + len + 2) * 2;
                char *grown = realloc(ucx->address, cap);
                if (grown == NULL)
                    status = FERRY_ERR_NO_MEMORY;
                else
                    ucx->address = grown;
            }
        }
        if (status == FERRY_OK) {
            if (i > 0)
                ucx->address[used++] = ',';
            memcpy(ucx->address + used, address, strlen(address) + 1);
            used += strlen(address);
        }
        free(address);
        if (status != FERRY_OK)
            return status;
    }
    for (unsigned i = 0; i < ucx->n_workers && status == FERRY_OK; i++)
        status = thread_start(&ucx->workers[i]);
    if (status == FERRY_OK)
        ferry_debug("ucx: %u worker(s), progress %s, endpoint %zu bytes", ucx->n_workers,
                    ucx->settings.progress, strlen(ucx->address));
    return status;
}

void ferry_ucx_context_quiesce(ferry_ucx_t *ucx)
{
    /* Threads first: endpoints are then closed by this thread alone. */
    for (unsigned i = 0; i < ucx->n_workers; i++) {
        ferry_ucx_worker_t *w = &ucx->workers[i];
        if (!w->thread_started)
            continue;
        atomic_store(&w->stop, 1);
        ucp_worker_signal(w->worker);
        unpark(w);
        pthread_join(w->thread, NULL);
        w->thread_started = 0;
    }
    if (ucx->workers != NULL)
        ferry_ucx_eps_destroy(ucx);
}

void ferry_ucx_context_stop(ferry_ucx_t *ucx)
{
    ferry_ucx_context_quiesce(ucx); /* again: a no-op after the engine's stop */
    for (unsigned i = 0; i < ucx->n_workers; i++) {
        ferry_ucx_worker_t *w = &ucx->workers[i];
        if (w->worker != NULL) {
            /* Let forced closes finish so ucp_worker_destroy finds no request. */
            uint64_t deadline = ferry_ucx_time_ms() + 1000;
            while (atomic_load(&w->closing) > 0 && ferry_ucx_time_ms() < deadline)
                ucp_worker_progress(w->worker);
            ucp_worker_destroy(w->worker);
        }
        ferry_ucx_eager_fini(w);
        pthread_mutex_destroy(&w->lock);
        pthread_mutex_destroy(&w->park_lock);
        pthread_cond_destroy(&w->park_cond);
    }
    free(ucx->workers);
    ucx->workers = NULL;
    ucx->n_workers = 0;
    ferry_ucx_eager_datatype_destroy(ucx);
    if (ucx->context != NULL)
        ucp_cleanup(ucx->context);
    ucx->context = NULL;
}

void ferry_ucx_print_info(FILE *out)
{
    fprintf(out, "ucx: UCX %s (built against %d.%d)", ucp_get_version_string(), UCP_API_MAJOR,
            UCP_API_MINOR);
    ucp_context_h context;
    char *resources = NULL;
    if (context_create(1, &context, &resources) != FERRY_OK) {
        fprintf(out, ", no usable transport (ucp_init failed)\n");
        return;
    }
    fprintf(out, ", transports: %s\n", resources && *resources ? resources : "none");
    ucp_cleanup(context);
    unsigned defaults = defaults_left_to_us() & defaults_read_by(resources);
    free(resources);
    for (size_t i = 0; i < FERRY_UCX_ARRAY_SIZE(changed_defaults); i++) {
        const changed_default_t *d = &changed_defaults[i];
        if (defaults & (1u << i))
            fprintf(out, "ucx: %s=%s (the plugin's default; setting %s keeps the user's)\n",
                    d->variable, d->value, d->user_keys[0]);
    }
}
