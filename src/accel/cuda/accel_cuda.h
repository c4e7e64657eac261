/*
 * The CUDA vendor (accel.h) over the CUDA driver API, private header.
 *
 * libcuda.so.1 is opened with dlopen when init runs: neither libferry nor
 * this module links a GPU library, and cuda.h is used for its types and
 * prototypes only.  Entry points are resolved by base name with
 * cuGetProcAddress_v2 at the ABI of CUDA_ABI_VERSION (every function used
 * here has kept that ABI in CUDA 13), else with dlsym of the versioned name
 * cuda.h maps the base name to ("cuMemAlloc" -> "cuMemAlloc_v2").
 *
 * Contexts: each device's primary context, retained on first use and kept
 * for the life of the process; every call that needs one pushes it and pops
 * it again, so the application's current context never changes.
 *
 * Handles (text, FERRY_ACCEL_HANDLE_MAX):
 *   "cuda-legacy:<128 hex>"          cuIpcGetMemHandle (cuMemAlloc memory);
 *   "cuda-fd:<fd>:<length>:<id>"     a VMM allocation (cuMemCreate with a
 *                                     POSIX fd handle type): our exported
 *                                     descriptor, which the opener copies
 *                                     with pidfd_getfd (accel_fd.h).
 * Fabric handles are not used: on the GPU machine they fail without an IMEX
 * service although the device attribute says they are supported.
 *
 * Locks: ferry_cuda_lock guards the devices' lazily retained contexts and the
 * exported descriptor cache (accel_cuda_ipc.c).  No lock is held across a
 * copy or a synchronization.
 *
 * Tested: compiled here (no GPU); nothing below has run on a GPU yet.
 */
#ifndef FERRY_ACCEL_CUDA_H
#define FERRY_ACCEL_CUDA_H

#include <ferry/accel.h>
#include <ferry/plugin.h>

#include <pthread.h>

#include <cuda.h>

#if CUDA_VERSION < 12000
#error "the CUDA vendor needs cuda.h of CUDA 12 or later (cuGetProcAddress_v2)"
#endif

/* The ABI asked of cuGetProcAddress: the prototypes below are those of
 * CUDA 12.0, which every later driver still serves. */
#define CUDA_ABI_VERSION 12000

/* Every driver function the vendor calls (cuInit and cuGetProcAddress are
 * resolved first, by dlsym). */
#define CUDA_FUNCTIONS(X)                                                                          \
    X(cuGetErrorName)                                                                              \
    X(cuDriverGetVersion)                                                                          \
    X(cuDeviceGetCount)                                                                            \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetName)                                                                             \
    X(cuDeviceTotalMem)                                                                            \
    X(cuDeviceGetUuid)                                                                             \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuDevicePrimaryCtxRetain)                                                                    \
    X(cuCtxPushCurrent)                                                                            \
    X(cuCtxPopCurrent)                                                                             \
    X(cuPointerGetAttribute)                                                                       \
    X(cuPointerGetAttributes)                                                                      \
    X(cuMemAlloc)                                                                                  \
    X(cuMemFree)                                                                                   \
    X(cuMemHostAlloc)                                                                              \
    X(cuMemFreeHost)                                                                               \
    X(cuMemHostRegister)                                                                           \
    X(cuMemHostUnregister)                                                                         \
    X(cuMemGetAddressRange)                                                                        \
    X(cuIpcGetMemHandle)                                                                           \
    X(cuIpcOpenMemHandle)                                                                          \
    X(cuIpcCloseMemHandle)                                                                         \
    X(cuMemRetainAllocationHandle)                                                                 \
    X(cuMemExportToShareableHandle)                                                                \
    X(cuMemImportFromShareableHandle)                                                              \
    X(cuMemGetAllocationPropertiesFromHandle)                                                      \
    X(cuMemGetAllocationGranularity)                                                               \
    X(cuMemRelease)                                                                                \
    X(cuMemAddressReserve)                                                                         \
    X(cuMemAddressFree)                                                                            \
    X(cuMemMap)                                                                                    \
    X(cuMemUnmap)                                                                                  \
    X(cuMemSetAccess)                                                                              \
    X(cuStreamCreate)                                                                              \
    X(cuStreamDestroy)                                                                             \
    X(cuStreamSynchronize)                                                                         \
    X(cuMemcpy)                                                                                    \
    X(cuMemcpyAsync)                                                                               \
    X(cuEventCreate)                                                                               \
    X(cuEventDestroy)                                                                              \
    X(cuEventRecord)                                                                               \
    X(cuEventQuery)                                                                                \
    X(cuEventSynchronize)

/* Members are named as cuda.h spells the function after its macros
 * (ferry_cuda.cuMemAlloc is ferry_cuda.cuMemAlloc_v2), with the prototype's own type. */
#define CUDA_MEMBER(name) __typeof__(name) *name;
typedef struct cuda_api {
    CUDA_FUNCTIONS(CUDA_MEMBER)
} cuda_api_t;
#undef CUDA_MEMBER

typedef struct cuda_device {
    CUdevice handle;
    CUcontext context; /* primary context; NULL until first used (ferry_cuda_lock) */
} cuda_device_t;

extern cuda_api_t ferry_cuda;
extern pthread_mutex_t ferry_cuda_lock;
extern int ferry_cuda_device_total;

/* Log a failed driver call once ("cuda: what: CUDA_ERROR_..."), and its
 * status: NO_MEMORY, INVALID_PARAM or IO. */
ferry_status_t ferry_cuda_failed(const char *what, CUresult result);
/* Make device's primary context current on this thread (push), and undo. */
ferry_status_t ferry_cuda_enter(int device);
void ferry_cuda_leave(void);
/* Whether init succeeded (calls it once). */
int ferry_cuda_ready(void);

/* accel_cuda_ipc.c */
ferry_status_t ferry_cuda_ipc_export(const ferry_accel_range_t *range, char *handle, size_t length);
ferry_status_t ferry_cuda_ipc_open(const char *handle, long owner_pid, int device, void **base_p,
                                   size_t *length_p, void **opened_p);
void ferry_cuda_ipc_close(void *opened);
/* mem_free: the buffer's exported descriptor, if any, is closed. */
void ferry_cuda_ipc_forget(uint64_t buffer_id);

#endif
