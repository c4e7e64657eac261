/*
 * The CUDA vendor's IPC: export an allocation as text, open a peer's.
 *
 * Legacy handles (cuIpcGetMemHandle) serve cuMemAlloc memory: a handle of
 * any pointer opens at the block's base (seen on the GPU machine), so the
 * range's base is exported and cuMemGetAddressRange gives the true length
 * after the open.  Memory the application made with cuMemCreate is not
 * legacy capable; when it was created with a POSIX fd handle type, we
 * export that descriptor and keep it open (one per buffer id, so repeated
 * exports do not leak descriptors) until mem_free or until an export finds
 * the buffer gone.  Its opener copies the descriptor with pidfd_getfd,
 * imports, reserves, maps and sets access.  A VMM handle's length is a
 * claim: cuMemMap refuses to map more than the allocation holds, so what
 * is mapped is never more than what exists.
 *
 * Untested: no GPU where this was written.  What needs a run on the GPU
 * machine: both handle kinds across two processes, an open after the owner
 * freed the buffer (STALE expected), opening one legacy handle twice in a
 * process (drivers before 11 refused a second open in one context), and
 * the descriptor cache across free and reallocation.
 */
#include "accel_cuda.h"
#include "../accel_fd.h"
#include "../accel_hex.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEGACY_PREFIX "cuda-legacy:"
#define FD_PREFIX     "cuda-fd:"
#define FD_CACHE_MAX  256

/* Our exported VMM descriptors (ferry_cuda_lock). */
typedef struct exported_fd {
    uint64_t buffer_id;
    uintptr_t base;
    int fd;
} exported_fd_t;

static exported_fd_t fd_cache[FD_CACHE_MAX];
static size_t fd_cache_count;

typedef struct cuda_opened {
    int vmm;         /* 1: mapped VMM import, 0: legacy IPC open */
    CUdeviceptr ptr; /* where it is mapped here */
    size_t length;
    int device;                              /* whose context opened it (legacy) */
    CUmemGenericAllocationHandle allocation; /* the import (vmm) */
} cuda_opened_t;

/* ---- export ---- */

static int legacy_capable(uintptr_t base)
{
    unsigned int capable = 0; /* a bool is written into its first byte */
    CUresult result = ferry_cuda.cuPointerGetAttribute(
        &capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, (CUdeviceptr)base);
    /* A driver that does not know the attribute predates VMM memory, so
     * everything it allocates is legacy capable. */
    return result != CUDA_SUCCESS || capable != 0;
}

static ferry_status_t export_legacy(const ferry_accel_range_t *range, char *handle, size_t length)
{
    size_t prefix = strlen(LEGACY_PREFIX);
    if (length < prefix + 2 * CU_IPC_HANDLE_SIZE + 1)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(range->device);
    if (status != FERRY_OK)
        return status;
    CUipcMemHandle ipc;
    CUresult result = ferry_cuda.cuIpcGetMemHandle(&ipc, (CUdeviceptr)range->base);
    ferry_cuda_leave();
    if (result != CUDA_SUCCESS)
        return ferry_cuda_failed("cuIpcGetMemHandle", result);
    memcpy(handle, LEGACY_PREFIX, prefix);
    ferry_accel_hex_encode(ipc.reserved, CU_IPC_HANDLE_SIZE, handle + prefix, length - prefix);
    return FERRY_OK;
}

/* Whether the buffer cached at base still lives (VMM memory is freed by the
 * application, behind our back). */
static int still_there(const exported_fd_t *e)
{
    unsigned long long id = 0;
    return ferry_cuda.cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                            (CUdeviceptr)e->base) == CUDA_SUCCESS &&
           id == e->buffer_id;
}

/* The cached descriptor of buffer_id, or -1; drops the dead ones found on
 * the way.  Called with ferry_cuda_lock held. */
static int fd_cache_find_locked(uint64_t buffer_id)
{
    int found = -1;
    for (size_t i = 0; i < fd_cache_count;) {
        if (!still_there(&fd_cache[i])) {
            close(fd_cache[i].fd);
            fd_cache[i] = fd_cache[--fd_cache_count];
            continue;
        }
        if (fd_cache[i].buffer_id == buffer_id)
            found = fd_cache[i].fd;
        i++;
    }
    return found;
}

void ferry_cuda_ipc_forget(uint64_t buffer_id)
{
    pthread_mutex_lock(&ferry_cuda_lock);
    for (size_t i = 0; i < fd_cache_count; i++) {
        if (fd_cache[i].buffer_id == buffer_id) {
            close(fd_cache[i].fd);
            fd_cache[i] = fd_cache[--fd_cache_count];
            break;
        }
    }
    pthread_mutex_unlock(&ferry_cuda_lock);
}

/* A new descriptor for the VMM allocation at base. */
static ferry_status_t vmm_export_fd(uintptr_t base, int *fd_p)
{
    CUmemGenericAllocationHandle allocation;
    CUresult result = ferry_cuda.cuMemRetainAllocationHandle(&allocation, (void *)base);
    if (result != CUDA_SUCCESS) {
        ferry_debug("cuda: %#" PRIxPTR " is no VMM allocation (cuMemRetainAllocationHandle: %d)",
                    base, (int)result);
        return FERRY_ERR_NOT_FOUND; /* the caller tries a legacy handle */
    }
    ferry_status_t status = FERRY_OK;
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    result = ferry_cuda.cuMemGetAllocationPropertiesFromHandle(&prop, allocation);
    if (result != CUDA_SUCCESS) {
        status = ferry_cuda_failed("cuMemGetAllocationPropertiesFromHandle", result);
    } else if ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0) {
        ferry_error("cuda: the allocation at %#" PRIxPTR " can be shared neither by a legacy "
                    "handle nor by a POSIX fd (cuMemCreate without that handle type)",
                    base);
        status = FERRY_ERR_UNSUPPORTED;
    } else {
        int fd = -1;
        result = ferry_cuda.cuMemExportToShareableHandle(
            &fd, allocation, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (result != CUDA_SUCCESS)
            status = ferry_cuda_failed("cuMemExportToShareableHandle", result);
        else
            *fd_p = fd;
    }
    /* The retain counted a reference; the allocation's owner keeps its own. */
    ferry_cuda.cuMemRelease(allocation);
    return status;
}

static ferry_status_t export_vmm(const ferry_accel_range_t *range, char *handle, size_t length)
{
    pthread_mutex_lock(&ferry_cuda_lock);
    int fd = fd_cache_find_locked(range->buffer_id);
    if (fd < 0) {
        if (fd_cache_count == FD_CACHE_MAX) {
            pthread_mutex_unlock(&ferry_cuda_lock);
            ferry_error("cuda: %d VMM allocations exported at once: no more descriptors",
                        FD_CACHE_MAX);
            return FERRY_ERR_NO_RESOURCE;
        }
        ferry_status_t status = vmm_export_fd(range->base, &fd);
        if (status != FERRY_OK) {
            pthread_mutex_unlock(&ferry_cuda_lock);
            return status;
        }
        fd_cache[fd_cache_count++] = (exported_fd_t){range->buffer_id, range->base, fd};
    }
    pthread_mutex_unlock(&ferry_cuda_lock);
    int n =
        snprintf(handle, length, FD_PREFIX "%d:%zu:%" PRIu64, fd, range->length, range->buffer_id);
    return n >= 0 && (size_t)n < length ? FERRY_OK : FERRY_ERR_INVALID_PARAM;
}

ferry_status_t ferry_cuda_ipc_export(const ferry_accel_range_t *range, char *handle, size_t length)
{
    if (!ferry_cuda_ready() || range == NULL || handle == NULL || range->base == 0)
        return FERRY_ERR_INVALID_PARAM;
    /* The attribute queries and the VMM calls (retain, properties, export)
     * run with the device's context current, as the legacy export does. */
    ferry_status_t status = ferry_cuda_enter(range->device);
    if (status != FERRY_OK)
        return status;
    if (legacy_capable(range->base)) {
        status = export_legacy(range, handle, length);
    } else {
        status = export_vmm(range, handle, length);
        /* Not VMM memory after all: the attribute has been seen to say 0 for
         * cuMemAlloc memory (UCX's cuda_copy works around that); let
         * cuIpcGetMemHandle decide. */
        if (status == FERRY_ERR_NOT_FOUND)
            status = export_legacy(range, handle, length);
    }
    ferry_cuda_leave();
    return status;
}

/* ---- open ---- */

static ferry_status_t open_legacy(const char *hex, int device, cuda_opened_t *o)
{
    CUipcMemHandle ipc;
    if (ferry_accel_hex_decode(hex, ipc.reserved, CU_IPC_HANDLE_SIZE) != 0)
        return FERRY_ERR_INVALID_PARAM;
    ferry_status_t status = ferry_cuda_enter(device);
    if (status != FERRY_OK)
        return status;
    CUdeviceptr ptr = 0, base = 0;
    size_t size = 0;
    CUresult result = ferry_cuda.cuIpcOpenMemHandle(&ptr, ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (result == CUDA_SUCCESS) {
        result = ferry_cuda.cuMemGetAddressRange(&base, &size, ptr);
        if (result == CUDA_SUCCESS && (ptr < base || ptr - base >= size))
            result = CUDA_ERROR_INVALID_VALUE;
        if (result != CUDA_SUCCESS) {
            ferry_cuda_failed("cuMemGetAddressRange of an opened handle", result);
            ferry_cuda.cuIpcCloseMemHandle(ptr);
        }
    }
    ferry_cuda_leave();
    if (result == CUDA_ERROR_OUT_OF_MEMORY)
        return ferry_cuda_failed("cuIpcOpenMemHandle", result);
    if (result != CUDA_SUCCESS) {
        /* The owner freed the buffer or exited (or the handle is forged):
         * the driver does not tell them apart. */
        ferry_warn("cuda: cannot open a peer's IPC handle: %d", (int)result);
        return FERRY_ERR_STALE;
    }
    /* ptr is where the exported base (the peer's range base) is mapped, and
     * what cuIpcCloseMemHandle takes back; the mapping may start before it. */
    *o = (cuda_opened_t){
        .vmm = 0, .ptr = ptr, .length = size - (size_t)(ptr - base), .device = device};
    return FERRY_OK;
}

/* Access for the device copies are issued on, or for all when any (-1). */
static CUresult vmm_set_access(CUdeviceptr ptr, size_t length, int device)
{
    CUmemAccessDesc access[64];
    memset(access, 0, sizeof(access));
    int count = 0;
    for (int d = 0; d < ferry_cuda_device_total && count < 64; d++) {
        if (device < 0 || d == device) {
            access[count].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            access[count].location.id = d;
            access[count].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            count++;
        }
    }
    CUresult result = ferry_cuda.cuMemSetAccess(ptr, length, access, (size_t)count);
    if (result != CUDA_SUCCESS && device < 0 && count > 1)
        result = ferry_cuda.cuMemSetAccess(ptr, length, access, 1); /* no peer path: device 0 */
    return result;
}

/* Map an imported allocation: reserve, map, allow access; undone in reverse
 * on failure. */
static ferry_status_t vmm_map(CUmemGenericAllocationHandle allocation, size_t claimed, int device,
                              cuda_opened_t *o)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    size_t granularity = 0;
    CUresult result = ferry_cuda.cuMemGetAllocationPropertiesFromHandle(&prop, allocation);
    if (result == CUDA_SUCCESS)
        result = ferry_cuda.cuMemGetAllocationGranularity(&granularity, &prop,
                                                          CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (result != CUDA_SUCCESS)
        return ferry_cuda_failed("granularity of an imported allocation", result);
    if (claimed == 0 || granularity == 0 || claimed % granularity != 0)
        return FERRY_ERR_INVALID_PARAM;
    CUdeviceptr ptr = 0;
    result = ferry_cuda.cuMemAddressReserve(&ptr, claimed, granularity, 0, 0);
    if (result != CUDA_SUCCESS)
        return ferry_cuda_failed("cuMemAddressReserve", result);
    /* More than the allocation holds is refused here: the claim is checked. */
    result = ferry_cuda.cuMemMap(ptr, claimed, 0, allocation, 0);
    if (result != CUDA_SUCCESS) {
        ferry_error("cuda: a peer's VMM handle claims %zu B that cannot be mapped (%d)", claimed,
                    (int)result);
        goto err_free_address;
    }
    result = vmm_set_access(ptr, claimed, device);
    if (result != CUDA_SUCCESS) {
        ferry_cuda_failed("cuMemSetAccess", result);
        goto err_unmap;
    }
    *o = (cuda_opened_t){
        .vmm = 1, .ptr = ptr, .length = claimed, .device = device, .allocation = allocation};
    return FERRY_OK;

err_unmap:
    ferry_cuda.cuMemUnmap(ptr, claimed);
err_free_address:
    ferry_cuda.cuMemAddressFree(ptr, claimed);
    return FERRY_ERR_INVALID_PARAM;
}

static ferry_status_t open_vmm(const char *text, long owner_pid, int device, cuda_opened_t *o)
{
    int remote_fd, consumed = 0;
    size_t claimed;
    uint64_t buffer_id;
    if (sscanf(text, "%d:%zu:%" SCNu64 "%n", &remote_fd, &claimed, &buffer_id, &consumed) != 3 ||
        text[consumed] != '\0' || remote_fd < 0)
        return FERRY_ERR_INVALID_PARAM;
    int fd;
    ferry_status_t status = ferry_accel_fd_take("cuda", owner_pid, remote_fd, &fd);
    if (status != FERRY_OK)
        return status;
    status = ferry_cuda_enter(device < 0 ? 0 : device);
    if (status != FERRY_OK) {
        close(fd);
        return status;
    }
    CUmemGenericAllocationHandle allocation;
    CUresult result = ferry_cuda.cuMemImportFromShareableHandle(
        &allocation, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    close(fd); /* the import holds the allocation now */
    if (result != CUDA_SUCCESS) {
        /* the owner's descriptor number now names something else */
        ferry_cuda_leave();
        ferry_warn("cuda: cannot import a peer's VMM descriptor: %d", (int)result);
        return FERRY_ERR_STALE;
    }
    status = vmm_map(allocation, claimed, device, o);
    if (status != FERRY_OK)
        ferry_cuda.cuMemRelease(allocation);
    ferry_cuda_leave();
    return status;
}

ferry_status_t ferry_cuda_ipc_open(const char *handle, long owner_pid, int device, void **base_p,
                                   size_t *length_p, void **opened_p)
{
    if (!ferry_cuda_ready())
        return FERRY_ERR_UNSUPPORTED;
    if (handle == NULL || device < -1 || device >= ferry_cuda_device_total || owner_pid <= 0 ||
        base_p == NULL || length_p == NULL || opened_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    if (kill((pid_t)owner_pid, 0) != 0 && errno == ESRCH)
        return FERRY_ERR_STALE;
    cuda_opened_t *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status;
    if (strncmp(handle, LEGACY_PREFIX, strlen(LEGACY_PREFIX)) == 0)
        status = open_legacy(handle + strlen(LEGACY_PREFIX), device < 0 ? 0 : device, o);
    else if (strncmp(handle, FD_PREFIX, strlen(FD_PREFIX)) == 0)
        status = open_vmm(handle + strlen(FD_PREFIX), owner_pid, device, o);
    else
        status = FERRY_ERR_INVALID_PARAM;
    if (status != FERRY_OK) {
        free(o);
        return status;
    }
    *base_p = (void *)(uintptr_t)o->ptr;
    *length_p = o->length;
    *opened_p = o;
    return FERRY_OK;
}

void ferry_cuda_ipc_close(void *opened)
{
    cuda_opened_t *o = opened;
    if (o == NULL)
        return;
    if (ferry_cuda_enter(o->device < 0 ? 0 : o->device) == FERRY_OK) {
        if (o->vmm) {
            ferry_cuda.cuMemUnmap(o->ptr, o->length);
            ferry_cuda.cuMemAddressFree(o->ptr, o->length);
            ferry_cuda.cuMemRelease(o->allocation);
        } else {
            CUresult result = ferry_cuda.cuIpcCloseMemHandle(o->ptr);
            if (result != CUDA_SUCCESS)
                ferry_cuda_failed("cuIpcCloseMemHandle", result);
        }
        ferry_cuda_leave();
    }
    free(o);
}
