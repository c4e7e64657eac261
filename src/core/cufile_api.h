/*
 * The part of the cuFile API (NVIDIA GPUDirect Storage) that Ferry uses,
 * declared from its documentation (there is no cufile.h where Ferry is
 * built): functions with C linkage, errors returned by value as a pair of
 * ints.  Shared by src/core/cufile.c and contrib/gpu_storage_baseline.cu,
 * which both load the library with dlopen and fill a cufile_api_t.
 */
#ifndef FERRY_CUFILE_API_H
#define FERRY_CUFILE_API_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

/* The documented error pair: a cuFile code (0: success) and a CUDA driver
 * result. */
typedef struct cufile_result {
    int code;
    int cuda_code;
} cufile_result_t;

#define CUFILE_OPAQUE_FD 1 /* the handle type of a POSIX descriptor */

typedef struct cufile_descriptor {
    int type;
    union {
        int fd;
        void *opaque;
    } of;
    const void *fs_ops; /* NULL: the kernel's file system */
} cufile_descriptor_t;

/* The leading part of the driver properties: the nvidia-fs answer.  The
 * whole structure is larger; it is read into a buffer with room to spare. */
typedef struct cufile_nvfs_part {
    unsigned major_version;
    unsigned minor_version;
    size_t poll_threshold;
    size_t max_direct_io;
    unsigned status_flags;
    unsigned control_flags;
} cufile_nvfs_part_t;

/* The entry points, by the names dlsym finds them under. */
typedef struct cufile_api {
    cufile_result_t (*driver_open)(void);                      /* cuFileDriverOpen */
    cufile_result_t (*driver_properties)(void *properties);    /* cuFileDriverGetProperties */
    cufile_result_t (*handle_register)(void **handle_p,        /* cuFileHandleRegister */
                                       cufile_descriptor_t *descriptor);
    void (*handle_deregister)(void *handle);                   /* cuFileHandleDeregister */
    ssize_t (*read)(void *handle, void *device_base, size_t size, off_t file_offset,
                    off_t device_offset);                      /* cuFileRead */
    ssize_t (*write)(void *handle, const void *device_base, size_t size, off_t file_offset,
                     off_t device_offset);                     /* cuFileWrite */
} cufile_api_t;

/* dlopen libcufile.so.0 (or libcufile.so) and find every entry point: 0,
 * or -1 with why[why_length] saying what is missing.  The library stays
 * loaded (unloading a CUDA library is not safe). */
static inline int cufile_api_load(cufile_api_t *api, char *why, size_t why_length)
{
    void *library = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL)
        library = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        const char *error = dlerror();
        snprintf(why, why_length, "libcufile.so.0 (or libcufile.so) not found: %s",
                 error ? error : "dlopen failed");
        return -1;
    }
    static const char *const names[] = {"cuFileDriverOpen",     "cuFileDriverGetProperties",
                                        "cuFileHandleRegister", "cuFileHandleDeregister",
                                        "cuFileRead",           "cuFileWrite"};
    void **slots[] = {(void **)&api->driver_open,       (void **)&api->driver_properties,
                      (void **)&api->handle_register,   (void **)&api->handle_deregister,
                      (void **)&api->read,              (void **)&api->write};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if ((*slots[i] = dlsym(library, names[i])) == NULL) {
            snprintf(why, why_length, "libcufile lacks %s", names[i]);
            return -1;
        }
    }
    return 0;
}

#endif
