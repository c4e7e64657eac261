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
#include "cufile_api.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static cufile_api_t cufile;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static ferry_cufile_mode_t load_mode;
static char load_why[256];
static unsigned nvfs_version[2];

static void load(void)
{
    load_mode = FERRY_CUFILE_ABSENT;
    if (cufile_api_load(&cufile, load_why, sizeof(load_why)) != 0)
        return;
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
