/*
 * The ucx transport plugin: settings, the transport object's life cycle,
 * the plugin description and its single exported entry point.
 *
 * UCX picks the lanes (shared memory, CMA, TCP here; RC/DC/UD, cuda_ipc,
 * rocm on clusters); Ferry keeps segments, descriptors and metadata.  UCX_*
 * variables reach UCX unchanged through ucp_config_read.
 */
#include "ucx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SETTING(name_, default_, doc_, field_, type_)                                          \
    {.name = name_, .default_value = default_, .doc = doc_,                                    \
     .offset = offsetof(ferry_ucx_settings_t, field_), .type = type_}

const ferry_setting_t ferry_ucx_settings_table[] = {
    SETTING("WORKERS", "1", "ucp workers, each with its own progress thread; peers are spread "
            "over them (1..64)", workers, FERRY_SETTING_UINT),
    SETTING("PROGRESS", "hybrid", "progress threads: hybrid (poll for SPIN after each event, then "
            "sleep on the worker's event fd), wait (always sleep), poll (never sleep: a core each)",
            progress, FERRY_SETTING_STRING),
    SETTING("SPIN", "50", "hybrid progress: microseconds a thread keeps polling after the last "
            "event before it sleeps", spin_us, FERRY_SETTING_UINT),
    SETTING("TIMEOUT", "5000ms", "a peer with requests outstanding that completes none for this "
            "long fails them with FERRY_ERR_PEER_FAILED (0: only UCX's own detection)",
            timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("SLICE_SIZE", "4m", "requests are cut into slices of this size (0: never cut)",
            slice_size, FERRY_SETTING_SIZE),
    SETTING("SAME_HOST_SHM", "warn", "an endpoint to a same-host peer that uses no shared-memory "
            "lane: warn (log once), require (UCX does not reach that peer; another transport "
            "does), ignore", same_host_shm, FERRY_SETTING_STRING),
    SETTING("RKEY_CACHE", "4096", "unpacked rkeys kept per endpoint before the cache is emptied "
            "at the next idle moment", rkey_cache, FERRY_SETTING_UINT),
    SETTING("SAME_HOST_EMULATED", "n", "serve a same-host peer's registered (not ferry_alloc) "
            "buffers through UCX's RMA emulation over shared memory even when another transport "
            "reaches them (n: ucx serves them only as a last resort)", same_host_emulated,
            FERRY_SETTING_BOOL),
    SETTING("EAGER_WRITE", "4m", "write slices up to this size to a peer none of whose lanes "
            "does RMA (tcp) go as active messages the target bounds-checks, copies and "
            "acknowledges, instead of UCX's emulated put and flush (0: always ucp_put_nbx)",
            eager_write, FERRY_SETTING_SIZE),
    SETTING("EAGER_PIECE", "60k", "where one lane carries a peer's active messages (tcp), "
            "eager writes go in pieces of at most this size, each one 64k tcp send segment "
            "with its headers, so the target's UCX does not gather them first (0: a message "
            "per write; below 4k refused; lower it with UCX_TCP_TX_SEG_SIZE)",
            eager_piece, FERRY_SETTING_SIZE),
};
const size_t ferry_ucx_settings_count = FERRY_UCX_ARRAY_SIZE(ferry_ucx_settings_table);

uint64_t ferry_ucx_time_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

uint64_t ferry_ucx_time_us(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

static uint64_t hash_mix(uint64_t hash, const unsigned char *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        hash = (hash ^ word) * 0x9e3779b97f4a7c15ull;
        hash ^= hash >> 29;
    }
    for (; n > 0; p++, n--)
        hash = (hash ^ *p) * 1099511628211ull;
    return hash;
}

/* Endpoint strings and packed keys run to a kilobyte and are hashed on
 * every request: hash the length and at most 64 bytes at each end (they
 * hold what differs: process identity, addresses, key headers and tails).
 * Equal samples only cost a string compare in the bucket. */
uint64_t ferry_ucx_hash(const char *text, uint64_t seed)
{
    enum { SAMPLE = 64 };
    const unsigned char *p = (const unsigned char *)text;
    size_t length = strlen(text);
    uint64_t hash = (1469598103934665603ull ^ seed) + length * 0x9e3779b97f4a7c15ull;
    if (length <= 2 * SAMPLE)
        return hash_mix(hash, p, length);
    hash = hash_mix(hash, p, SAMPLE);
    return hash_mix(hash, p + length - SAMPLE, SAMPLE);
}

/* How a UCX failure reads to the engine: anything that says the peer or the
 * link broke is FERRY_ERR_PEER_FAILED, so the engine refreshes and retries. */
ferry_status_t ferry_ucx_status(ucs_status_t status)
{
    switch (status) {
    case UCS_OK:
        return FERRY_OK;
    case UCS_ERR_NO_MEMORY:
        return FERRY_ERR_NO_MEMORY;
    case UCS_ERR_INVALID_PARAM:
        return FERRY_ERR_INVALID_PARAM;
    case UCS_ERR_UNSUPPORTED:
        return FERRY_ERR_UNSUPPORTED;
    case UCS_ERR_UNREACHABLE:
        return FERRY_ERR_CONNECT;
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_EXCEEDS_LIMIT:
        return FERRY_ERR_NO_RESOURCE;
    case UCS_ERR_OUT_OF_RANGE: /* an eager write's target refused the range */
        return FERRY_ERR_OUT_OF_RANGE;
    case UCS_ERR_REJECTED:     /* ... or refused it for another reason */
        return FERRY_ERR_REMOTE_REFUSED;
    default: /* connection reset, endpoint timeout, I/O error, ... */
        return FERRY_ERR_PEER_FAILED;
    }
}

/* A size setting that cuts: 0 (never) or at least 4k. */
static int size_off_or_4k(const char *name, size_t value)
{
    if (value == 0 || value >= 4096)
        return 1;
    ferry_error("FERRY_UCX_%s=%zu is below the minimum of 4k", name, value);
    return 0;
}

static ferry_status_t parse_settings(ferry_ucx_t *ucx)
{
    const ferry_ucx_settings_t *s = &ucx->settings;
    if (s->workers < 1 || s->workers > FERRY_UCX_MAX_WORKERS) {
        ferry_error("FERRY_UCX_WORKERS=%u is not within 1..%d", s->workers,
                    FERRY_UCX_MAX_WORKERS);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (strcasecmp(s->progress, "hybrid") == 0) {
        ucx->progress_mode = FERRY_UCX_PROGRESS_HYBRID;
    } else if (strcasecmp(s->progress, "wait") == 0) {
        ucx->progress_mode = FERRY_UCX_PROGRESS_WAIT;
    } else if (strcasecmp(s->progress, "poll") == 0) {
        ucx->progress_mode = FERRY_UCX_PROGRESS_POLL;
    } else {
        ferry_error("FERRY_UCX_PROGRESS=%s is not one of hybrid, wait, poll", s->progress);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (strcasecmp(s->same_host_shm, "warn") == 0) {
        ucx->shm_policy = FERRY_UCX_SHM_WARN;
    } else if (strcasecmp(s->same_host_shm, "require") == 0) {
        ucx->shm_policy = FERRY_UCX_SHM_REQUIRE;
    } else if (strcasecmp(s->same_host_shm, "ignore") == 0) {
        ucx->shm_policy = FERRY_UCX_SHM_IGNORE;
    } else {
        ferry_error("FERRY_UCX_SAME_HOST_SHM=%s is not one of warn, require, ignore",
                    s->same_host_shm);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (!size_off_or_4k("SLICE_SIZE", s->slice_size) ||
        !size_off_or_4k("EAGER_PIECE", s->eager_piece))
        return FERRY_ERR_INVALID_PARAM;
    if (s->rkey_cache < 1) {
        ferry_error("FERRY_UCX_RKEY_CACHE must be at least 1");
        return FERRY_ERR_INVALID_PARAM;
    }
    return FERRY_OK;
}

static void ucx_stop(void *ctx)
{
    ferry_ucx_context_quiesce(ctx);
}

static void ucx_destroy(void *ctx)
{
    ferry_ucx_t *ucx = ctx;
    if (ucx == NULL)
        return;
    ferry_ucx_context_stop(ucx);
    pthread_cond_destroy(&ucx->settled);
    pthread_mutex_destroy(&ucx->lock);
    ferry_settings_release(ferry_ucx_settings_table, ferry_ucx_settings_count, &ucx->settings);
    free(ucx->address);
    free(ucx);
}

static ferry_status_t ucx_create(const ferry_transport_services_t *svc, void **ctx_p)
{
    if (svc == NULL || svc->size < offsetof(ferry_transport_services_t, notify_deliver) ||
        svc->slice_done == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_ucx_t *ucx = calloc(1, sizeof(*ucx));
    if (ucx == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(&ucx->svc, svc, FERRY_UCX_MIN(svc->size, sizeof(ucx->svc)));
    ucx->svc.size = sizeof(ucx->svc);
    pthread_mutex_init(&ucx->lock, NULL);
    pthread_cond_init(&ucx->settled, NULL);
    ferry_status_t status = ferry_settings_read("UCX", ferry_ucx_settings_table,
                                                ferry_ucx_settings_count, &ucx->settings);
    if (status != FERRY_OK) {
        pthread_cond_destroy(&ucx->settled);
        pthread_mutex_destroy(&ucx->lock);
        free(ucx);
        return status;
    }
    status = parse_settings(ucx);
    if (status == FERRY_OK)
        status = ferry_ucx_context_start(ucx);
    if (status != FERRY_OK) {
        ucx_destroy(ucx);
        return status;
    }
    *ctx_p = ucx;
    return FERRY_OK;
}

static ferry_status_t ucx_address(void *ctx, char **endpoint_p)
{
    ferry_ucx_t *ucx = ctx;
    *endpoint_p = strdup(ucx->address);
    return *endpoint_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

static size_t ucx_slice_size(void *ctx)
{
    return ((ferry_ucx_t *)ctx)->settings.slice_size;
}

static const ferry_transport_ops_t ucx_ops = {
    .size = sizeof(ferry_transport_ops_t),
    .create = ucx_create,
    .destroy = ucx_destroy,
    .address = ucx_address,
    .mem_register = ferry_ucx_mem_register,
    .mem_deregister = ferry_ucx_mem_deregister,
    .reaches = ferry_ucx_reaches,
    .submit = ferry_ucx_submit,
    .peer_forget = ferry_ucx_peer_forget,
    .slice_size = ucx_slice_size,
    .notify = ferry_ucx_notify,
    .progress = ferry_ucx_progress,
    .mem_alloc = ferry_ucx_mem_alloc,
    .peer_changed = ferry_ucx_peer_changed,
    .progress_leave = ferry_ucx_progress_leave,
    .peer_cache_release = ferry_ucx_peer_cache_release,
    .stop = ucx_stop,
    .local_memory = ferry_ucx_local_memory,
};

static const ferry_plugin_t ucx_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_TRANSPORT,
    .name = "ucx",
    .description = "UCX (ucp put/get with packed rkeys; UCX picks shm, cma, tcp, rc, dc, ...)",
    .priority = 30,
    .flags = FERRY_TRANSPORT_ONE_SIDED | FERRY_TRANSPORT_KEY_GRANTS_READ,
    .settings = ferry_ucx_settings_table,
    .settings_count = FERRY_UCX_ARRAY_SIZE(ferry_ucx_settings_table),
    .settings_component = "UCX",
    .ops = &ucx_ops,
    .info = ferry_ucx_print_info,
};

__attribute__((visibility("default"))) const ferry_plugin_t *ferry_plugin_entry(void)
{
    return &ucx_plugin;
}
