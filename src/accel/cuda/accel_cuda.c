/*
 * The CUDA vendor: init (dlopen of libcuda.so.1), devices, memory, streams,
 * events and copies.  IPC is in accel_cuda_ipc.c; the design is in
 * accel_cuda.h.
 *
 * Untested: no GPU where this was written; it compiles warning-free against
 * the CUDA 13 headers.  Behaviour taken from the driver API documentation
 * and what was seen on the GPU machine (legacy handles open at the block
 * base; VMM POSIX fd handles pass with pidfd_getfd).
 */
#include "accel_cuda.h"
#include "../accel_fd.h"

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_LIBRARY     "libcuda.so.1"
#define CUDA_MAX_DEVICES 64
#define CUDA_STR2(x)     #x
#define CUDA_STR(x)      CUDA_STR2(x) /* the versioned name cuda.h maps a base name to */

cuda_api_t ferry_cuda;
pthread_mutex_t ferry_cuda_lock = PTHREAD_MUTEX_INITIALIZER;
int ferry_cuda_device_total;

static cuda_device_t cuda_devices[CUDA_MAX_DEVICES];
static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static ferry_status_t cuda_init_status;
static char cuda_init_why[256];

/* ---- errors and contexts ---- */

/* cuGetErrorName's answer; the stub library (no driver) answers nothing,
 * so the errors init meets there are named here. */
static const char *result_name(CUresult result)
{
    const char *name = NULL;
    if (ferry_cuda.cuGetErrorName != NULL &&
        ferry_cuda.cuGetErrorName(result, &name) == CUDA_SUCCESS && name != NULL)
        return name;
    switch (result) {
    case CUDA_ERROR_NO_DEVICE:
        return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_STUB_LIBRARY:
        return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
        return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case CUDA_ERROR_OPERATING_SYSTEM:
        return "CUDA_ERROR_OPERATING_SYSTEM";
    default:
        return "CUDA error (unnamed)";
    }
}

ferry_status_t ferry_cuda_failed(const char *what, CUresult result)
{
    ferry_error("cuda: %s: %s (%d)", what, result_name(result), (int)result);
    switch (result) {
    case CUDA_ERROR_OUT_OF_MEMORY:
        return FERRY_ERR_NO_MEMORY;
    case CUDA_ERROR_INVALID_VALUE:
        return FERRY_ERR_INVALID_PARAM;
    default:
        return FERRY_ERR_IO;
    }
}

static ferry_status_t cuda_init(char *why, size_t why_length);

int ferry_cuda_ready(void)
{
    return cuda_init(NULL, 0) == FERRY_OK;
}

ferry_status_t ferry_cuda_enter(int device)
{
    if (!ferry_cuda_ready() || device < 0 || device >= ferry_cuda_device_total)
        return FERRY_ERR_INVALID_PARAM;
    cuda_device_t *d = &cuda_devices[device];
    pthread_mutex_lock(&ferry_cuda_lock);
    if (d->context == NULL) {
        /* Retaining creates the context (about 150 ms and some device
         * memory): only for devices this process really uses. */
        CUresult result = ferry_cuda.cuDevicePrimaryCtxRetain(&d->context, d->handle);
        if (result != CUDA_SUCCESS) {
            d->context = NULL;
            pthread_mutex_unlock(&ferry_cuda_lock);
            return ferry_cuda_failed("cuDevicePrimaryCtxRetain", result);
        }
    }
    CUcontext context = d->context;
    pthread_mutex_unlock(&ferry_cuda_lock);
    CUresult result = ferry_cuda.cuCtxPushCurrent(context);
    return result == CUDA_SUCCESS ? FERRY_OK : ferry_cuda_failed("cuCtxPushCurrent", result);
}

void ferry_cuda_leave(void)
{
    CUcontext popped;
    CUresult result = ferry_cuda.cuCtxPopCurrent(&popped);
    if (result != CUDA_SUCCESS)
        ferry_cuda_failed("cuCtxPopCurrent", result);
}

/* ---- init ---- */

static int resolve(void *library)
{
    static const struct {
        const char *base, *versioned;
        size_t offset;
    } symbols[] = {
#define CUDA_SYMBOL(name) {#name, CUDA_STR(name), offsetof(cuda_api_t, name)},
        CUDA_FUNCTIONS(CUDA_SYMBOL)
#undef CUDA_SYMBOL
    };
    __typeof__(cuGetProcAddress_v2) *get_proc = NULL;
    void *p = dlsym(library, "cuGetProcAddress_v2");
    memcpy(&get_proc, &p, sizeof(p));
    for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
        void *function = NULL;
        CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        if (get_proc == NULL ||
            get_proc(symbols[i].base, &function, CUDA_ABI_VERSION,
                     CU_GET_PROC_ADDRESS_LEGACY_STREAM, &found) != CUDA_SUCCESS ||
            found != CU_GET_PROC_ADDRESS_SUCCESS)
            function = dlsym(library, symbols[i].versioned);
        if (function == NULL) {
            snprintf(cuda_init_why, sizeof(cuda_init_why),
                     "cuda: " CUDA_LIBRARY " has no %s (driver older than CUDA 12?)",
                     symbols[i].versioned);
            return -1;
        }
        memcpy((char *)&ferry_cuda + symbols[i].offset, &function, sizeof(function));
    }
    return 0;
}

/* The library stays loaded: a driver that initialized part way keeps what
 * it allocated in its own globals, and unloading it would strand that. */
static ferry_status_t init_failed(void *library)
{
    (void)library;
    memset(&ferry_cuda, 0, sizeof(ferry_cuda));
    return FERRY_ERR_UNSUPPORTED;
}

static ferry_status_t init_devices(void)
{
    int count = 0;
    CUresult result = ferry_cuda.cuDeviceGetCount(&count);
    if (result != CUDA_SUCCESS || count <= 0) {
        snprintf(cuda_init_why, sizeof(cuda_init_why), "cuda: no device (cuDeviceGetCount: %s)",
                 result == CUDA_SUCCESS ? "0" : result_name(result));
        return FERRY_ERR_UNSUPPORTED;
    }
    if (count > CUDA_MAX_DEVICES)
        count = CUDA_MAX_DEVICES;
    for (int i = 0; i < count; i++) {
        result = ferry_cuda.cuDeviceGet(&cuda_devices[i].handle, i);
        if (result != CUDA_SUCCESS) {
            snprintf(cuda_init_why, sizeof(cuda_init_why), "cuda: cuDeviceGet(%d): %s", i,
                     result_name(result));
            return FERRY_ERR_UNSUPPORTED;
        }
    }
    ferry_cuda_device_total = count;
    return FERRY_OK;
}

static void cuda_init_once(void)
{
    void *library = dlopen(CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        const char *error = dlerror();
        snprintf(cuda_init_why, sizeof(cuda_init_why), "cuda: " CUDA_LIBRARY ": cannot open (%s)",
                 error != NULL ? error : "dlopen failed");
        cuda_init_status = FERRY_ERR_UNSUPPORTED;
        return;
    }
    __typeof__(cuInit) *init = NULL;
    void *p = dlsym(library, "cuInit");
    memcpy(&init, &p, sizeof(p));
    if (init == NULL) {
        snprintf(cuda_init_why, sizeof(cuda_init_why), "cuda: " CUDA_LIBRARY " has no cuInit");
        cuda_init_status = init_failed(library);
        return;
    }
    if (resolve(library) != 0) {
        cuda_init_status = init_failed(library);
        return;
    }
    CUresult result = init(0);
    if (result != CUDA_SUCCESS) {
        snprintf(cuda_init_why, sizeof(cuda_init_why), "cuda: no device (cuInit: %s)",
                 result_name(result));
        cuda_init_status = init_failed(library);
        return;
    }
    if (init_devices() != FERRY_OK) {
        cuda_init_status = init_failed(library);
        return;
    }
    int version = 0;
    ferry_cuda.cuDriverGetVersion(&version);
    ferry_debug("cuda: driver %d.%d, %d devices", version / 1000, version % 1000 / 10,
                ferry_cuda_device_total);
    ferry_accel_fd_allow_peers(); /* peers take our VMM descriptors with pidfd_getfd */
    /* The library stays loaded for the life of the process: contexts,
     * streams and memory outlive any one caller. */
    cuda_init_status = FERRY_OK;
}

static ferry_status_t cuda_init(char *why, size_t why_length)
{
    pthread_once(&cuda_once, cuda_init_once);
    if (cuda_init_status != FERRY_OK && why != NULL && why_length > 0)
        snprintf(why, why_length, "%s", cuda_init_why);
    return cuda_init_status;
}

/* ---- devices ---- */

static int cuda_device_count(void)
{
    return ferry_cuda_ready() ? ferry_cuda_device_total : 0;
}

static int device_valid(int device)
{
    return ferry_cuda_ready() && device >= 0 && device < ferry_cuda_device_total;
}

static ferry_status_t cuda_device_uuid(int device, char *uuid, size_t length)
{
    if (!device_valid(device) || uuid == NULL)
        return FERRY_ERR_INVALID_PARAM;
    CUuuid id;
    CUresult result = ferry_cuda.cuDeviceGetUuid(&id, cuda_devices[device].handle);
    if (result != CUDA_SUCCESS)
        return ferry_cuda_failed("cuDeviceGetUuid", result);
    const unsigned char *b = (const unsigned char *)id.bytes;
    /* nvidia-smi's spelling, so logs and CUDA_VISIBLE_DEVICES=GPU-... agree */
    int n = snprintf(uuid, length,
                     "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                     b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
                     b[12], b[13], b[14], b[15]);
    return n >= 0 && (size_t)n < length ? FERRY_OK : FERRY_ERR_INVALID_PARAM;
}

static int device_attribute(CUdevice_attribute attribute, int device)
{
    int value = 0;
    if (ferry_cuda.cuDeviceGetAttribute(&value, attribute, cuda_devices[device].handle) !=
        CUDA_SUCCESS)
        return 0;
    return value;
}

static ferry_status_t cuda_device_describe(int device, char *text, size_t length)
{
    if (!device_valid(device) || text == NULL)
        return FERRY_ERR_INVALID_PARAM;
    char name[128] = "";
    size_t memory = 0;
    CUdevice handle = cuda_devices[device].handle;
    if (ferry_cuda.cuDeviceGetName(name, (int)sizeof(name), handle) != CUDA_SUCCESS)
        snprintf(name, sizeof(name), "CUDA device %d", device);
    if (ferry_cuda.cuDeviceTotalMem(&memory, handle) != CUDA_SUCCESS)
        memory = 0;
    int vmm_fd =
        device_attribute(CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, device) &&
        device_attribute(CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, device);
    snprintf(text, length, "%s, %.1f GiB, handles: legacy IPC%s", name,
             (double)memory / (1024.0 * 1024 * 1024), vmm_fd ? ", POSIX fd (VMM)" : "");
    return FERRY_OK;
}

/* ---- memory ---- */

static ferry_status_t cuda_pointer_query(const void *ptr, ferry_accel_range_t *range_p)
{
    if (!ferry_cuda_ready() || ptr == NULL)
        return FERRY_ERR_NOT_FOUND;
    /* cuPointerGetAttributes answers CUDA_SUCCESS with zeros for memory the
     * driver does not know, and needs no current context (UVA). */
    CUpointer_attribute attributes[] = {
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        CU_POINTER_ATTRIBUTE_BUFFER_ID,   CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        CU_POINTER_ATTRIBUTE_RANGE_SIZE,  CU_POINTER_ATTRIBUTE_IS_MANAGED,
    };
    unsigned int memory_type = 0;
    int ordinal = -1;
    unsigned long long buffer_id = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned int managed = 0; /* a bool is written into its first byte */
    void *data[] = {&memory_type, &ordinal, &buffer_id, &start, &size, &managed};
    CUresult result =
        ferry_cuda.cuPointerGetAttributes((unsigned)(sizeof(attributes) / sizeof(attributes[0])),
                                          attributes, data, (CUdeviceptr)(uintptr_t)ptr);
    /* Managed memory is left to the CPU: no IPC handle can share it and the
     * CPU may touch it (the engine treats it as host memory). */
    if (result != CUDA_SUCCESS || memory_type != CU_MEMORYTYPE_DEVICE || managed != 0 ||
        ordinal < 0 || ordinal >= ferry_cuda_device_total)
        return FERRY_ERR_NOT_FOUND;
    /* RANGE_START_ADDR/RANGE_SIZE are the mappable address range: for VMM
     * memory the whole cuMemAddressReserve reservation, which may be larger
     * than (and start before) the allocation mapped at ptr.  The allocation
     * is what cuMemGetAddressRange answers (the mapped region; the cuMemAlloc
     * block), which needs a current context: the device's primary. */
    CUdeviceptr mapped_start = 0;
    size_t mapped_size = 0;
    if (ferry_cuda_enter(ordinal) == FERRY_OK) {
        result = ferry_cuda.cuMemGetAddressRange(&mapped_start, &mapped_size,
                                                 (CUdeviceptr)(uintptr_t)ptr);
        ferry_cuda_leave();
        if (result == CUDA_SUCCESS && mapped_size > 0) {
            start = mapped_start;
            size = mapped_size;
        }
    }
    if (start == 0 || size == 0)
        return FERRY_ERR_NOT_FOUND;
    if (range_p != NULL)
        *range_p = (ferry_accel_range_t){(uintptr_t)start, size, ordinal, buffer_id};
    return FERRY_OK;
}

static ferry_status_t cuda_mem_alloc(int device, size_t length, void **ptr_p)
{
    if (!device_valid(device) || length == 0 || ptr_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(device);
    if (status != FERRY_OK)
        return status;
    CUdeviceptr ptr = 0;
    /* cuMemAlloc memory is legacy-IPC capable: ipc_export's simple path */
    CUresult result = ferry_cuda.cuMemAlloc(&ptr, length);
    ferry_cuda_leave();
    if (result != CUDA_SUCCESS)
        return ferry_cuda_failed("cuMemAlloc", result);
    *ptr_p = (void *)(uintptr_t)ptr;
    return FERRY_OK;
}

static void cuda_mem_free(void *ptr)
{
    ferry_accel_range_t range;
    if (ptr == NULL)
        return;
    if (cuda_pointer_query(ptr, &range) != FERRY_OK) {
        ferry_error("cuda: mem_free of %p, which is no device memory", ptr);
        return;
    }
    ferry_cuda_ipc_forget(range.buffer_id);
    if (ferry_cuda_enter(range.device) != FERRY_OK)
        return;
    CUresult result = ferry_cuda.cuMemFree((CUdeviceptr)(uintptr_t)ptr);
    ferry_cuda_leave();
    if (result != CUDA_SUCCESS)
        ferry_cuda_failed("cuMemFree", result);
}

/* Pinned host memory belongs to no device; device 0's context serves (the
 * portable flag makes it pinned for every context). */
static ferry_status_t cuda_host_alloc(size_t length, void **ptr_p)
{
    if (length == 0 || ptr_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(0);
    if (status != FERRY_OK)
        return status;
    CUresult result = ferry_cuda.cuMemHostAlloc(ptr_p, length, CU_MEMHOSTALLOC_PORTABLE);
    ferry_cuda_leave();
    return result == CUDA_SUCCESS ? FERRY_OK : ferry_cuda_failed("cuMemHostAlloc", result);
}

static void cuda_host_free(void *ptr)
{
    if (ptr == NULL || ferry_cuda_enter(0) != FERRY_OK)
        return;
    CUresult result = ferry_cuda.cuMemFreeHost(ptr);
    ferry_cuda_leave();
    if (result != CUDA_SUCCESS)
        ferry_cuda_failed("cuMemFreeHost", result);
}

/* Page-lock the application's host buffer (portable: for every context). */
static ferry_status_t cuda_host_register(void *ptr, size_t length)
{
    if (ptr == NULL || length == 0)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(0);
    if (status != FERRY_OK)
        return status;
    CUresult result = ferry_cuda.cuMemHostRegister(ptr, length, CU_MEMHOSTREGISTER_PORTABLE);
    ferry_cuda_leave();
    if (result == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
        return FERRY_ERR_BUSY; /* the application's: used as it is, never undone by us */
    return result == CUDA_SUCCESS ? FERRY_OK : ferry_cuda_failed("cuMemHostRegister", result);
}

static void cuda_host_unregister(void *ptr)
{
    if (ptr == NULL || ferry_cuda_enter(0) != FERRY_OK)
        return;
    CUresult result = ferry_cuda.cuMemHostUnregister(ptr);
    ferry_cuda_leave();
    if (result != CUDA_SUCCESS)
        ferry_cuda_failed("cuMemHostUnregister", result);
}

/* ---- streams, events and copies ---- */

/* A stream or an event, and the device whose context made it (pushed again
 * for every later call on it). */
typedef struct cuda_object {
    union {
        CUstream stream;
        CUevent event;
    };
    int device;
} cuda_object_t;

/* Creation in two halves around the driver call: check, allocate and
 * enter; then leave and hand out (or free on failure). */
static ferry_status_t object_begin(int device, void **out_p, cuda_object_t **o_p)
{
    if (!device_valid(device) || out_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    cuda_object_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = ferry_cuda_enter(device);
    if (status != FERRY_OK) {
        free(o);
        return status;
    }
    o->device = device;
    *o_p = o;
    return FERRY_OK;
}

static ferry_status_t object_end(cuda_object_t *o, CUresult result, const char *what, void **out_p)
{
    ferry_cuda_leave();
    if (result != CUDA_SUCCESS) {
        free(o);
        return ferry_cuda_failed(what, result);
    }
    *out_p = o;
    return FERRY_OK;
}

static void object_destroy(cuda_object_t *o, int is_event)
{
    if (o == NULL)
        return;
    if (ferry_cuda_enter(o->device) == FERRY_OK) {
        CUresult result =
            is_event ? ferry_cuda.cuEventDestroy(o->event) : ferry_cuda.cuStreamDestroy(o->stream);
        ferry_cuda_leave();
        if (result != CUDA_SUCCESS)
            ferry_cuda_failed(is_event ? "cuEventDestroy" : "cuStreamDestroy", result);
    }
    free(o);
}

static ferry_status_t cuda_stream_create(int device, void **stream_p)
{
    cuda_object_t *s;
    ferry_status_t status = object_begin(device, stream_p, &s);
    if (status != FERRY_OK)
        return status;
    /* Non-blocking: the application's work on the legacy default stream
     * neither waits for ours nor makes ours wait. */
    return object_end(s, ferry_cuda.cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING),
                      "cuStreamCreate", stream_p);
}

static void cuda_stream_destroy(void *stream)
{
    object_destroy(stream, 0);
}

static ferry_status_t cuda_copy_async(void *stream, void *dst, const void *src, size_t length)
{
    cuda_object_t *s = stream;
    if (s == NULL || (length > 0 && (dst == NULL || src == NULL)))
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(s->device);
    if (status != FERRY_OK)
        return status;
    CUresult result = ferry_cuda.cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst,
                                               (CUdeviceptr)(uintptr_t)src, length, s->stream);
    ferry_cuda_leave();
    return result == CUDA_SUCCESS ? FERRY_OK : ferry_cuda_failed("cuMemcpyAsync", result);
}

static ferry_status_t cuda_event_create(int device, void **event_p)
{
    cuda_object_t *e;
    ferry_status_t status = object_begin(device, event_p, &e);
    if (status != FERRY_OK)
        return status;
    /* No timing (cheaper records); blocking sync so event_wait sleeps
     * instead of spinning a core. */
    return object_end(
        e, ferry_cuda.cuEventCreate(&e->event, CU_EVENT_DISABLE_TIMING | CU_EVENT_BLOCKING_SYNC),
        "cuEventCreate", event_p);
}

static void cuda_event_destroy(void *event)
{
    object_destroy(event, 1);
}

static ferry_status_t cuda_event_record(void *event, void *stream)
{
    cuda_object_t *e = event;
    cuda_object_t *s = stream;
    if (e == NULL || s == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(s->device);
    if (status != FERRY_OK)
        return status;
    CUresult result = ferry_cuda.cuEventRecord(e->event, s->stream);
    ferry_cuda_leave();
    return result == CUDA_SUCCESS ? FERRY_OK : ferry_cuda_failed("cuEventRecord", result);
}

static ferry_status_t cuda_event_query(void *event)
{
    cuda_object_t *e = event;
    if (e == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(e->device);
    if (status != FERRY_OK)
        return status;
    CUresult result = ferry_cuda.cuEventQuery(e->event);
    ferry_cuda_leave();
    if (result == CUDA_SUCCESS)
        return FERRY_OK;
    if (result == CUDA_ERROR_NOT_READY)
        return FERRY_INPROGRESS;
    return ferry_cuda_failed("cuEventQuery", result);
}

static ferry_status_t cuda_event_wait(void *event)
{
    cuda_object_t *e = event;
    if (e == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(e->device);
    if (status != FERRY_OK)
        return status;
    CUresult result = ferry_cuda.cuEventSynchronize(e->event);
    ferry_cuda_leave();
    return result == CUDA_SUCCESS ? FERRY_OK : ferry_cuda_failed("cuEventSynchronize", result);
}

static ferry_status_t cuda_copy(void *dst, const void *src, size_t length)
{
    if (length == 0)
        return FERRY_OK;
    if (dst == NULL || src == NULL)
        return FERRY_ERR_INVALID_PARAM;
    /* The context of whichever end is device memory; host to host needs
     * no driver. */
    ferry_accel_range_t range;
    if (cuda_pointer_query(dst, &range) != FERRY_OK &&
        cuda_pointer_query(src, &range) != FERRY_OK) {
        memmove(dst, src, length);
        return FERRY_OK;
    }
    ferry_status_t status = ferry_cuda_enter(range.device);
    if (status != FERRY_OK)
        return status;
    CUresult result =
        ferry_cuda.cuMemcpy((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, length);
    /* cuMemcpy returns before a device-to-device copy is done, and before a
     * copy from pageable host memory has left its staging buffer ("API
     * synchronization behavior"): wait for the legacy stream it ran on. */
    if (result == CUDA_SUCCESS)
        result = ferry_cuda.cuStreamSynchronize(CU_STREAM_LEGACY);
    ferry_cuda_leave();
    return result == CUDA_SUCCESS ? FERRY_OK : ferry_cuda_failed("cuMemcpy", result);
}

static const ferry_accel_ops_t cuda_ops = {
    .size = sizeof(ferry_accel_ops_t),
    .kind = "cuda",
    .hardware_note = "built, not yet run on an NVIDIA GPU",
    .init = cuda_init,
    .device_count = cuda_device_count,
    .device_uuid = cuda_device_uuid,
    .device_describe = cuda_device_describe,
    .pointer_query = cuda_pointer_query,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .ipc_export = ferry_cuda_ipc_export,
    .ipc_open = ferry_cuda_ipc_open,
    .ipc_close = ferry_cuda_ipc_close,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .copy_async = cuda_copy_async,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_wait = cuda_event_wait,
    .copy = cuda_copy,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
};

const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void);

const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void)
{
    return &cuda_ops;
}
