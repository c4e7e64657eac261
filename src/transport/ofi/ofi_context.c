/*
 * The ofi context: provider choice (fi_getinfo), fabric, domain, the
 * target endpoint and the progress thread; what ferry_info prints.
 *
 * Order of create (each step undone by context_close in reverse):
 *   fi_getinfo -> fabric -> domain -> target CQ, AV, endpoint (enabled) ->
 *   endpoint string -> the lane (ofi_lane.c) -> wake eventfd -> progress
 *   thread.
 * Order of stop (quiesce, then close): thread joined -> lane closed (every
 * op posted or pending FAILED) -> the table's peer references dropped ->
 * [engine deregisters memory] -> target endpoint, AV, CQ -> domain ->
 * fabric -> fi_info -> the /dev/shm regions of the endpoints we named.
 * libfabric answers -FI_EBUSY to closing a parent whose children live, so
 * that order is the only one that works.
 */
#include "ofi.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

/* What an empty FERRY_OFI_PROVIDER looks for, in this order. */
static const char *const hardware_providers[] = {"efa", "verbs;ofi_rxm", "cxi", "psm3", "opx"};
/* Cores that move bytes with the host's CPU and sockets or memory. */
static const char *const software_cores[] = {"tcp", "udp", "sockets", "shm", "net", "sm2"};

int ferry_ofi_provider_is_software(const char *prov_name)
{
    size_t core = strcspn(prov_name, ";");
    for (size_t i = 0; i < FERRY_OFI_ARRAY_SIZE(software_cores); i++)
        if (strlen(software_cores[i]) == core && strncmp(prov_name, software_cores[i], core) == 0)
            return 1;
    return 0;
}

static struct fi_info *make_hints(const char *prov_name, int hmem, int rma_event)
{
    struct fi_info *hints = fi_allocinfo();
    if (hints == NULL)
        return NULL;
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
    if (hmem)
        hints->caps |= FI_HMEM;
    if (rma_event)
        hints->caps |= FI_RMA_EVENT;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    /* Every MR mode we honour (ofi_mem.c); the provider keeps the ones it needs. */
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                                  FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_RAW |
                                  (hmem ? FI_MR_HMEM : 0);
    hints->domain_attr->threading = FI_THREAD_SAFE;
    hints->tx_attr->op_flags = FI_DELIVERY_COMPLETE;
    if (prov_name != NULL) {
        hints->fabric_attr->prov_name = strdup(prov_name);
        if (hints->fabric_attr->prov_name == NULL) {
            fi_freeinfo(hints);
            return NULL;
        }
    }
    return hints;
}

/* fi_getinfo for that provider; on IP providers the endpoint binds to the
 * host we advertise (two namespaces' veth, a chosen interface), else to the
 * provider's own choice. */
static int get_info_with(const ferry_ofi_t *ofi, const char *prov_name, int hmem, int rma_event,
                         struct fi_info **info_p)
{
    struct fi_info *hints = make_hints(prov_name, hmem, rma_event);
    if (hints == NULL)
        return -FI_ENOMEM;
    int ret = -FI_ENODATA;
    const char *host = ofi->svc.advertise_host;
    if (host != NULL && host[0] != '\0' && prov_name != NULL &&
        strncmp(prov_name, "shm", 3) != 0)
        ret = fi_getinfo(FERRY_OFI_API_VERSION, host, NULL, FI_SOURCE, hints, info_p);
    if (ret != 0)
        ret = fi_getinfo(FERRY_OFI_API_VERSION, NULL, NULL, 0, hints, info_p);
    fi_freeinfo(hints);
    return ret;
}

/* With FI_RMA_EVENT where the provider offers it without asking for
 * FI_MR_RMA_EVENT (shm): the target's counter of RMA served (ofi.h). */
static int get_info(const ferry_ofi_t *ofi, const char *prov_name, int hmem,
                    struct fi_info **info_p)
{
    if (get_info_with(ofi, prov_name, hmem, 1, info_p) == 0) {
        if (!((*info_p)->domain_attr->mr_mode & FI_MR_RMA_EVENT))
            return 0;
        fi_freeinfo(*info_p);
        *info_p = NULL;
    }
    return get_info_with(ofi, prov_name, hmem, 0, info_p);
}

/* "a, b, c": the providers fi_getinfo offers for RDM endpoints with RMA
 * (malloc-ed; "none" when there are none). */
static char *providers_seen(void)
{
    struct fi_info *hints = make_hints(NULL, 0, 0), *list = NULL;
    size_t size = 256, used = 0;
    char *text = malloc(size);
    if (text == NULL)
        goto out;
    text[0] = '\0';
    if (hints == NULL || fi_getinfo(FERRY_OFI_API_VERSION, NULL, NULL, 0, hints, &list) != 0)
        list = NULL;
    for (struct fi_info *i = list; i != NULL; i = i->next) {
        const char *name = i->fabric_attr->prov_name;
        char quoted[256];
        snprintf(quoted, sizeof(quoted), "%s%s", used ? ", " : "", name);
        if (strstr(text, name) != NULL)
            continue; /* one line per provider, not per interface */
        size_t add = strlen(quoted);
        if (used + add + 1 > size) {
            char *bigger = realloc(text, size * 2 + add);
            if (bigger == NULL)
                break;
            text = bigger;
            size = size * 2 + add;
        }
        memcpy(text + used, quoted, add + 1);
        used += add;
    }
    if (used == 0)
        snprintf(text, size, "none");
out:
    if (list != NULL)
        fi_freeinfo(list);
    if (hints != NULL)
        fi_freeinfo(hints);
    return text;
}

static ferry_status_t choose_provider(ferry_ofi_t *ofi)
{
    const char *named = ofi->settings.provider;
    int hmem = ofi->settings.hmem;
    if (named[0] != '\0') {
        int ret = get_info(ofi, named, hmem, &ofi->info);
        if (ret != 0 && hmem) {
            ferry_warn("FERRY_OFI_HMEM: provider \"%s\" offers no FI_HMEM; device memory gets "
                       "no ofi key", named);
            hmem = 0;
            ret = get_info(ofi, named, 0, &ofi->info);
        }
        if (ret != 0) {
            char *seen = providers_seen();
            ferry_error("FERRY_OFI_PROVIDER=%s: libfabric offers no such provider for RDM "
                        "endpoints with RMA (%s); it sees: %s", named, fi_strerror(-ret),
                        seen ? seen : "?");
            free(seen);
            return FERRY_ERR_NOT_FOUND;
        }
    } else {
        for (size_t i = 0; i < FERRY_OFI_ARRAY_SIZE(hardware_providers); i++) {
            if (get_info(ofi, hardware_providers[i], hmem, &ofi->info) == 0 ||
                (hmem && get_info(ofi, hardware_providers[i], 0, &ofi->info) == 0))
                break;
            ofi->info = NULL;
        }
        if (ofi->info == NULL) {
            ferry_debug("ofi: no hardware provider (efa, verbs;ofi_rxm, cxi, psm3, opx); "
                        "FERRY_OFI_PROVIDER names a software one");
            return FERRY_ERR_UNSUPPORTED;
        }
    }
    ofi->hmem = (ofi->info->caps & FI_HMEM) != 0;
    ofi->mr_mode = ofi->info->domain_attr->mr_mode;
    ofi->software = ferry_ofi_provider_is_software(ofi->info->fabric_attr->prov_name);
    ofi->silent_deaths = strcmp(ofi->info->fabric_attr->prov_name, "shm") == 0;
    ofi->target_copies = ofi->silent_deaths;
    ofi->park_on_silence = strstr(ofi->info->fabric_attr->prov_name, "ofi_rxm") != NULL;
    size_t tx = ofi->info->tx_attr->size;
    ofi->window = tx != 0 && tx < ofi->settings.window ? (unsigned)tx : ofi->settings.window;
    return FERRY_OK;
}

int ferry_ofi_name_endpoint(ferry_ofi_t *ofi, struct fid_ep *ep)
{
    if (strcmp(ofi->info->fabric_attr->prov_name, "shm") != 0)
        return 0;
    /* Unique on the host for as long as we live: the engine's random
     * generation, our pid, and a count of the endpoints named. */
    char name[96];
    int length = snprintf(name, sizeof(name), "ferry-%ld-%016" PRIx64 "-%u", (long)getpid(),
                          ofi->svc.generation, atomic_fetch_add(&ofi->next_name, 1));
    return fi_setname(&ep->fid, name, (size_t)length + 1);
}

ferry_status_t ferry_ofi_endpoint_open(ferry_ofi_t *ofi, struct fid_cq *cq, struct fid_cntr *cntr,
                                       struct fid_av **av_p, struct fid_ep **ep_p,
                                       const char *what)
{
    struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
    const char *step = "fi_av_open";
    int ret;
    if ((ret = fi_av_open(ofi->domain, &av_attr, av_p, NULL)) != 0)
        goto err;
    step = "fi_endpoint";
    if ((ret = fi_endpoint(ofi->domain, ofi->info, ep_p, NULL)) != 0)
        goto err;
    step = "fi_ep_bind";
    if ((ret = fi_ep_bind(*ep_p, &(*av_p)->fid, 0)) != 0 ||
        (ret = fi_ep_bind(*ep_p, &cq->fid, FI_TRANSMIT | FI_RECV)) != 0 ||
        (cntr != NULL &&
         (ret = fi_ep_bind(*ep_p, &cntr->fid, FI_REMOTE_WRITE | FI_REMOTE_READ)) != 0))
        goto err;
    step = "fi_setname";
    if ((ret = ferry_ofi_name_endpoint(ofi, *ep_p)) != 0)
        goto err;
    step = "fi_enable";
    if ((ret = fi_enable(*ep_p)) != 0)
        goto err;
    return FERRY_OK;
err:
    ferry_error("ofi: %s (%s, %s): %s", step, what, ofi->info->fabric_attr->prov_name,
                fi_strerror(-ret));
    return ferry_ofi_status(ret);
}

static ferry_status_t open_target(ferry_ofi_t *ofi)
{
    struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_FD};
    int ret = fi_cq_open(ofi->domain, &cq_attr, &ofi->target_cq, NULL);
    if (ret == -FI_ENOSYS || ret == -FI_EINVAL || ret == -FI_EOPNOTSUPP) {
        /* shm has no wait object: the thread naps instead (FERRY_OFI_NAP) */
        cq_attr.wait_obj = FI_WAIT_NONE;
        ret = fi_cq_open(ofi->domain, &cq_attr, &ofi->target_cq, NULL);
    }
    if (ret != 0) {
        ferry_error("ofi: fi_cq_open: %s", fi_strerror(-ret));
        return ferry_ofi_status(ret);
    }
    if (cq_attr.wait_obj == FI_WAIT_FD &&
        fi_control(&ofi->target_cq->fid, FI_GETWAIT, &ofi->target_fd) != 0)
        ofi->target_fd = -1;
    if (ofi->info->caps & FI_RMA_EVENT) {
        struct fi_cntr_attr cntr_attr = {.events = FI_CNTR_EVENTS_COMP,
                                         .wait_obj = FI_WAIT_NONE};
        if ((ret = fi_cntr_open(ofi->domain, &cntr_attr, &ofi->target_cntr, NULL)) != 0) {
            ferry_debug("ofi: fi_cntr_open: %s (no count of RMA served)", fi_strerror(-ret));
            ofi->target_cntr = NULL;
        }
    }
    return ferry_ofi_endpoint_open(ofi, ofi->target_cq, ofi->target_cntr, &ofi->target_av,
                                   &ofi->target_ep, "target endpoint");
}

static ferry_status_t make_address(ferry_ofi_t *ofi)
{
    char name[1024];
    size_t name_length = sizeof(name);
    int ret = fi_getname(&ofi->target_ep->fid, name, &name_length);
    if (ret != 0) {
        ferry_error("ofi: fi_getname: %s", fi_strerror(-ret));
        return ferry_ofi_status(ret);
    }
    char *hex = ferry_ofi_hex_encode(name, name_length);
    if (hex == NULL)
        return FERRY_ERR_NO_MEMORY;
    char identity[192];
    ferry_process_identity(identity, sizeof(identity));
    size_t length = strlen(FERRY_OFI_ENDPOINT_PREFIX) + strlen(ofi->info->fabric_attr->prov_name) +
                    strlen(identity) + strlen(hex) + 3;
    ofi->address = malloc(length);
    if (ofi->address != NULL)
        snprintf(ofi->address, length, FERRY_OFI_ENDPOINT_PREFIX "%s:%s:%s",
                 ofi->info->fabric_attr->prov_name, identity, hex);
    free(hex);
    return ofi->address ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

void ferry_ofi_wake(ferry_ofi_t *ofi)
{
    /* While callers poll, a wakeup per submit was one of the three thread
     * wakeups of each 8 B write over tcp;ofi_rxm (doc/performance.md, third
     * round): the thread woke only to nap again. */
    if (atomic_load_explicit(&ofi->sleeping, memory_order_acquire) &&
        !atomic_load_explicit(&ofi->caller_nap, memory_order_acquire)) {
        uint64_t one = 1;
        if (write(ofi->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
            ferry_debug("ofi: wake: %s", strerror(errno));
    }
}

/* Post what peers have pending (a full window or a refused post left it
 * there, or a fence put it back). */
static unsigned pump_pending(ferry_ofi_t *ofi)
{
    if (atomic_load_explicit(&ofi->pending_ops, memory_order_acquire) == 0)
        return 0;
    unsigned events = 0;
    size_t count = 0;
    ferry_ofi_peer_t **busy = ferry_ofi_peers_busy(ofi, &count);
    for (size_t i = 0; i < count; i++) {
        events += ferry_ofi_peer_pump(busy[i]);
        ferry_ofi_peer_put(busy[i]);
    }
    free(busy);
    return events;
}

/* The lane's CQ on each look while ops are posted or pending; what is
 * pending and the target's CQ on each look while nothing is posted, on
 * every FERRY_OFI_TARGET_EVERY-th otherwise.  On tcp;ofi_rxm
 * every CQ read is an epoll_wait of that endpoint's sockets, so reading
 * both CQs on each look of a caller's spin doubled the system calls
 * between a completion and its notice; a peer's RMA to us still waits at
 * most a few looks.  A CQ read's completions refill their peers' windows
 * themselves (lane_progress); the pending lists are looked at for posts
 * refused (-FI_EAGAIN) or put back by a fence, and a look at them on each
 * look (the busy list: a lock, an allocation, a reference per peer) was
 * paid for nothing while full windows kept ops pending (a 64 KiB batch of
 * 128 through a window of 64: the first half of every batch). */
static unsigned progress_all(ferry_ofi_t *ofi)
{
    unsigned events = 0;
    if (atomic_load_explicit(&ofi->busy_peers, memory_order_acquire) != 0) {
        events = ferry_ofi_lane_progress(ofi);
        uint64_t turn = ferry_ofi_bump(&ofi->target_turn);
        if (turn % FERRY_OFI_TARGET_EVERY != 0)
            return events;
        events += pump_pending(ofi);
    }
    return events + ferry_ofi_target_progress(ofi);
}

unsigned ferry_ofi_progress(void *ctx)
{
    ferry_ofi_t *ofi = ctx;
    ferry_ofi_bump(&ofi->caller_polls);
    return progress_all(ofi);
}

void ferry_ofi_progress_leave(void *ctx)
{
    ferry_ofi_t *ofi = ctx;
    uint64_t one = 1;
    atomic_fetch_add_explicit(&ofi->caller_leaves, 1, memory_order_release);
    if (write(ofi->wake_fd, &one, sizeof(one)) < 0 && errno != EAGAIN)
        ferry_debug("ofi: wake: %s", strerror(errno));
}

/* Nap up to us microseconds, or until progress_leave or a submit writes
 * the eventfd. */
static void wait_wake(ferry_ofi_t *ofi, unsigned us)
{
    struct pollfd fd = {.fd = ofi->wake_fd, .events = POLLIN};
    struct timespec timeout = {.tv_sec = 0, .tv_nsec = (long)us * 1000};
    atomic_store_explicit(&ofi->sleeping, 1, memory_order_release);
    if (ppoll(&fd, 1, &timeout, NULL) > 0) {
        uint64_t count;
        if (read(ofi->wake_fd, &count, sizeof(count)) < 0)
            count = 0;
    }
    atomic_store_explicit(&ofi->sleeping, 0, memory_order_release);
}

/* Sleep until the target CQ or a submit wakes us, at most timeout_ms.
 * Returns whether the target endpoint has something (its fd woke us, or
 * fi_trywait found its CQ not empty): a peer is using us. */
static int sleep_on_fd(ferry_ofi_t *ofi, int timeout_ms)
{
    int target_event = 1;
    atomic_store_explicit(&ofi->sleeping, 1, memory_order_release);
    struct fid *cq = &ofi->target_cq->fid;
    if (atomic_load_explicit(&ofi->busy_peers, memory_order_acquire) == 0 &&
        !atomic_load_explicit(&ofi->stop, memory_order_acquire) &&
        fi_trywait(ofi->fabric, &cq, 1) == FI_SUCCESS) {
        struct pollfd fds[2] = {{.fd = ofi->wake_fd, .events = POLLIN},
                                {.fd = ofi->target_fd, .events = POLLIN}};
        uint64_t count;
        target_event = 0;
        if (poll(fds, 2, timeout_ms) > 0) {
            target_event = (fds[1].revents & POLLIN) != 0;
            if ((fds[0].revents & POLLIN) && read(ofi->wake_fd, &count, sizeof(count)) < 0)
                count = 0;
        }
    } /* else the CQ has something: read it */
    atomic_store_explicit(&ofi->sleeping, 0, memory_order_release);
    return target_event;
}

/* The thread's state between looks. */
typedef struct pace {
    uint64_t last_event_us; /* the last completion, RMA served or wakeup */
    /* The last event of the thread's own: a completion or target CQ entry
     * it read, or the target CQ's fd waking it (a peer's RMA).  Not the end
     * of a nap while callers poll: the caller drives its own requests, and
     * a thread spinning beside it (as well as the target's thread) wanted
     * three cores for one request on two. */
    uint64_t last_own_event_us;
    unsigned nap_us;        /* the back-off nap, growing while nothing happens */
    unsigned empty_spins;   /* empty looks in a spin window */
    /* The clock as the last look read it (look_clock), never before
     * last_event_us or last_own_event_us: every event sets it too
     * (pace_event), and so does the end of every sleep and nap. */
    uint64_t now_us;
    /* FERRY_OFI_FD_SPIN=auto (fd_spin_window) */
    unsigned auto_spin_us;  /* the window where spinning pays: 0 on fewer than 2 CPUs */
    long host_cpus;         /* online CPUs of the host */
    uint64_t load_look_us;  /* the last look at the host's runnable threads */
    unsigned crowded_looks; /* consecutive looks that found more runnable threads than CPUs */
} pace_t;

/* FERRY_OFI_FD_SPIN=auto: the window after each event starts at 200 us
 * and doubles, up to 1.6 ms, each time the fd woke the thread sooner after
 * the window closed than the window's length (requests keep coming: the
 * RMA a spinning target serves leaves no CQ entry, so a window counts from
 * the fd's last wakeup, and a stream paid a wakeup per window); it halves
 * back to 200 us each time the thread slept longer.  An 8 B write over
 * tcp;ofi_rxm sees the next request of a stream within ~10-40 us; an
 * engine that gets one request per millisecond spends at most a fifth of
 * a core on it (measurements: doc/performance.md, "ofi, fourth round"). */
#define AUTO_FD_SPIN_US 200
#define AUTO_FD_SPIN_MAX_US 1600
/* How often auto looks at the host's runnable threads, and how many looks
 * in a row must find the host crowded before it stops spinning (one busy
 * moment, a compiler starting, is not a crowd). */
#define LOAD_LOOK_US 100000
#define CROWDED_LOOKS 2

/* The CPUs this process may run on (sched_getaffinity), at least 1. */
static unsigned process_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return 1;
    int count = CPU_COUNT(&set);
    return count > 0 ? (unsigned)count : 1;
}

/* The host's runnable threads now (the fourth field of /proc/loadavg,
 * "running/total", this thread included), or -1 when it cannot be read. */
static long host_runnable(void)
{
    char text[128];
    int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t length = read(fd, text, sizeof(text) - 1);
    close(fd);
    if (length <= 0)
        return -1;
    text[length] = '\0';
    char *field = text;
    for (int i = 0; i < 3 && field != NULL; i++) {
        field = strchr(field, ' ');
        if (field != NULL)
            field++;
    }
    if (field == NULL)
        return -1;
    char *end = NULL;
    long running = strtol(field, &end, 10);
    return end != field && *end == '/' ? running : -1;
}

/* While the thread spins: the host's runnable threads against its CPUs,
 * every LOAD_LOOK_US. */
static void look_at_load(pace_t *pace, uint64_t now)
{
    if (now - pace->load_look_us < LOAD_LOOK_US)
        return;
    pace->load_look_us = now;
    if (host_runnable() > pace->host_cpus)
        pace->crowded_looks++;
    else
        pace->crowded_looks = 0;
}

/* How long to keep polling after an event on a provider with a wait fd.
 * A number: that.  auto: spinning takes the target's wakeup out of each
 * request (most of rxm's 8 B latency over the bare loop's), but where it
 * takes a core another thread needs it makes every request slower (80 us
 * against 45 us on a loaded 2-core host): so none on a process confined
 * to one CPU, and none while the host has more runnable threads than CPUs
 * (looked at every 100 ms, only while a window is open, so an idle engine
 * reads nothing). */
static unsigned fd_spin_window(const ferry_ofi_t *ofi, pace_t *pace, uint64_t now)
{
    if (!ofi->settings.fd_spin_auto)
        return ofi->settings.fd_spin_us;
    if (pace->auto_spin_us == 0 || now - pace->last_own_event_us >= pace->auto_spin_us)
        return pace->auto_spin_us;
    look_at_load(pace, now);
    return pace->crowded_looks >= CROWDED_LOOKS ? 0 : pace->auto_spin_us;
}

/* auto: after a sleep on the fd that lasted slept_us (woke: a peer's RMA
 * ended it), widen the window when polling a little longer would have
 * caught that RMA, narrow it when the engine was idle for longer. */
static void adapt_fd_spin(pace_t *pace, int woke, uint64_t slept_us)
{
    if (pace->auto_spin_us == 0)
        return;
    if (woke && slept_us < pace->auto_spin_us)
        pace->auto_spin_us = FERRY_OFI_MIN(pace->auto_spin_us * 2, AUTO_FD_SPIN_MAX_US);
    else if (slept_us >= pace->auto_spin_us)
        pace->auto_spin_us = pace->auto_spin_us / 2 > AUTO_FD_SPIN_US ? pace->auto_spin_us / 2
                                                                     : AUTO_FD_SPIN_US;
}

/* An event now (a completion, RMA served, a wakeup; own: the thread's own,
 * see last_own_event_us): the spin windows count from it. */
static void pace_event(pace_t *pace, int own)
{
    pace->now_us = pace->last_event_us = ferry_ofi_time_us();
    if (own)
        pace->last_own_event_us = pace->now_us;
}

/* Empty looks inside a spin window between two readings of the clock.  A
 * reading (~24 ns on this VM) was an eighth of the target thread's empty
 * look on shm, and a peer's post waits half a look on average before the
 * look that serves it; a window of hundreds of microseconds ends a few
 * looks late at most. */
#define SPIN_LOOKS_PER_CLOCK 8

static uint64_t look_clock(pace_t *pace)
{
    if (pace->empty_spins % SPIN_LOOKS_PER_CLOCK != 0)
        return pace->now_us;
    return pace->now_us = ferry_ofi_time_us();
}

static void pace_init(const ferry_ofi_t *ofi, pace_t *pace)
{
    *pace = (pace_t){0};
    pace_event(pace, 0);
    pace->host_cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (pace->host_cpus < 1)
        pace->host_cpus = 1;
    if (!ofi->settings.fd_spin_auto || ofi->target_fd < 0)
        return;
    unsigned cpus = process_cpus();
    pace->auto_spin_us = cpus >= 2 ? AUTO_FD_SPIN_US : 0;
    ferry_debug("ofi: FERRY_OFI_FD_SPIN=auto: %u us or more after each event (%u CPUs for the "
                "process, "
                "%ld on the host; none while the host has more runnable threads)",
                pace->auto_spin_us, cpus, pace->host_cpus);
}

/* An empty look inside a spin window: the core is yielded on every
 * FERRY_OFI_YIELD_EVERY-th only while the host has more runnable threads
 * than CPUs, on every YIELD_EVERY_UNCROWDED-th otherwise.  A sched_yield
 * on each look made the target's answer to an 8 B write wait for a system
 * call (0.2-1.2 us here) where the bare loop's target spins; on a host
 * with a CPU to spare a yield gives nobody anything (shm's 8 B write:
 * 0.79 us yielding every 64th look against 0.84 us every 8th). */
#define YIELD_EVERY_UNCROWDED 64
static void spin_look(pace_t *pace, uint64_t now)
{
    look_at_load(pace, now);
    unsigned every = pace->crowded_looks != 0 ? FERRY_OFI_YIELD_EVERY : YIELD_EVERY_UNCROWDED;
    if (++pace->empty_spins % every == 0)
        sched_yield();
}

/* Nothing happened in this look.  While ops are posted where our own CQ
 * reads move their bytes (rxm): keep polling, yielding.  Idle with a wait
 * fd (rxm): keep polling for FERRY_OFI_FD_SPIN after the last event (the
 * fd waking us counts: served RMA leaves no CQ entry), then sleep on it.
 * Without one (shm): keep polling for the spin window after the last
 * event (RMA served counts), then back off in growing naps (from 1 us: ops
 * posted up to 64 us, idle up to FERRY_OFI_NAP).  A peer's RMA (fd), a
 * submit or a caller's progress_leave ends a nap or sleep. */
static void idle_look(ferry_ofi_t *ofi, pace_t *pace)
{
    int busy = atomic_load_explicit(&ofi->busy_peers, memory_order_acquire) != 0;
    if (ofi->poll_mode) {
        sched_yield();
        return;
    }
    uint64_t now = look_clock(pace);
    if (busy && !ofi->target_copies) {
        /* our CQ reads move the bytes: poll, yielding as in a spin window
         * (a yield on each empty look put a system call, and wherever
         * anything else could run a context switch, between the looks that
         * notice completions) */
        spin_look(pace, now);
        return;
    }
    if (!busy && ofi->target_fd >= 0) {
        /* where a core is free, spinning takes the target thread's wakeup
         * out of each request; where none is, it slows every request
         * (fd_spin_window) */
        if (now - pace->last_own_event_us < fd_spin_window(ofi, pace, now)) {
            spin_look(pace, now);
            return;
        }
        unsigned timeout = ofi->settings.timeout_ms / 4;
        int woke = sleep_on_fd(ofi, timeout == 0 || timeout > 100 ? 100 : (int)timeout);
        uint64_t after = pace->now_us = ferry_ofi_time_us();
        if (woke)
            pace->last_event_us = pace->last_own_event_us = after;
        if (ofi->settings.fd_spin_auto)
            adapt_fd_spin(pace, woke, after - now);
        pace->nap_us = 0;
        return;
    }
    if (now - pace->last_event_us < ofi->settings.spin_us) {
        spin_look(pace, now);
        return;
    }
    unsigned most = busy ? 64 : FERRY_OFI_MIN(ofi->settings.nap_us, 1000000u);
    pace->nap_us = pace->nap_us ? FERRY_OFI_MIN(pace->nap_us * 2, most) : 1;
    wait_wake(ofi, pace->nap_us);
    pace->now_us = ferry_ofi_time_us();
}

/* Polls while ops are posted or pending (manual progress: on tcp;ofi_rxm
 * the reads of the CQ are what move the bytes), keeps off while callers
 * poll (ferry_batch_wait's spin), keeps polling for FERRY_OFI_SPIN after
 * each event, then backs off; rxm and shm serve peers' RMA only while
 * somebody reads the target endpoint's CQ. */
static void *progress_thread(void *arg)
{
    ferry_ofi_t *ofi = arg;
    uint64_t seen_polls = 0, seen_leaves = 0, last_sweep = ferry_ofi_time_ms();
    unsigned off_us = 0;
    pace_t pace;
    pace_init(ofi, &pace);
    /* naps of a few microseconds mean what they say (the default slack is
     * 50 us) */
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    while (!atomic_load_explicit(&ofi->stop, memory_order_acquire)) {
        uint64_t now = ferry_ofi_time_ms();
        if (now - last_sweep >= 10) {
            ferry_ofi_peers_sweep(ofi);
            last_sweep = now;
        }
        uint64_t polls = atomic_load_explicit(&ofi->caller_polls, memory_order_relaxed);
        uint64_t leaves = atomic_load_explicit(&ofi->caller_leaves, memory_order_acquire);
        if (leaves != seen_leaves) {
            /* a caller stopped polling and sleeps until its requests are
             * done: progress now (napping on because it had polled made
             * its wait up to a nap longer, 1 ms at most) */
            seen_leaves = leaves;
            seen_polls = polls;
        }
        if (polls != seen_polls) {
            /* a caller polls: nap, growing, until it stops; its
             * progress_leave (it goes to sleep) ends the nap at once */
            seen_polls = polls;
            off_us = off_us ? FERRY_OFI_MIN(off_us * 2, 1000u) : 50u;
            atomic_store_explicit(&ofi->caller_nap, 1, memory_order_release);
            wait_wake(ofi, off_us);
            atomic_store_explicit(&ofi->caller_nap, 0, memory_order_release);
            pace_event(&pace, 0);
            continue;
        }
        off_us = 0;
        if (progress_all(ofi) != 0) {
            pace_event(&pace, 1);
            pace.nap_us = 0;
            continue;
        }
        idle_look(ofi, &pace);
    }
    return NULL;
}

ferry_status_t ferry_ofi_context_start(ferry_ofi_t *ofi)
{
    ferry_status_t status = choose_provider(ofi);
    if (status != FERRY_OK)
        return status;
    const char *prov = ofi->info->fabric_attr->prov_name;
    int ret = fi_fabric(ofi->info->fabric_attr, &ofi->fabric, NULL);
    if (ret == 0)
        ret = fi_domain(ofi->fabric, ofi->info, &ofi->domain, NULL);
    if (ret != 0) {
        ferry_error("ofi: opening provider %s: %s", prov, fi_strerror(-ret));
        return ferry_ofi_status(ret);
    }
    atomic_init(&ofi->next_key, 1);
    if ((status = open_target(ofi)) != FERRY_OK || (status = make_address(ofi)) != FERRY_OK ||
        (status = ferry_ofi_lane_start(ofi)) != FERRY_OK)
        return status;
    ofi->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ofi->wake_fd < 0) {
        ferry_error("ofi: eventfd: %s", strerror(errno));
        return FERRY_ERR_NO_RESOURCE;
    }
    if (pthread_create(&ofi->thread, NULL, progress_thread, ofi) != 0) {
        ferry_error("ofi: cannot start the progress thread");
        return FERRY_ERR_NO_RESOURCE;
    }
    ofi->thread_started = 1;
    ferry_info("ofi: provider %s (%s), mr_mode 0x%x, window %u, writes %s-complete%s%s", prov,
               ofi->software ? "software" : "hardware", ofi->mr_mode, ofi->window,
               ofi->write_flags == FI_DELIVERY_COMPLETE ? "delivery" : "transmit",
               ofi->hmem ? ", FI_HMEM" : "",
               ofi->target_cntr ? ", RMA served counted (FI_RMA_EVENT)" : "");
    return FERRY_OK;
}

void ferry_ofi_context_quiesce(ferry_ofi_t *ofi)
{
    if (ofi->thread_started) {
        atomic_store_explicit(&ofi->stop, 1, memory_order_release);
        uint64_t one = 1;
        if (write(ofi->wake_fd, &one, sizeof(one)) < 0)
            ferry_debug("ofi: wake: %s", strerror(errno));
        pthread_join(ofi->thread, NULL);
        ofi->thread_started = 0;
    }
    ferry_ofi_lane_stop(ofi);
    ferry_ofi_peers_close_all(ofi);
}

static void close_fid(struct fid *fid, const char *what)
{
    if (fid == NULL)
        return;
    int ret = fi_close(fid);
    if (ret != 0)
        ferry_warn("ofi: closing the %s: %s", what, fi_strerror(-ret));
}

/* Parked endpoints (and so their domain and fabric) outlive the transport:
 * kept here, reachable, for the life of the process. */
static struct {
    pthread_mutex_t lock;
    ferry_ofi_parked_t *parked;
} kept = {PTHREAD_MUTEX_INITIALIZER, NULL};

/* The engine unloads the module after destroy; kept (and what it holds)
 * must stay mapped and reachable, for the provider's sake and so that
 * LeakSanitizer sees the parked endpoints as held, not lost. */
static void pin_module(void)
{
    Dl_info self;
    if (dladdr((void *)&kept, &self) == 0 || self.dli_fname == NULL ||
        dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == NULL)
        ferry_warn("ofi: cannot keep the module loaded for its parked endpoints");
}

/* shm keeps an endpoint's region in /dev/shm under the name we gave it;
 * closing the endpoint removes it, but what a parked or failed close left
 * would stay until removed by hand: every name we made goes here. */
static void unlink_names(ferry_ofi_t *ofi)
{
    unsigned named = atomic_load(&ofi->next_name);
    for (unsigned i = 0; i < named; i++) {
        char path[128];
        snprintf(path, sizeof(path), "/dev/shm/ferry-%ld-%016" PRIx64 "-%u", (long)getpid(),
                 ofi->svc.generation, i);
        if (unlink(path) == 0)
            ferry_debug("ofi: removed %s", path);
    }
}

void ferry_ofi_context_close(ferry_ofi_t *ofi)
{
    if (ofi->parked != NULL) {
        ferry_warn("ofi: a lane was parked (ofi_lane.c, must_park): the domain, the fabric "
                   "and the target endpoint stay open with it until the process exits");
        pin_module();
        pthread_mutex_lock(&kept.lock);
        ferry_ofi_parked_t *last = ofi->parked;
        while (last->next != NULL)
            last = last->next;
        last->next = kept.parked;
        kept.parked = ofi->parked;
        /* the target endpoint and the domain stay open with them: kept too */
        ferry_ofi_parked_t *own = calloc(1, sizeof(*own));
        if (own != NULL) {
            *own = (ferry_ofi_parked_t){.ep = ofi->target_ep, .cq = ofi->target_cq,
                                        .av = ofi->target_av, .domain = ofi->domain,
                                        .fabric = ofi->fabric, .next = kept.parked};
            kept.parked = own;
        }
        pthread_mutex_unlock(&kept.lock);
        ofi->parked = NULL;
        ofi->target_ep = NULL;
        ofi->target_av = NULL;
        ofi->target_cq = NULL;
        ofi->domain = NULL;
        ofi->fabric = NULL;
        ofi->target_cntr = NULL; /* bound to the target endpoint, kept with it */
    }
    close_fid(ofi->target_ep ? &ofi->target_ep->fid : NULL, "target endpoint");
    close_fid(ofi->target_av ? &ofi->target_av->fid : NULL, "target address vector");
    close_fid(ofi->target_cq ? &ofi->target_cq->fid : NULL, "target completion queue");
    close_fid(ofi->target_cntr ? &ofi->target_cntr->fid : NULL, "target counter");
    ofi->target_cntr = NULL;
    close_fid(ofi->domain ? &ofi->domain->fid : NULL, "domain");
    close_fid(ofi->fabric ? &ofi->fabric->fid : NULL, "fabric");
    ofi->target_ep = NULL;
    ofi->target_av = NULL;
    ofi->target_cq = NULL;
    ofi->domain = NULL;
    ofi->fabric = NULL;
    if (ofi->info != NULL)
        fi_freeinfo(ofi->info);
    ofi->info = NULL;
    if (ofi->wake_fd >= 0)
        close(ofi->wake_fd);
    ofi->wake_fd = -1;
    unlink_names(ofi);
}

void ferry_ofi_print_info(FILE *out)
{
    uint32_t version = fi_version();
    fprintf(out, "ofi: libfabric %u.%u (built against %u.%u)\n", FI_MAJOR(version),
            FI_MINOR(version), FI_MAJOR_VERSION, FI_MINOR_VERSION);
    char *seen = providers_seen();
    fprintf(out, "ofi: providers for RDM endpoints with RMA: %s\n", seen ? seen : "?");
    if (seen != NULL && strcmp(seen, "none") != 0) {
        fprintf(out, "ofi: software (run only when FERRY_OFI_PROVIDER names them):");
        char *save = NULL;
        for (char *name = strtok_r(seen, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
            name += strspn(name, " ");
            if (ferry_ofi_provider_is_software(name))
                fprintf(out, " %s", name);
        }
        fprintf(out, "\n");
    }
    free(seen);
    ferry_ofi_settings_t settings;
    const char *in_use = "none (no hardware provider, none named)";
    char chosen[256] = "";
    if (ferry_settings_read("OFI", ferry_ofi_settings_table, ferry_ofi_settings_count,
                            &settings) == FERRY_OK) {
        ferry_ofi_t probe = {.settings = settings};
        int saved = ferry_log_level_current;
        ferry_log_level_current = -1; /* a missing named provider is said below */
        if (choose_provider(&probe) == FERRY_OK) {
            snprintf(chosen, sizeof(chosen), "%s (%s, mr_mode 0x%x%s)",
                     probe.info->fabric_attr->prov_name,
                     probe.software ? "software" : "hardware", probe.mr_mode,
                     probe.hmem ? ", FI_HMEM" : "");
            in_use = chosen;
            fi_freeinfo(probe.info);
        } else if (settings.provider[0] != '\0') {
            snprintf(chosen, sizeof(chosen), "none: FERRY_OFI_PROVIDER=%s is not offered",
                     settings.provider);
            in_use = chosen;
        }
        ferry_log_level_current = saved;
        ferry_settings_release(ferry_ofi_settings_table, ferry_ofi_settings_count, &settings);
    }
    fprintf(out, "ofi: in use: %s\n", in_use);
    fprintf(out, "ofi: no hardware provider and no FI_HMEM path has run on real hardware yet "
                 "(tested: tcp;ofi_rxm and shm; MR modes local, endpoint, raw and prov_key "
                 "only through a stand-in, test/ofi_mr_shim.c)\n");
}
