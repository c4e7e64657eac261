/*
 * The GPU IPC transport plugin: settings, the transport object's life cycle,
 * keys, reachability, and ferry_plugin_entry built from the vendor table
 * (name "<kind>_ipc").  Its priority puts it first: for device memory of a
 * same-host peer nothing else copies without staging through the host.
 */
#include "gpu_ipc.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GPU_IPC_PRIORITY 60

atomic_ulong ferry_gpu_ipc_opens;
atomic_ulong ferry_gpu_ipc_closes;
atomic_ulong ferry_gpu_ipc_opens_on[1 + FERRY_GPU_IPC_MAX_DEVICES];

static const ferry_setting_t gpu_ipc_settings[] = {
    {"STREAMS", "4", "the transport's own streams per device; runs of copies take them in turn",
     offsetof(ferry_gpu_ipc_settings_t, streams), FERRY_SETTING_UINT},
    {"POLL_US", "20", "microseconds the progress thread waits between looks at the events of "
     "copies in flight", offsetof(ferry_gpu_ipc_settings_t, poll_us), FERRY_SETTING_UINT},
    {"SLICE_SIZE", "0", "bytes per copy a request is cut into (0: one copy per request)",
     offsetof(ferry_gpu_ipc_settings_t, slice_size), FERRY_SETTING_SIZE},
    {"PIN_HOST", "yes", "page-lock registered host buffers, so that copies between them and a "
     "peer's device memory run at the bus's speed (pageable memory: a fraction of it)",
     offsetof(ferry_gpu_ipc_settings_t, pin_host), FERRY_SETTING_BOOL},
};

uint64_t ferry_gpu_ipc_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int ferry_gpu_ipc_device_by_uuid(const ferry_gpu_ipc_t *gpu, const char *uuid,
                                 size_t uuid_length)
{
    for (int i = 0; i < gpu->n_devices; i++)
        if (strlen(gpu->devices[i].uuid) == uuid_length &&
            memcmp(gpu->devices[i].uuid, uuid, uuid_length) == 0)
            return i;
    return -1;
}

/* "<KIND>_IPC", the settings component, and "<kind>_ipc", the name. */
static char component[40], name[40], description[160];

static void gpu_ipc_destroy(void *ctx)
{
    ferry_gpu_ipc_t *gpu = ctx;
    if (gpu == NULL)
        return;
    ferry_gpu_ipc_stop(gpu); /* a no-op when the engine stopped us */
    ferry_gpu_ipc_peers_free(gpu);
    ferry_gpu_ipc_devices_free(gpu);
    pthread_cond_destroy(&gpu->runs_cond);
    pthread_mutex_destroy(&gpu->runs_lock);
    pthread_mutex_destroy(&gpu->peers_lock);
    ferry_settings_release(gpu_ipc_settings, FERRY_GPU_IPC_ARRAY_SIZE(gpu_ipc_settings),
                           &gpu->settings);
    free(gpu->address);
    free(gpu);
}

/* The devices this process sees, with their UUIDs; streams come later. */
static ferry_status_t devices_init(ferry_gpu_ipc_t *gpu)
{
    int n = gpu->vendor->device_count();
    if (n <= 0)
        return FERRY_ERR_UNSUPPORTED;
    if (n > FERRY_GPU_IPC_MAX_DEVICES)
        n = FERRY_GPU_IPC_MAX_DEVICES;
    gpu->devices = calloc((size_t)n, sizeof(*gpu->devices));
    if (gpu->devices == NULL)
        return FERRY_ERR_NO_MEMORY;
    gpu->n_devices = n;
    for (int i = 0; i < n; i++) {
        pthread_mutex_init(&gpu->devices[i].lock, NULL);
        ferry_status_t status = gpu->vendor->device_uuid(i, gpu->devices[i].uuid,
                                                         sizeof(gpu->devices[i].uuid));
        if (status != FERRY_OK) {
            ferry_error("%s: no UUID for device %d: %s", name, i, ferry_status_string(status));
            return status;
        }
        if (strchr(gpu->devices[i].uuid, ':') != NULL) {
            ferry_error("%s: device %d's UUID \"%s\" has a ':', which keys cannot carry", name,
                        i, gpu->devices[i].uuid);
            return FERRY_ERR_UNSUPPORTED;
        }
    }
    return FERRY_OK;
}

static ferry_status_t gpu_ipc_create(const ferry_transport_services_t *svc, void **ctx_p)
{
    if (svc == NULL || svc->slice_done == NULL)
        return FERRY_ERR_INVALID_PARAM;
    const ferry_accel_ops_t *vendor = ferry_gpu_ipc_vendor();
    char why[256] = "";
    ferry_status_t status = vendor->init(why, sizeof(why));
    if (status != FERRY_OK) {
        ferry_info("%s: not enabled: %s", name, why[0] ? why : ferry_status_string(status));
        return FERRY_ERR_UNSUPPORTED;
    }
    ferry_gpu_ipc_t *gpu = calloc(1, sizeof(*gpu));
    if (gpu == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(&gpu->svc, svc, FERRY_GPU_IPC_MIN(svc->size, sizeof(gpu->svc)));
    gpu->svc.size = sizeof(gpu->svc);
    gpu->vendor = vendor;
    pthread_mutex_init(&gpu->peers_lock, NULL);
    pthread_mutex_init(&gpu->runs_lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&gpu->runs_cond, &attr);
    pthread_condattr_destroy(&attr);
    status = ferry_settings_read(component, gpu_ipc_settings,
                                 FERRY_GPU_IPC_ARRAY_SIZE(gpu_ipc_settings), &gpu->settings);
    if (status == FERRY_OK && (gpu->settings.streams == 0 ||
                               gpu->settings.streams > FERRY_GPU_IPC_MAX_STREAMS)) {
        ferry_error("FERRY_%s_STREAMS=%u: give 1 to %d", component, gpu->settings.streams,
                    FERRY_GPU_IPC_MAX_STREAMS);
        status = FERRY_ERR_INVALID_PARAM;
    }
    if (status == FERRY_OK)
        status = devices_init(gpu);
    if (status == FERRY_OK) {
        ferry_process_identity(gpu->identity, sizeof(gpu->identity));
        size_t length = strlen(FERRY_GPU_IPC_PREFIX) + strlen(gpu->identity) +
                        strlen(vendor->kind) + 2;
        gpu->address = malloc(length);
        if (gpu->address == NULL)
            status = FERRY_ERR_NO_MEMORY;
        else
            snprintf(gpu->address, length, FERRY_GPU_IPC_PREFIX "%s:%s", gpu->identity,
                     vendor->kind);
    }
    if (status == FERRY_OK)
        status = ferry_gpu_ipc_thread_start(gpu);
    if (status != FERRY_OK) {
        gpu_ipc_destroy(gpu);
        return status;
    }
    *ctx_p = gpu;
    return FERRY_OK;
}

static ferry_status_t gpu_ipc_address(void *ctx, char **endpoint_p)
{
    *endpoint_p = strdup(((ferry_gpu_ipc_t *)ctx)->address);
    return *endpoint_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

/* A registered host buffer: no key (peers do not open our host memory),
 * but page-locked while registered, so that our copies between it and a
 * peer's device memory run at the bus's speed.  Failing to pin is no
 * failure: the copies work on pageable memory, slower. */
static ferry_status_t pin_host(ferry_gpu_ipc_t *gpu, void *addr, size_t length, void **memh_p)
{
    const ferry_accel_ops_t *vendor = gpu->vendor;
    if (!gpu->settings.pin_host || !FERRY_ACCEL_OPS_HAS(vendor, host_register) ||
        !FERRY_ACCEL_OPS_HAS(vendor, host_unregister))
        return FERRY_OK;
    ferry_gpu_ipc_memh_t *memh = calloc(1, sizeof(*memh));
    if (memh == NULL)
        return FERRY_ERR_NO_MEMORY;
    memh->device = -1;
    ferry_status_t status = vendor->host_register(addr, length);
    if (status == FERRY_OK) {
        memh->pinned = addr;
    } else if (status != FERRY_ERR_BUSY) {
        static atomic_int warned;
        if (atomic_exchange(&warned, 1) == 0)
            ferry_warn("%s: cannot page-lock host buffer [%p, +%zu): %s; copies between host "
                       "buffers and device memory run at pageable speed", name, addr, length,
                       ferry_status_string(status));
    }
    *memh_p = memh;
    return FERRY_OK;
}

static ferry_status_t gpu_ipc_mem_register(void *ctx, void *addr, size_t length,
                                           const char *location, char **key_p, void **memh_p)
{
    ferry_gpu_ipc_t *gpu = ctx;
    const ferry_accel_ops_t *vendor = gpu->vendor;
    *key_p = NULL;
    *memh_p = NULL;
    if (ferry_location_is_host(location) && !ferry_location_is_cxl(location))
        return pin_host(gpu, addr, length, memh_p);
    if (!ferry_location_is_kind(location, vendor->kind))
        return FERRY_ERR_UNSUPPORTED;
    ferry_accel_range_t range;
    ferry_status_t status = vendor->pointer_query(addr, &range);
    if (status != FERRY_OK) {
        ferry_error("%s: %p (location %s) is not %s device memory: %s", name, addr, location,
                    vendor->kind, ferry_status_string(status));
        return FERRY_ERR_INVALID_PARAM;
    }
    uintptr_t at = (uintptr_t)addr;
    if (at < range.base || length > range.length || at - range.base > range.length - length) {
        ferry_error("%s: [%p, +%zu) runs past its allocation [0x%" PRIxPTR ", +%zu)", name, addr,
                    length, range.base, range.length);
        return FERRY_ERR_OUT_OF_RANGE;
    }
    if (range.device < 0 || range.device >= gpu->n_devices) {
        ferry_error("%s: %p is on device %d, which we do not count", name, addr, range.device);
        return FERRY_ERR_INVALID_PARAM;
    }
    char handle[FERRY_ACCEL_HANDLE_MAX];
    status = vendor->ipc_export(&range, handle, sizeof(handle));
    if (status != FERRY_OK) {
        ferry_error("%s: cannot export the allocation of %p: %s", name, addr,
                    ferry_status_string(status));
        return status;
    }
    ferry_gpu_ipc_memh_t *memh = calloc(1, sizeof(*memh));
    if (memh == NULL)
        return FERRY_ERR_NO_MEMORY;
    memh->device = range.device;
    status = ferry_gpu_ipc_key_make(&range, gpu->devices[range.device].uuid, handle, key_p);
    if (status != FERRY_OK) {
        free(memh);
        return status;
    }
    *memh_p = memh;
    return FERRY_OK;
}

static void gpu_ipc_mem_deregister(void *ctx, void *arg)
{
    ferry_gpu_ipc_t *gpu = ctx;
    ferry_gpu_ipc_memh_t *memh = arg;
    /* A device buffer's export is the allocation's: it goes with it. */
    if (memh != NULL && memh->pinned != NULL)
        gpu->vendor->host_unregister(memh->pinned);
    free(memh);
}

static int gpu_ipc_local_memory(void *ctx, const char *location)
{
    ferry_gpu_ipc_t *gpu = ctx;
    return ferry_location_is_kind(location, gpu->vendor->kind) ||
           ferry_location_is_host(location);
}

static int gpu_ipc_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key)
{
    ferry_gpu_ipc_key_t key;
    if (peer == NULL || !peer->same_host || remote_key == NULL ||
        !ferry_gpu_ipc_key_parse(remote_key, &key))
        return FERRY_REACH_NO;
    ferry_gpu_ipc_peer_t *p = ferry_gpu_ipc_peer_get(ctx, peer);
    int reach = p != NULL && p->pid != 0;
    if (p != NULL)
        ferry_gpu_ipc_peer_put(p);
    return reach ? FERRY_REACH_YES : FERRY_REACH_NO;
}

static size_t gpu_ipc_slice_size(void *ctx)
{
    return ((ferry_gpu_ipc_t *)ctx)->settings.slice_size;
}

/* The counters are the process's: tests read them to count opens. */
static void gpu_ipc_info(FILE *out)
{
    const ferry_accel_ops_t *vendor = ferry_gpu_ipc_vendor();
    fprintf(out, "%s: GPU IPC transport for %s memory%s%s; this process opened %lu peer "
            "allocations, closed %lu", name, vendor->kind,
            vendor->hardware_note ? "; " : "", vendor->hardware_note ? vendor->hardware_note : "",
            atomic_load(&ferry_gpu_ipc_opens), atomic_load(&ferry_gpu_ipc_closes));
    unsigned long any = atomic_load(&ferry_gpu_ipc_opens_on[0]);
    if (any)
        fprintf(out, "; opens on the vendor's choice of device: %lu", any);
    for (int d = 0; d < FERRY_GPU_IPC_MAX_DEVICES; d++) {
        unsigned long n = atomic_load(&ferry_gpu_ipc_opens_on[1 + d]);
        if (n)
            fprintf(out, "; opens on device %d: %lu", d, n);
    }
    fputc('\n', out);
}

static const ferry_transport_ops_t gpu_ipc_ops = {
    .size = sizeof(ferry_transport_ops_t),
    .create = gpu_ipc_create,
    .destroy = gpu_ipc_destroy,
    .address = gpu_ipc_address,
    .mem_register = gpu_ipc_mem_register,
    .mem_deregister = gpu_ipc_mem_deregister,
    .reaches = gpu_ipc_reaches,
    .submit = ferry_gpu_ipc_submit,
    .peer_forget = ferry_gpu_ipc_peer_forget,
    .slice_size = gpu_ipc_slice_size,
    .progress = ferry_gpu_ipc_progress,
    .peer_changed = ferry_gpu_ipc_peer_changed,
    .peer_cache_release = ferry_gpu_ipc_peer_cache_release,
    .stop = ferry_gpu_ipc_stop,
    .local_memory = gpu_ipc_local_memory,
};

static ferry_plugin_t gpu_ipc_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_TRANSPORT,
    .priority = GPU_IPC_PRIORITY,
    /* Not opt-in: with no library or no device the engine leaves the
     * transport out without a word, since its vendor is not usable (the
     * vendor's one line is at info level and in ferry_info); a failure of a
     * usable one is a warning, not the engine's failure. */
    .flags = FERRY_TRANSPORT_SAME_HOST_ONLY | FERRY_TRANSPORT_ONE_SIDED |
             FERRY_TRANSPORT_KEY_GRANTS_READ,
    .settings = gpu_ipc_settings,
    .settings_count = FERRY_GPU_IPC_ARRAY_SIZE(gpu_ipc_settings),
    .ops = &gpu_ipc_ops,
    .info = gpu_ipc_info,
};

static pthread_once_t plugin_once = PTHREAD_ONCE_INIT;

static void plugin_init(void)
{
    const ferry_accel_ops_t *vendor = ferry_gpu_ipc_vendor();
    snprintf(name, sizeof(name), "%s_ipc", vendor->kind);
    size_t i = 0;
    for (; name[i] != '\0' && i + 1 < sizeof(component); i++)
        component[i] = name[i] >= 'a' && name[i] <= 'z' ? (char)(name[i] - 'a' + 'A') : name[i];
    component[i] = '\0';
    snprintf(description, sizeof(description),
             "same-host copies between %s device memory of two processes (IPC handles, "
             "asynchronous copies)", vendor->kind);
    gpu_ipc_plugin.name = name;
    gpu_ipc_plugin.description = description;
    gpu_ipc_plugin.settings_component = component;
    gpu_ipc_plugin.accel = vendor;
}

__attribute__((visibility("default"))) const ferry_plugin_t *ferry_plugin_entry(void)
{
    pthread_once(&plugin_once, plugin_init);
    return &gpu_ipc_plugin;
}
