/*
 * Ferry accelerator ABI: the one table an accelerator vendor implements
 * (CUDA, HIP, the test suite's memfd "testgpu") so that the engine can
 * register, allocate, stage and copy device memory, and the GPU IPC
 * transport can share it between processes of one host.
 *
 * A vendor lives in a loadable module (ferry_<kind>_ipc.so) whose plugin
 * (plugin.h) is its IPC transport and carries this table in
 * ferry_plugin_t.accel.  libferry never links a GPU library: the module
 * loads the vendor's library itself when init runs.
 *
 * Threads: every function may be called from any thread, concurrently.
 * Devices: "device" is the ordinal as this process numbers them (CUDA
 * follows CUDA_VISIBLE_DEVICES); processes compare devices by UUID.
 * Current device: no function changes the calling thread's current device
 * or context as the application sees it.
 */
#ifndef FERRY_ACCEL_H
#define FERRY_ACCEL_H

#include <stddef.h>
#include <stdint.h>

#include <ferry/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_ACCEL_UUID_MAX 64    /* device UUID text, NUL included */
#define FERRY_ACCEL_HANDLE_MAX 400 /* exported handle text, NUL included */

/* The allocation that holds a device pointer. */
typedef struct ferry_accel_range {
    uintptr_t base;     /* where the allocation starts */
    size_t length;      /* its length */
    int device;         /* its device (this process's ordinal) */
    uint64_t buffer_id; /* differs between allocations made at the same address; 0: unknown */
} ferry_accel_range_t;

typedef struct ferry_accel_ops {
    size_t size;
    /* The location kind ("cuda" for "cuda:N"); the module's transport is
     * named "<kind>_ipc". */
    const char *kind;
    /* What has never run on real hardware, for ferry_info and logs ("built,
     * not run on AMD hardware"); NULL when it has. */
    const char *hardware_note;
    /* Load the vendor library and count the devices.  Once per process:
     * later calls return the first answer.  FERRY_ERR_UNSUPPORTED with a
     * one-line reason in why (no library, no device) when unusable. */
    ferry_status_t (*init)(char *why, size_t why_length);
    int (*device_count)(void);
    /* The device's UUID, the same in every process of the host whatever
     * their device ordinals. */
    ferry_status_t (*device_uuid)(int device, char *uuid, size_t length);
    /* One line for ferry_info: name, memory, handle types it exports. */
    ferry_status_t (*device_describe)(int device, char *text, size_t length);
    /* FERRY_OK with the allocation when ptr is this vendor's device memory
     * (its own or opened from a peer); FERRY_ERR_NOT_FOUND when it is not
     * (host memory, another vendor's).  Never faults, whatever ptr is. */
    ferry_status_t (*pointer_query)(const void *ptr, ferry_accel_range_t *range_p);
    /* Device memory that ipc_export can share, and its release. */
    ferry_status_t (*mem_alloc)(int device, size_t length, void **ptr_p);
    void (*mem_free)(void *ptr);
    /* Page-locked host memory (staging buffers), and its release. */
    ferry_status_t (*host_alloc)(size_t length, void **ptr_p);
    void (*host_free)(void *ptr);
    /* Text with which another process of this host opens the allocation
     * (at its base): a legacy IPC handle, or a shareable handle that names
     * a file descriptor of this process (the opener gets our pid). */
    ferry_status_t (*ipc_export)(const ferry_accel_range_t *range, char *handle, size_t length);
    /* Open a peer's allocation in this process, for copies issued on
     * device (-1: any).  *base_p: where its base is mapped here; *length_p:
     * the length actually mapped (what the handle claims is not trusted);
     * *opened_p: for ipc_close.  FERRY_ERR_STALE: the allocation or its
     * owner is gone; FERRY_ERR_INVALID_PARAM: not a handle of this vendor. */
    ferry_status_t (*ipc_open)(const char *handle, long owner_pid, int device, void **base_p,
                               size_t *length_p, void **opened_p);
    void (*ipc_close)(void *opened);
    /* Streams and events of a device.  copy_async moves bytes in any
     * direction (unified addressing: host, own or opened device memory). */
    ferry_status_t (*stream_create)(int device, void **stream_p);
    void (*stream_destroy)(void *stream);
    ferry_status_t (*copy_async)(void *stream, void *dst, const void *src, size_t length);
    ferry_status_t (*event_create)(int device, void **event_p);
    void (*event_destroy)(void *event);
    /* Mark the point in stream that event_query/event_wait look for. */
    ferry_status_t (*event_record)(void *event, void *stream);
    /* FERRY_OK: all before the mark finished; FERRY_INPROGRESS: not yet;
     * an error: the work failed. */
    ferry_status_t (*event_query)(void *event);
    /* Block until the mark is passed (the same answers but INPROGRESS). */
    ferry_status_t (*event_wait)(void *event);
    /* A synchronous copy in any direction (small or rare copies). */
    ferry_status_t (*copy)(void *dst, const void *src, size_t length);
    /* Optional: page-lock host memory the application owns (a registered
     * host buffer that device copies read or write) and undo it.
     * FERRY_ERR_BUSY: it is page-locked already (by the application): in
     * use as it is, nothing to undo. */
    ferry_status_t (*host_register)(void *ptr, size_t length);
    void (*host_unregister)(void *ptr);
} ferry_accel_ops_t;

/* Whether a vendor table (maybe shorter, from an older module) has the
 * member. */
#define FERRY_ACCEL_OPS_HAS(ops, member)                                                 \
    ((ops)->size >= offsetof(ferry_accel_ops_t, member) + sizeof((ops)->member) &&       \
     (ops)->member != NULL)

#ifdef __cplusplus
}
#endif

#endif
