/*
 * The ofi transport plugin: settings, the transport object's life cycle,
 * the plugin description and its single exported entry point.
 *
 * Opt-in: with FERRY_OFI_PROVIDER empty the module takes the first hardware
 * provider it finds (efa, verbs;ofi_rxm, cxi, psm3, opx) and stays off when
 * there is none; software providers (tcp;ofi_rxm, shm) run only when named,
 * and then answer reaches() with FERRY_REACH_FALLBACK, so that the default
 * order puts ofi ahead of tcp only on a fabric.
 */
#include "ofi.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define SETTING(name_, default_, doc_, field_, type_)                                          \
    {.name = name_, .default_value = default_, .doc = doc_,                                    \
     .offset = offsetof(ferry_ofi_settings_t, field_), .type = type_}

const ferry_setting_t ferry_ofi_settings_table[] = {
    SETTING("PROVIDER", "", "libfabric provider to use (\"tcp;ofi_rxm\", \"shm\", "
            "\"verbs;ofi_rxm\", ...); empty: the first of efa, verbs;ofi_rxm, cxi, psm3, opx found, "
            "else ofi stays off", provider, FERRY_SETTING_STRING),
    SETTING("SLICE_SIZE", "4m", "requests are cut into RMA operations of this size (0: never "
            "cut; else at least 4k)", slice_size, FERRY_SETTING_SIZE),
    SETTING("WINDOW", "64", "RMA operations posted to one peer at a time (also at most the "
            "provider's transmit queue size)", window, FERRY_SETTING_UINT),
    SETTING("TIMEOUT", "5000ms", "a peer with operations posted or pending that sees no "
            "completion for this long fails them with FERRY_ERR_PEER_FAILED (with operations "
            "posted, the shared initiator endpoint is closed and replaced; other peers' "
            "operations are posted again)",
            timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("COMPLETION", "delivery", "when a write counts as done: delivery (FI_DELIVERY_"
            "COMPLETE: in the target's memory) or transmit (FI_TRANSMIT_COMPLETE; unsafe: "
            "libfabric 1.17's tcp;ofi_rxm then reports a write to a deregistered key as done)",
            completion, FERRY_SETTING_STRING),
    SETTING("PROGRESS", "wait", "progress thread when nothing is posted: wait (sleep on the "
            "provider's wait fd, or nap NAP microseconds where it has none, as shm) or poll "
            "(never sleep: a core)", progress, FERRY_SETTING_STRING),
    SETTING("NAP", "100", "PROGRESS=wait without a wait fd (shm): microseconds the thread "
            "sleeps between looks at the target endpoint; peers' RMA waits that long at most",
            nap_us, FERRY_SETTING_UINT),
    SETTING("SPIN", "1000", "PROGRESS=wait on a provider without a wait fd (shm): "
            "microseconds the progress thread keeps polling after its last event (a "
            "completion, a peer's RMA served) before it backs off, so that a stream of "
            "requests never waits for a nap",
            spin_us, FERRY_SETTING_UINT),
    SETTING("HMEM", "n", "ask the provider for FI_HMEM, so that cuda:N and rocm:N buffers get "
            "keys (untested: no provider here offers it)", hmem, FERRY_SETTING_BOOL),
    SETTING("FD_SPIN", "auto", "PROGRESS=wait on a provider with a wait fd (tcp;ofi_rxm): "
            "microseconds the progress thread keeps polling after the fd woke it (a peer's "
            "RMA) or after its last completion, before it sleeps on the fd again; an 8 B write "
            "to such a target then waits for no thread wakeup (0: sleep at once; a core while "
            "requests keep coming); auto: 200, widening up to 1600 while requests keep "
            "waking the fd, where the process may run on 2 or more CPUs and the host has no "
            "more runnable threads than CPUs; none otherwise",
            fd_spin, FERRY_SETTING_STRING),
};
const size_t ferry_ofi_settings_count = FERRY_OFI_ARRAY_SIZE(ferry_ofi_settings_table);

uint64_t ferry_ofi_time_us(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000u + (uint64_t)now.tv_nsec / 1000u;
}

/* Deadlines of seconds and the sweep's 10 ms: the coarse clock (the
 * kernel's tick, 1-4 ms) is plenty, and it is read several times per
 * operation (a peer's last activity): 5 ns a read here against 22 ns for
 * CLOCK_MONOTONIC. */
uint64_t ferry_ofi_time_ms(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
    return (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
}

/* Anything that says the link or the peer broke is FERRY_ERR_PEER_FAILED,
 * so that the engine refreshes the descriptor and retries once. */
ferry_status_t ferry_ofi_status(int fi_error)
{
    switch (fi_error < 0 ? -fi_error : fi_error) {
    case 0:
        return FERRY_OK;
    case FI_ENOMEM:
        return FERRY_ERR_NO_MEMORY;
    case FI_EINVAL:
        return FERRY_ERR_INVALID_PARAM;
    case FI_ENOSYS:
    case FI_EOPNOTSUPP:
        return FERRY_ERR_UNSUPPORTED;
    case FI_EAGAIN:
    case FI_ENOSPC:
        return FERRY_ERR_NO_RESOURCE;
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
        return FERRY_ERR_REMOTE_REFUSED;
    case FI_ECANCELED:
        return FERRY_ERR_CANCELED;
    default: /* connection refused or reset, timeouts, I/O errors */
        return FERRY_ERR_PEER_FAILED;
    }
}

char *ferry_ofi_hex_encode(const void *data, size_t length)
{
    static const char digits[] = "0123456789abcdef";
    char *text = malloc(2 * length + 1);
    if (text == NULL)
        return NULL;
    const unsigned char *p = data;
    for (size_t i = 0; i < length; i++) {
        text[2 * i] = digits[p[i] >> 4];
        text[2 * i + 1] = digits[p[i] & 15];
    }
    text[2 * length] = '\0';
    return text;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

void *ferry_ofi_hex_decode(const char *text, size_t text_length, size_t *length_p)
{
    if (text_length == 0 || text_length % 2 != 0)
        return NULL;
    unsigned char *data = malloc(text_length / 2);
    if (data == NULL)
        return NULL;
    for (size_t i = 0; i < text_length / 2; i++) {
        int hi = hex_digit(text[2 * i]), lo = hex_digit(text[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            free(data);
            return NULL;
        }
        data[i] = (unsigned char)(hi << 4 | lo);
    }
    *length_p = text_length / 2;
    return data;
}

static ferry_status_t parse_settings(ferry_ofi_t *ofi)
{
    const ferry_ofi_settings_t *s = &ofi->settings;
    if (strcasecmp(s->completion, "delivery") == 0) {
        ofi->write_flags = FI_DELIVERY_COMPLETE;
    } else if (strcasecmp(s->completion, "transmit") == 0) {
        ofi->write_flags = FI_TRANSMIT_COMPLETE;
    } else {
        ferry_error("FERRY_OFI_COMPLETION=%s is not one of delivery, transmit", s->completion);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (strcasecmp(s->progress, "wait") == 0) {
        ofi->poll_mode = 0;
    } else if (strcasecmp(s->progress, "poll") == 0) {
        ofi->poll_mode = 1;
    } else {
        ferry_error("FERRY_OFI_PROGRESS=%s is not one of wait, poll", s->progress);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->slice_size != 0 && s->slice_size < 4096) {
        ferry_error("FERRY_OFI_SLICE_SIZE=%zu is below the minimum of 4k", s->slice_size);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->window < 1) {
        ferry_error("FERRY_OFI_WINDOW must be at least 1");
        return FERRY_ERR_INVALID_PARAM;
    }
    if (s->spin_us > 1000000) {
        ferry_error("FERRY_OFI_SPIN=%u is above 1 s", s->spin_us);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (strcasecmp(s->fd_spin, "auto") == 0) {
        ofi->settings.fd_spin_auto = 1;
    } else {
        char *end = NULL;
        unsigned long us = strtoul(s->fd_spin, &end, 10);
        if (end == s->fd_spin || *end != '\0' || s->fd_spin[0] == '-' || us > 1000000) {
            ferry_error("FERRY_OFI_FD_SPIN=%s is neither auto nor microseconds up to 1000000",
                        s->fd_spin);
            return FERRY_ERR_INVALID_PARAM;
        }
        ofi->settings.fd_spin_us = (unsigned)us;
    }
    if (s->nap_us > 1000000) {
        ferry_error("FERRY_OFI_NAP=%u is above 1 s", s->nap_us);
        return FERRY_ERR_INVALID_PARAM;
    }
    return FERRY_OK;
}

static void ofi_stop(void *ctx)
{
    ferry_ofi_context_quiesce(ctx);
}

static void ofi_destroy(void *ctx)
{
    ferry_ofi_t *ofi = ctx;
    if (ofi == NULL)
        return;
    ferry_ofi_context_quiesce(ofi);
    ferry_ofi_context_close(ofi);
    ferry_ofi_op_cache_free(ofi);
    pthread_rwlock_destroy(&ofi->lane_lock);
    pthread_mutex_destroy(&ofi->lock);
    pthread_mutex_destroy(&ofi->op_cache_lock);
    ferry_settings_release(ferry_ofi_settings_table, ferry_ofi_settings_count, &ofi->settings);
    free(ofi->address);
    free(ofi);
}

static ferry_status_t ofi_create(const ferry_transport_services_t *svc, void **ctx_p)
{
    if (svc == NULL || svc->slice_done == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_ofi_t *ofi = calloc(1, sizeof(*ofi));
    if (ofi == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(&ofi->svc, svc, FERRY_OFI_MIN(svc->size, sizeof(ofi->svc)));
    ofi->svc.size = sizeof(ofi->svc);
    ofi->target_fd = -1;
    ofi->wake_fd = -1;
    pthread_mutex_init(&ofi->lock, NULL);
    pthread_mutex_init(&ofi->op_cache_lock, NULL);
    pthread_rwlock_init(&ofi->lane_lock, NULL);
    ferry_status_t status = ferry_settings_read("OFI", ferry_ofi_settings_table,
                                                ferry_ofi_settings_count, &ofi->settings);
    if (status != FERRY_OK) {
        pthread_rwlock_destroy(&ofi->lane_lock);
        pthread_mutex_destroy(&ofi->lock);
        pthread_mutex_destroy(&ofi->op_cache_lock);
        free(ofi);
        return status;
    }
    status = parse_settings(ofi);
    if (status == FERRY_OK)
        status = ferry_ofi_context_start(ofi);
    if (status != FERRY_OK) {
        ofi_destroy(ofi);
        return status;
    }
    *ctx_p = ofi;
    return FERRY_OK;
}

static ferry_status_t ofi_address(void *ctx, char **endpoint_p)
{
    *endpoint_p = strdup(((ferry_ofi_t *)ctx)->address);
    return *endpoint_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

/* The setting, but never more than one operation of the provider may move
 * (ep_attr->max_msg_size; "never cut" too). */
static size_t ofi_slice_size(void *ctx)
{
    const ferry_ofi_t *ofi = ctx;
    size_t largest = ofi->info->ep_attr->max_msg_size;
    size_t size = ofi->settings.slice_size;
    if (largest != 0 && (size == 0 || size > largest))
        size = largest == SIZE_MAX ? 0 : largest;
    return size;
}

static const ferry_transport_ops_t ofi_ops = {
    .size = sizeof(ferry_transport_ops_t),
    .create = ofi_create,
    .destroy = ofi_destroy,
    .address = ofi_address,
    .mem_register = ferry_ofi_mem_register,
    .mem_deregister = ferry_ofi_mem_deregister,
    .reaches = ferry_ofi_reaches,
    .submit = ferry_ofi_submit,
    .peer_forget = ferry_ofi_peer_forget,
    .peer_cache_release = ferry_ofi_peer_cache_release,
    .slice_size = ofi_slice_size,
    .progress = ferry_ofi_progress,
    .progress_leave = ferry_ofi_progress_leave,
    .stop = ofi_stop,
};

static const ferry_plugin_t ofi_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_TRANSPORT,
    .name = "ofi",
    .description = "libfabric RMA (fi_write/fi_read on FI_EP_RDM; efa, verbs;ofi_rxm, cxi, psm3, "
                   "opx, or a named software provider)",
    /* Between ucx (30) and tcp (10), ahead of shm (20): a hardware provider
     * on one host has its own shared-memory path (efa's and cxi's use
     * libfabric's shm), and software providers answer FALLBACK anyway. */
    .priority = 25,
    .flags = FERRY_TRANSPORT_OPT_IN | FERRY_TRANSPORT_ONE_SIDED |
             FERRY_TRANSPORT_KEY_GRANTS_READ,
    .settings = ferry_ofi_settings_table,
    .settings_count = FERRY_OFI_ARRAY_SIZE(ferry_ofi_settings_table),
    .settings_component = "OFI",
    .ops = &ofi_ops,
    .info = ferry_ofi_print_info,
};

__attribute__((visibility("default"))) const ferry_plugin_t *ferry_plugin_entry(void)
{
    return &ofi_plugin;
}
