/*
 * The HIP vendor (accel.h) for AMD GPUs: the same table as the CUDA vendor
 * over the HIP runtime API.
 *
 * libamdhip64 is opened with dlopen when init runs (neither libferry nor
 * this module links it); hip_runtime_api.h of HIP 5.2 is used for types and
 * prototypes only.  Because structures such as hipPointerAttribute_t and
 * the hipMemoryType values changed in HIP 6, a runtime whose major version
 * is not the headers' is refused at init rather than misread.
 *
 * The current device: HIP keeps one per thread and has no context stack,
 * so every call that needs a device saves the thread's device, sets ours
 * and restores the saved one (enter/leave).
 *
 * Handles: "hip-ipc:<128 hex>" (hipIpcGetMemHandle of the allocation's
 * base); the opener learns the true length with hipMemGetAddressRange.
 * HIP 5.2 has no buffer id attribute: ranges carry buffer_id 0 (unknown).
 *
 * Untested: built against the Debian HIP 5.2 headers, never run on AMD
 * hardware (hardware_note says so).  To check there: pointer_query of
 * host, device and opened memory; hipMemGetAddressRange of an opened IPC
 * pointer; hipDeviceGetUuid on the GPU at hand (PCI bus id fallback).
 */
#include <ferry/accel.h>
#include <ferry/plugin.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

#include "../accel_hex.h"

#define HIP_MAX_DEVICES 64
#define HIP_PREFIX      "hip-ipc:"

#define HIP_FUNCTIONS(X)                                                                           \
    X(hipGetErrorName)                                                                             \
    X(hipInit)                                                                                     \
    X(hipRuntimeGetVersion)                                                                        \
    X(hipGetDeviceCount)                                                                           \
    X(hipGetDevice)                                                                                \
    X(hipSetDevice)                                                                                \
    X(hipDeviceGet)                                                                                \
    X(hipDeviceGetName)                                                                            \
    X(hipDeviceTotalMem)                                                                           \
    X(hipDeviceGetUuid)                                                                            \
    X(hipDeviceGetPCIBusId)                                                                        \
    X(hipPointerGetAttributes)                                                                     \
    X(hipMemGetAddressRange)                                                                       \
    X(hipMalloc)                                                                                   \
    X(hipFree)                                                                                     \
    X(hipHostMalloc)                                                                               \
    X(hipHostFree)                                                                                 \
    X(hipHostRegister)                                                                             \
    X(hipHostUnregister)                                                                           \
    X(hipIpcGetMemHandle)                                                                          \
    X(hipIpcOpenMemHandle)                                                                         \
    X(hipIpcCloseMemHandle)                                                                        \
    X(hipStreamCreateWithFlags)                                                                    \
    X(hipStreamDestroy)                                                                            \
    X(hipMemcpy)                                                                                   \
    X(hipMemcpyAsync)                                                                              \
    X(hipEventCreateWithFlags)                                                                     \
    X(hipEventDestroy)                                                                             \
    X(hipEventRecord)                                                                              \
    X(hipEventQuery)                                                                               \
    X(hipEventSynchronize)

#define HIP_MEMBER(name) __typeof__(name) *name;
typedef struct hip_api {
    HIP_FUNCTIONS(HIP_MEMBER)
} hip_api_t;
#undef HIP_MEMBER

static hip_api_t hip;
static pthread_once_t hip_once = PTHREAD_ONCE_INIT;
static ferry_status_t hip_init_status;
static char hip_init_why[256];
static int hip_device_total;

/* ---- errors, init, the current device ---- */

static const char *error_name(hipError_t error)
{
    const char *name = hip.hipGetErrorName != NULL ? hip.hipGetErrorName(error) : NULL;
    return name != NULL ? name : "unnamed HIP error";
}

static ferry_status_t hip_failed(const char *what, hipError_t error)
{
    ferry_error("hip: %s: %s (%d)", what, error_name(error), (int)error);
    switch (error) {
    case hipErrorOutOfMemory:
        return FERRY_ERR_NO_MEMORY;
    case hipErrorInvalidValue:
        return FERRY_ERR_INVALID_PARAM;
    default:
        return FERRY_ERR_IO;
    }
}

static void *open_library(void)
{
    /* The versioned name first: it is the ABI the headers describe. */
    void *library = dlopen("libamdhip64.so.5", RTLD_NOW | RTLD_LOCAL);
    if (library != NULL)
        return library;
    const char *error = dlerror();
    snprintf(hip_init_why, sizeof(hip_init_why), "hip: libamdhip64.so.5: cannot open (%s)",
             error != NULL ? error : "dlopen failed");
    return dlopen("libamdhip64.so", RTLD_NOW | RTLD_LOCAL);
}

static int resolve(void *library)
{
    static const struct {
        const char *name;
        size_t offset;
    } symbols[] = {
#define HIP_SYMBOL(name) {#name, offsetof(hip_api_t, name)},
        HIP_FUNCTIONS(HIP_SYMBOL)
#undef HIP_SYMBOL
    };
    for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
        void *function = dlsym(library, symbols[i].name);
        if (function == NULL) {
            snprintf(hip_init_why, sizeof(hip_init_why), "hip: libamdhip64 has no %s",
                     symbols[i].name);
            return -1;
        }
        memcpy((char *)&hip + symbols[i].offset, &function, sizeof(function));
    }
    return 0;
}

/* Everything init checks once the library is loaded; hip_init_why on failure. */
static int runtime_usable(void)
{
    int version = 0;
    if (hip.hipRuntimeGetVersion(&version) != hipSuccess)
        version = 0;
    /* HIP_VERSION is major * 10000000 + minor * 100000 + patch */
    if (version / 10000000 != HIP_VERSION_MAJOR) {
        snprintf(hip_init_why, sizeof(hip_init_why),
                 "hip: the runtime is HIP %d.%d, this module was built for HIP %d",
                 version / 10000000, version / 100000 % 100, HIP_VERSION_MAJOR);
        return 0;
    }
    hipError_t error = hip.hipInit(0);
    if (error != hipSuccess) {
        snprintf(hip_init_why, sizeof(hip_init_why), "hip: no device (hipInit: %s)",
                 error_name(error));
        return 0;
    }
    int count = 0;
    error = hip.hipGetDeviceCount(&count);
    if (error != hipSuccess || count <= 0) {
        snprintf(hip_init_why, sizeof(hip_init_why), "hip: no device (hipGetDeviceCount: %s)",
                 error == hipSuccess ? "0 devices" : error_name(error));
        return 0;
    }
    hip_device_total = count < HIP_MAX_DEVICES ? count : HIP_MAX_DEVICES;
    return 1;
}

static void hip_init_once(void)
{
    void *library = open_library();
    if (library == NULL) {
        hip_init_status = FERRY_ERR_UNSUPPORTED;
        return;
    }
    if (resolve(library) != 0 || !runtime_usable()) {
        memset(&hip, 0, sizeof(hip));
        hip_device_total = 0;
        /* Not closed: a runtime that initialized part way keeps what it
         * allocated in its own globals, and unloading it would strand
         * that (LeakSanitizer reports it; the next open would not see it). */
        hip_init_status = FERRY_ERR_UNSUPPORTED;
        return;
    }
    /* loaded for the life of the process, like the memory it hands out */
    hip_init_status = FERRY_OK;
}

static ferry_status_t hip_init(char *why, size_t why_length)
{
    pthread_once(&hip_once, hip_init_once);
    if (hip_init_status != FERRY_OK && why != NULL && why_length > 0)
        snprintf(why, why_length, "%s", hip_init_why);
    return hip_init_status;
}

static int hip_ready(void)
{
    return hip_init(NULL, 0) == FERRY_OK;
}

static int device_valid(int device)
{
    return hip_ready() && device >= 0 && device < hip_device_total;
}

/* Make device current on this thread; *saved_p: the device to restore. */
static ferry_status_t enter(int device, int *saved_p)
{
    if (!device_valid(device))
        return FERRY_ERR_INVALID_PARAM;
    hipError_t error = hip.hipGetDevice(saved_p);
    if (error != hipSuccess)
        return hip_failed("hipGetDevice", error);
    if (*saved_p == device)
        return FERRY_OK;
    error = hip.hipSetDevice(device);
    return error == hipSuccess ? FERRY_OK : hip_failed("hipSetDevice", error);
}

static void leave(int device, int saved)
{
    if (saved != device)
        hip.hipSetDevice(saved);
}

/* ---- devices ---- */

static int hip_device_count(void)
{
    return hip_ready() ? hip_device_total : 0;
}

static ferry_status_t hip_device_uuid(int device, char *uuid, size_t length)
{
    if (!device_valid(device) || uuid == NULL)
        return FERRY_ERR_INVALID_PARAM;
    hipDevice_t handle;
    hipUUID id;
    memset(&id, 0, sizeof(id));
    int known = hip.hipDeviceGet(&handle, device) == hipSuccess &&
                hip.hipDeviceGetUuid(&id, handle) == hipSuccess;
    const unsigned char *b = (const unsigned char *)id.bytes;
    static const unsigned char zero[16];
    if (memcmp(b, zero, sizeof(zero)) == 0)
        known = 0; /* some GPUs answer all zeros */
    int n;
    if (known) {
        n = snprintf(uuid, length,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                     b[12], b[13], b[14], b[15]);
    } else {
        /* The PCI address names the physical device as well, host-wide. */
        char bus[64] = "";
        hipError_t error = hip.hipDeviceGetPCIBusId(bus, (int)sizeof(bus), device);
        if (error != hipSuccess)
            return hip_failed("hipDeviceGetPCIBusId", error);
        n = snprintf(uuid, length, "HIP-PCI-%s", bus);
    }
    return n >= 0 && (size_t)n < length ? FERRY_OK : FERRY_ERR_INVALID_PARAM;
}

static ferry_status_t hip_device_describe(int device, char *text, size_t length)
{
    if (!device_valid(device) || text == NULL)
        return FERRY_ERR_INVALID_PARAM;
    hipDevice_t handle;
    char name[128] = "", bus[64] = "?";
    size_t memory = 0;
    if (hip.hipDeviceGet(&handle, device) != hipSuccess ||
        hip.hipDeviceGetName(name, (int)sizeof(name), handle) != hipSuccess)
        snprintf(name, sizeof(name), "HIP device %d", device);
    else if (hip.hipDeviceTotalMem(&memory, handle) != hipSuccess)
        memory = 0;
    if (hip.hipDeviceGetPCIBusId(bus, (int)sizeof(bus), device) != hipSuccess)
        snprintf(bus, sizeof(bus), "?");
    snprintf(text, length, "%s (PCI %s), %.1f GiB, handles: HIP IPC", name, bus,
             (double)memory / (1024.0 * 1024 * 1024));
    return FERRY_OK;
}

/* ---- memory ---- */

static ferry_status_t hip_pointer_query(const void *ptr, ferry_accel_range_t *range_p)
{
    if (!hip_ready() || ptr == NULL)
        return FERRY_ERR_NOT_FOUND;
    hipPointerAttribute_t attributes;
    memset(&attributes, 0, sizeof(attributes));
    /* host memory HIP does not know: an error, not a fault */
    if (hip.hipPointerGetAttributes(&attributes, ptr) != hipSuccess ||
        attributes.memoryType != hipMemoryTypeDevice || attributes.isManaged ||
        attributes.device < 0 || attributes.device >= hip_device_total)
        return FERRY_ERR_NOT_FOUND;
    hipDeviceptr_t base = NULL;
    size_t size = 0;
    if (hip.hipMemGetAddressRange(&base, &size, (hipDeviceptr_t)ptr) != hipSuccess || size == 0)
        return FERRY_ERR_NOT_FOUND;
    if (range_p != NULL)
        *range_p = (ferry_accel_range_t){(uintptr_t)base, size, attributes.device, 0};
    return FERRY_OK;
}

static ferry_status_t hip_mem_alloc(int device, size_t length, void **ptr_p)
{
    int saved;
    if (length == 0 || ptr_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = enter(device, &saved);
    if (status != FERRY_OK)
        return status;
    hipError_t error = hip.hipMalloc(ptr_p, length);
    leave(device, saved);
    return error == hipSuccess ? FERRY_OK : hip_failed("hipMalloc", error);
}

static void hip_mem_free(void *ptr)
{
    ferry_accel_range_t range;
    int saved;
    if (ptr == NULL)
        return;
    if (hip_pointer_query(ptr, &range) != FERRY_OK) {
        ferry_error("hip: mem_free of %p, which is no device memory", ptr);
        return;
    }
    if (enter(range.device, &saved) != FERRY_OK)
        return;
    hipError_t error = hip.hipFree(ptr);
    leave(range.device, saved);
    if (error != hipSuccess)
        hip_failed("hipFree", error);
}

static ferry_status_t hip_host_alloc(size_t length, void **ptr_p)
{
    if (!hip_ready() || length == 0 || ptr_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    /* portable: pinned for every device, whichever is current */
    hipError_t error = hip.hipHostMalloc(ptr_p, length, hipHostMallocPortable);
    return error == hipSuccess ? FERRY_OK : hip_failed("hipHostMalloc", error);
}

static void hip_host_free(void *ptr)
{
    if (ptr == NULL || !hip_ready())
        return;
    hipError_t error = hip.hipHostFree(ptr);
    if (error != hipSuccess)
        hip_failed("hipHostFree", error);
}

/* Page-lock the application's host buffer (portable: for every device). */
static ferry_status_t hip_host_register(void *ptr, size_t length)
{
    if (!hip_ready() || ptr == NULL || length == 0)
        return FERRY_ERR_INVALID_PARAM;
    hipError_t error = hip.hipHostRegister(ptr, length, hipHostRegisterPortable);
    if (error == hipErrorHostMemoryAlreadyRegistered)
        return FERRY_ERR_BUSY; /* the application's: used as it is, never undone by us */
    return error == hipSuccess ? FERRY_OK : hip_failed("hipHostRegister", error);
}

static void hip_host_unregister(void *ptr)
{
    if (ptr == NULL || !hip_ready())
        return;
    hipError_t error = hip.hipHostUnregister(ptr);
    if (error != hipSuccess)
        hip_failed("hipHostUnregister", error);
}

/* ---- IPC ---- */

typedef struct hip_opened {
    void *ptr;
    int device;
} hip_opened_t;

static ferry_status_t hip_ipc_export(const ferry_accel_range_t *range, char *handle, size_t length)
{
    int saved;
    if (range == NULL || handle == NULL || length < sizeof(HIP_PREFIX) + 2 * HIP_IPC_HANDLE_SIZE)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = enter(range->device, &saved);
    if (status != FERRY_OK)
        return status;
    hipIpcMemHandle_t ipc;
    hipError_t error = hip.hipIpcGetMemHandle(&ipc, (void *)range->base);
    leave(range->device, saved);
    if (error != hipSuccess)
        return hip_failed("hipIpcGetMemHandle", error);
    size_t prefix = strlen(HIP_PREFIX);
    memcpy(handle, HIP_PREFIX, prefix);
    ferry_accel_hex_encode(ipc.reserved, HIP_IPC_HANDLE_SIZE, handle + prefix, length - prefix);
    return FERRY_OK;
}

static int parse_handle(const char *handle, hipIpcMemHandle_t *ipc)
{
    if (strncmp(handle, HIP_PREFIX, strlen(HIP_PREFIX)) != 0)
        return 0;
    return ferry_accel_hex_decode(handle + strlen(HIP_PREFIX), ipc->reserved,
                                  HIP_IPC_HANDLE_SIZE) == 0;
}

static ferry_status_t hip_ipc_open(const char *handle, long owner_pid, int device, void **base_p,
                                   size_t *length_p, void **opened_p)
{
    hipIpcMemHandle_t ipc;
    int saved;
    if (!hip_ready())
        return FERRY_ERR_UNSUPPORTED;
    if (device == -1)
        device = 0;
    if (handle == NULL || !parse_handle(handle, &ipc) || !device_valid(device) || owner_pid <= 0)
        return FERRY_ERR_INVALID_PARAM;
    if (kill((pid_t)owner_pid, 0) != 0 && errno == ESRCH)
        return FERRY_ERR_STALE;
    hip_opened_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = enter(device, &saved);
    if (status != FERRY_OK) {
        free(o);
        return status;
    }
    hipDeviceptr_t base = NULL;
    size_t size = 0;
    hipError_t error = hip.hipIpcOpenMemHandle(&o->ptr, ipc, hipIpcMemLazyEnablePeerAccess);
    if (error == hipSuccess) {
        /* what is really mapped, not what anyone claims */
        error = hip.hipMemGetAddressRange(&base, &size, o->ptr);
        if (error != hipSuccess) {
            hip_failed("hipMemGetAddressRange of an opened handle", error);
            hip.hipIpcCloseMemHandle(o->ptr);
        }
    }
    leave(device, saved);
    if (error != hipSuccess) {
        free(o);
        if (error == hipErrorOutOfMemory)
            return hip_failed("hipIpcOpenMemHandle", error);
        ferry_warn("hip: cannot open a peer's IPC handle: %s", error_name(error));
        return FERRY_ERR_STALE; /* freed, owner gone, or forged: HIP does not say */
    }
    o->device = device;
    *base_p = base;
    *length_p = size;
    *opened_p = o;
    return FERRY_OK;
}

static void hip_ipc_close(void *opened)
{
    hip_opened_t *o = opened;
    int saved;
    if (o == NULL)
        return;
    if (enter(o->device, &saved) == FERRY_OK) {
        hipError_t error = hip.hipIpcCloseMemHandle(o->ptr);
        leave(o->device, saved);
        if (error != hipSuccess)
            hip_failed("hipIpcCloseMemHandle", error);
    }
    free(o);
}

/* ---- streams, events, copies ---- */

/* A stream or an event, and the device it was made on (set again for
 * every later call on it). */
typedef struct hip_object {
    union {
        hipStream_t stream;
        hipEvent_t event;
    };
    int device;
    int saved; /* the thread's device during creation */
} hip_object_t;

/* Creation in two halves around the runtime call: check, allocate and
 * enter; then leave and hand out (or free on failure). */
static ferry_status_t object_begin(int device, void **out_p, hip_object_t **o_p)
{
    if (!device_valid(device) || out_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    hip_object_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = enter(device, &o->saved);
    if (status != FERRY_OK) {
        free(o);
        return status;
    }
    o->device = device;
    *o_p = o;
    return FERRY_OK;
}

static ferry_status_t object_end(hip_object_t *o, hipError_t error, const char *what, void **out_p)
{
    leave(o->device, o->saved);
    if (error != hipSuccess) {
        free(o);
        return hip_failed(what, error);
    }
    *out_p = o;
    return FERRY_OK;
}

static void object_destroy(hip_object_t *o, int is_event)
{
    int saved;
    if (o == NULL)
        return;
    if (enter(o->device, &saved) == FERRY_OK) {
        hipError_t error =
            is_event ? hip.hipEventDestroy(o->event) : hip.hipStreamDestroy(o->stream);
        leave(o->device, saved);
        if (error != hipSuccess)
            hip_failed(is_event ? "hipEventDestroy" : "hipStreamDestroy", error);
    }
    free(o);
}

static ferry_status_t hip_stream_create(int device, void **stream_p)
{
    hip_object_t *s;
    ferry_status_t status = object_begin(device, stream_p, &s);
    if (status != FERRY_OK)
        return status;
    /* non-blocking: independent of the application's null stream */
    return object_end(s, hip.hipStreamCreateWithFlags(&s->stream, hipStreamNonBlocking),
                      "hipStreamCreateWithFlags", stream_p);
}

static void hip_stream_destroy(void *stream)
{
    object_destroy(stream, 0);
}

static ferry_status_t hip_copy_async(void *stream, void *dst, const void *src, size_t length)
{
    hip_object_t *s = stream;
    int saved;
    if (s == NULL || (length > 0 && (dst == NULL || src == NULL)))
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = enter(s->device, &saved);
    if (status != FERRY_OK)
        return status;
    hipError_t error = hip.hipMemcpyAsync(dst, src, length, hipMemcpyDefault, s->stream);
    leave(s->device, saved);
    return error == hipSuccess ? FERRY_OK : hip_failed("hipMemcpyAsync", error);
}

static ferry_status_t hip_event_create(int device, void **event_p)
{
    hip_object_t *e;
    ferry_status_t status = object_begin(device, event_p, &e);
    if (status != FERRY_OK)
        return status;
    /* no timing (cheaper), blocking sync (event_wait sleeps) */
    return object_end(
        e, hip.hipEventCreateWithFlags(&e->event, hipEventDisableTiming | hipEventBlockingSync),
        "hipEventCreateWithFlags", event_p);
}

static void hip_event_destroy(void *event)
{
    object_destroy(event, 1);
}

static ferry_status_t hip_event_record(void *event, void *stream)
{
    hip_object_t *e = event;
    hip_object_t *s = stream;
    int saved;
    if (e == NULL || s == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = enter(s->device, &saved);
    if (status != FERRY_OK)
        return status;
    hipError_t error = hip.hipEventRecord(e->event, s->stream);
    leave(s->device, saved);
    return error == hipSuccess ? FERRY_OK : hip_failed("hipEventRecord", error);
}

static ferry_status_t hip_event_query(void *event)
{
    hip_object_t *e = event;
    if (e == NULL || !hip_ready())
        return FERRY_ERR_INVALID_PARAM;
    hipError_t error = hip.hipEventQuery(e->event);
    if (error == hipSuccess)
        return FERRY_OK;
    return error == hipErrorNotReady ? FERRY_INPROGRESS : hip_failed("hipEventQuery", error);
}

static ferry_status_t hip_event_wait(void *event)
{
    hip_object_t *e = event;
    if (e == NULL || !hip_ready())
        return FERRY_ERR_INVALID_PARAM;
    hipError_t error = hip.hipEventSynchronize(e->event);
    return error == hipSuccess ? FERRY_OK : hip_failed("hipEventSynchronize", error);
}

static ferry_status_t hip_copy(void *dst, const void *src, size_t length)
{
    ferry_accel_range_t range;
    int saved;
    if (length == 0)
        return FERRY_OK;
    if (dst == NULL || src == NULL)
        return FERRY_ERR_INVALID_PARAM;
    /* on the device of whichever end is device memory; host to host
     * needs no runtime */
    if (hip_pointer_query(dst, &range) != FERRY_OK && hip_pointer_query(src, &range) != FERRY_OK) {
        memmove(dst, src, length);
        return FERRY_OK;
    }
    ferry_status_t status = enter(range.device, &saved);
    if (status != FERRY_OK)
        return status;
    hipError_t error = hip.hipMemcpy(dst, src, length, hipMemcpyDefault);
    leave(range.device, saved);
    return error == hipSuccess ? FERRY_OK : hip_failed("hipMemcpy", error);
}

static const ferry_accel_ops_t hip_ops = {
    .size = sizeof(ferry_accel_ops_t),
    .kind = "hip",
    .hardware_note = "built, not run on AMD hardware",
    .init = hip_init,
    .device_count = hip_device_count,
    .device_uuid = hip_device_uuid,
    .device_describe = hip_device_describe,
    .pointer_query = hip_pointer_query,
    .mem_alloc = hip_mem_alloc,
    .mem_free = hip_mem_free,
    .host_alloc = hip_host_alloc,
    .host_free = hip_host_free,
    .ipc_export = hip_ipc_export,
    .ipc_open = hip_ipc_open,
    .ipc_close = hip_ipc_close,
    .stream_create = hip_stream_create,
    .stream_destroy = hip_stream_destroy,
    .copy_async = hip_copy_async,
    .event_create = hip_event_create,
    .event_destroy = hip_event_destroy,
    .event_record = hip_event_record,
    .event_query = hip_event_query,
    .event_wait = hip_event_wait,
    .copy = hip_copy,
    .host_register = hip_host_register,
    .host_unregister = hip_host_unregister,
};

const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void);

const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void)
{
    return &hip_ops;
}
