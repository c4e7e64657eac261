/*
 * cuFile (NVIDIA GPUDirect Storage), loaded at run time: libferry links
 * neither it nor the CUDA runtime.  There is no cufile.h on the build
 * machine, so the few entry points used here are declared below from the
 * documented cuFile API (functions with C linkage; errors come back as a
 * small struct of two ints, by value).
 *
 * Loaded once per process (a GPU library's state is the process's): the
 * library, its symbols, the driver session opened, its properties read.
 * "Native" means the nvidia-fs kernel driver answers (its version in the
 * properties is not 0 and /proc/driver/nvidia-fs exists): DMA between the
 * storage and GPU memory.  Otherwise cuFile runs in compatibility mode: it
 * reads into host buffers of its own and copies, which our own pinned
 * staging does as well, in our pipeline.  The session is never closed:
 * other users of the process may share it, and the process's end closes it.
 *
 * Never run on real hardware: the one GPU machine we had has libcufile but
 * no nvidia-fs driver, and no run there has been made yet.
 */
#include "core.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

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

static struct {
    cufile_result_t (*driver_open)(void);
    cufile_result_t (*driver_properties)(void *properties);
    cufile_result_t (*handle_register)(void **handle_p, cufile_descriptor_t *descriptor);
    void (*handle_deregister)(void *handle);
    ssize_t (*read)(void *handle, void *device_base, size_t size, off_t file_offset,
                    off_t device_offset);
    ssize_t (*write)(void *handle, const void *device_base, size_t size, off_t file_offset,
                     off_t device_offset);
} cufile;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static ferry_cufile_mode_t load_mode;
static char load_why[256];
static unsigned nvfs_version[2];

static void *symbol(void *library, const char *name)
{
    void *p = dlsym(library, name);
    if (p == NULL && load_why[0] == '\0')
        snprintf(load_why, sizeof(load_why), "libcufile lacks %s", name);
    return p;
}

static void load(void)
{
    load_mode = FERRY_CUFILE_ABSENT;
    void *library = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL)
        library = dlopen("libcufile.so", RTLD_NOW | RTLD_LOCAL);
    if (library == NULL) {
        const char *error = dlerror();
        snprintf(load_why, sizeof(load_why), "libcufile.so.0 (or libcufile.so) not found: %s",
                 error ? error : "dlopen failed");
        return;
    }
    *(void **)&cufile.driver_open = symbol(library, "cuFileDriverOpen");
    *(void **)&cufile.driver_properties = symbol(library, "cuFileDriverGetProperties");
    *(void **)&cufile.handle_register = symbol(library, "cuFileHandleRegister");
    *(void **)&cufile.handle_deregister = symbol(library, "cuFileHandleDeregister");
    *(void **)&cufile.read = symbol(library, "cuFileRead");
    *(void **)&cufile.write = symbol(library, "cuFileWrite");
    if (load_why[0] != '\0')
        return; /* the library stays loaded: unloading a CUDA library is unsafe */
    cufile_result_t opened = cufile.driver_open();
    if (opened.code != 0) {
        snprintf(load_why, sizeof(load_why),
                 "cuFileDriverOpen failed (cuFile error %d, CUDA error %d; cufile.log says more)",
                 opened.code, opened.cuda_code);
        return;
    }
    union {
        cufile_nvfs_part_t nvfs;
        unsigned char room[4096];
    } properties;
    memset(&properties, 0, sizeof(properties));
    cufile_result_t got = cufile.driver_properties(&properties);
    nvfs_version[0] = got.code == 0 ? properties.nvfs.major_version : 0;
    nvfs_version[1] = got.code == 0 ? properties.nvfs.minor_version : 0;
    int driver = access("/proc/driver/nvidia-fs", F_OK) == 0;
    load_mode = nvfs_version[0] != 0 && driver ? FERRY_CUFILE_NATIVE : FERRY_CUFILE_COMPAT;
    if (load_mode == FERRY_CUFILE_COMPAT)
        snprintf(load_why, sizeof(load_why),
                 "compatibility mode (no nvidia-fs driver answers: cuFile copies through host "
                 "memory)");
}

ferry_cufile_mode_t ferry_cufile_load(const char **why_p)
{
    pthread_once(&load_once, load);
    if (why_p != NULL)
        *why_p = load_why;
    return load_mode;
}

void ferry_cufile_describe(char *text, size_t length)
{
    const char *why;
    switch (ferry_cufile_load(&why)) {
    case FERRY_CUFILE_NATIVE:
        snprintf(text, length, "cuFile found, native (nvidia-fs %u.%u)", nvfs_version[0],
                 nvfs_version[1]);
        break;
    case FERRY_CUFILE_COMPAT:
        snprintf(text, length, "cuFile found, %s", why);
        break;
    default:
        snprintf(text, length, "cuFile not usable: %s", why);
        break;
    }
}

ferry_status_t ferry_cufile_io(int fd, int write, void *device, size_t length, uint64_t offset)
{
    const char *why;
    if (ferry_cufile_load(&why) == FERRY_CUFILE_ABSENT) {
        ferry_error("cuFile: %s", why);
        return FERRY_ERR_UNSUPPORTED;
    }
    cufile_descriptor_t descriptor = {.type = CUFILE_OPAQUE_FD, .of.fd = fd};
    void *handle = NULL;
    cufile_result_t registered = cufile.handle_register(&handle, &descriptor);
    if (registered.code != 0) {
        ferry_error("cuFile: cuFileHandleRegister of descriptor %d failed (cuFile error %d, "
                    "CUDA error %d)", fd, registered.code, registered.cuda_code);
        return FERRY_ERR_IO;
    }
    ferry_status_t status = FERRY_OK;
    /* A short transfer goes on from where it stopped, as the file
     * transport's do; 0 bytes (the file ends) or an error FAILS. */
    for (size_t done = 0; done < length;) {
        ssize_t n = write ? cufile.write(handle, device, length - done, (off_t)(offset + done),
                                         (off_t)done)
                          : cufile.read(handle, device, length - done, (off_t)(offset + done),
                                        (off_t)done);
        if (n < 0 && n == -1 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0 || (size_t)n > length - done) {
            ferry_error("cuFile: %s of %zu bytes at offset %llu: %s", write ? "write" : "read",
                        length - done, (unsigned long long)(offset + done),
                        n == 0    ? "the file ends first"
                        : n == -1 ? strerror(errno)
                                  : "cuFile error (negative result; cufile.log says more)");
            status = FERRY_ERR_IO;
            break;
        }
        done += (size_t)n;
    }
    cufile.handle_deregister(handle);
    return status;
}
