/*
 * The raw numbers ferry's GPU-memory-and-storage path is judged against
 * (issue 21, "Performance": GPU memory from a file >= 0.9x of the best of
 * cuFile alone and pread into pinned memory plus a host-to-device copy),
 * measured in the same run as ferry_bench (contrib/gpu-check.sh):
 *
 *   storage_pinned_write  device to pinned host memory (cudaMemcpyAsync),
 *                         then pwrite, over two pinned buffers of CHUNK
 *                         bytes: the copy of one overlaps the pwrite of
 *                         the other
 *   storage_pinned_read   pread into one pinned buffer while the other is
 *                         copied to the device (the same two buffers)
 *   storage_cufile_write  cuFileWrite of each block from device memory
 *   storage_cufile_read   cuFileRead of each block into device memory
 *
 * Blocks of BLOCK bytes go round the first SIZE bytes of FILE (the writes
 * first, so the reads find written data), as ferry_bench does with
 * --remote-memory=file:FILE --buffer-size=SIZE -b BLOCK.  The file is
 * opened with O_DIRECT where the file system takes it, as ferry's file
 * transport does for aligned I/O (the line says which).  cuFile is loaded
 * with dlopen (src/core/cufile_api.h); where it is absent, or its driver
 * session does not open, its lines say "skipped" and why, and the mode
 * (native or compatibility) is printed.
 *
 * One line per number: "BASELINE name=NAME value=X unit=GB/s".
 * Without a device it prints "BASELINE skipped: <why>" and exits 3.
 *
 * Build: nvcc -O2 -I src/core -o gpu_storage_baseline contrib/gpu_storage_baseline.cu -ldl
 * Run:   ./gpu_storage_baseline FILE SIZE BLOCK [device]
 *        (sizes in bytes or with k/m/g; GPU_BASELINE_SECONDS: time per
 *        case, GPU_STORAGE_CHUNK: the pinned buffers' size, default 1m)
 */
#include <cuda_runtime.h>

#define BASELINE_PROGRAM "gpu_storage_baseline"
#include "cufile_api.h"
#include "gpu_baseline_common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double seconds_per_case = 0.5;

static size_t parse_size(const char *text)
{
    char *end;
    double v = strtod(text, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

/* Every byte, or exit: a short transfer goes on, the file ending is fatal. */
static void full_io(int fd, int write, void *buffer, size_t length, off_t offset)
{
    char *p = (char *)buffer;
    while (length > 0) {
        ssize_t n = write ? pwrite(fd, p, length, offset) : pread(fd, p, length, offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "gpu_storage_baseline: %s: %s\n", write ? "pwrite" : "pread",
                    n == 0 ? "the file ends" : strerror(errno));
            exit(1);
        }
        p += n;
        length -= (size_t)n;
        offset += n;
    }
}

typedef struct pinned_pipe {
    void *buffer[2];
    cudaEvent_t done[2];
    cudaStream_t stream;
    size_t chunk;
} pinned_pipe_t;

/* One block from the file onto the device: chunk k is read while chunk
 * k - 1 is copied. */
static void pinned_read(pinned_pipe_t *pp, int fd, char *device, size_t block, off_t at)
{
    for (size_t off = 0, k = 0; off < block; off += pp->chunk, k ^= 1) {
        size_t n = block - off < pp->chunk ? block - off : pp->chunk;
        CHECK(cudaEventSynchronize(pp->done[k])); /* its previous copy is done */
        full_io(fd, 0, pp->buffer[k], n, at + (off_t)off);
        CHECK(cudaMemcpyAsync(device + off, pp->buffer[k], n, cudaMemcpyHostToDevice,
                              pp->stream));
        CHECK(cudaEventRecord(pp->done[k], pp->stream));
    }
    CHECK(cudaStreamSynchronize(pp->stream));
}

/* One block from the device into the file: chunk k + 1 is copied off the
 * device while chunk k is written. */
static void pinned_write(pinned_pipe_t *pp, int fd, const char *device, size_t block, off_t at)
{
    size_t n = block < pp->chunk ? block : pp->chunk;
    CHECK(cudaMemcpyAsync(pp->buffer[0], device, n, cudaMemcpyDeviceToHost, pp->stream));
    CHECK(cudaEventRecord(pp->done[0], pp->stream));
    for (size_t off = 0, k = 0; off < block; k ^= 1) {
        size_t next = off + n;
        size_t next_n = next < block ? (block - next < pp->chunk ? block - next : pp->chunk) : 0;
        if (next_n > 0) {
            CHECK(cudaMemcpyAsync(pp->buffer[k ^ 1], device + next, next_n,
                                  cudaMemcpyDeviceToHost, pp->stream));
            CHECK(cudaEventRecord(pp->done[k ^ 1], pp->stream));
        }
        CHECK(cudaEventSynchronize(pp->done[k]));
        full_io(fd, 1, pp->buffer[k], n, at + (off_t)off);
        off = next;
        n = next_n;
    }
}

static cufile_api_t cufile;

static void cufile_io(void *handle, int write, void *device, size_t block, off_t at)
{
    for (size_t done = 0; done < block;) {
        ssize_t n = write ? cufile.write(handle, device, block - done, at + (off_t)done,
                                         (off_t)done)
                          : cufile.read(handle, device, block - done, at + (off_t)done,
                                        (off_t)done);
        if (n <= 0) {
            fprintf(stderr, "gpu_storage_baseline: cuFile%s: %zd (errno %s)\n",
                    write ? "Write" : "Read", n, strerror(errno));
            exit(1);
        }
        done += (size_t)n;
    }
}

/* GB/s of one case: blocks round the file for seconds_per_case. */
typedef void (*case_fn)(void *arg, int write, char *device, size_t block, off_t at);

typedef struct run_args {
    pinned_pipe_t *pp;
    void *handle;
    int fd;
} run_args_t;

static void pinned_case(void *arg, int write, char *device, size_t block, off_t at)
{
    run_args_t *a = (run_args_t *)arg;
    if (write)
        pinned_write(a->pp, a->fd, device, block, at);
    else
        pinned_read(a->pp, a->fd, device, block, at);
}

static void cufile_case(void *arg, int write, char *device, size_t block, off_t at)
{
    cufile_io(((run_args_t *)arg)->handle, write, device, block, at);
}

static double rate(case_fn fn, void *arg, int write, char *device, size_t size, size_t block)
{
    size_t blocks = size / block, i = 0, bytes = 0;
    fn(arg, write, device, block, 0); /* warm up */
    double start = now(), elapsed;
    do {
        fn(arg, write, device, block, (off_t)((i++ % blocks) * block));
        bytes += block;
        elapsed = now() - start;
    } while (elapsed < seconds_per_case);
    return (double)bytes / elapsed / 1e9;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: gpu_storage_baseline FILE SIZE BLOCK [device]\n");
        return 2;
    }
    const char *path = argv[1];
    size_t size = parse_size(argv[2]), block = parse_size(argv[3]);
    int device_index = argc > 4 ? atoi(argv[4]) : 0;
    const char *s = getenv("GPU_BASELINE_SECONDS");
    if (s != NULL && atof(s) > 0)
        seconds_per_case = atof(s);
    const char *c = getenv("GPU_STORAGE_CHUNK");
    size_t chunk = c != NULL ? parse_size(c) : (size_t)1 << 20;
    if (block == 0 || size < block || chunk == 0) {
        fprintf(stderr, "gpu_storage_baseline: need 0 < BLOCK <= SIZE and a chunk\n");
        return 2;
    }
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || device_index >= count) {
        printf("BASELINE skipped: no CUDA device %d\n", device_index);
        return 3;
    }
    CHECK(cudaSetDevice(device_index));
    int direct = 1;
    int fd = open(path, O_RDWR | O_CREAT | O_DIRECT, 0600);
    if (fd < 0) {
        direct = 0;
        fd = open(path, O_RDWR | O_CREAT, 0600);
    }
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        fprintf(stderr, "gpu_storage_baseline: %s: %s\n", path, strerror(errno));
        return 1;
    }
    printf("BASELINE storage file=%s size=%zu block=%zu chunk=%zu direct=%s\n", path, size,
           block, chunk, direct ? "yes" : "no");
    char *device;
    CHECK(cudaMalloc((void **)&device, block));
    CHECK(cudaMemset(device, 0x5a, block));
    pinned_pipe_t pp;
    pp.chunk = chunk;
    CHECK(cudaStreamCreateWithFlags(&pp.stream, cudaStreamNonBlocking));
    for (int i = 0; i < 2; i++) {
        CHECK(cudaMallocHost(&pp.buffer[i], chunk));
        CHECK(cudaEventCreateWithFlags(&pp.done[i], cudaEventDisableTiming));
        CHECK(cudaEventRecord(pp.done[i], pp.stream));
    }
    run_args_t args = {&pp, NULL, fd};
    result("storage_pinned_write", rate(pinned_case, &args, 1, device, size, block), "GB/s");
    result("storage_pinned_read", rate(pinned_case, &args, 0, device, size, block), "GB/s");

    char why[256] = "";
    cufile_result_t opened = {-1, 0};
    if (cufile_api_load(&cufile, why, sizeof(why)) == 0) {
        opened = cufile.driver_open();
        if (opened.code != 0)
            snprintf(why, sizeof(why), "cuFileDriverOpen: cuFile error %d, CUDA error %d",
                     opened.code, opened.cuda_code);
    }
    if (opened.code != 0) {
        printf("BASELINE skipped cufile: %s\n", why);
        return 0;
    }
    union {
        cufile_nvfs_part_t nvfs;
        unsigned char room[4096];
    } props;
    memset(&props, 0, sizeof(props));
    cufile.driver_properties(&props);
    printf("BASELINE cufile nvfs_version=%u.%u mode=%s\n", props.nvfs.major_version,
           props.nvfs.minor_version,
           props.nvfs.major_version != 0 && access("/proc/driver/nvidia-fs", F_OK) == 0
               ? "native"
               : "compatibility");
    cufile_descriptor_t descriptor;
    memset(&descriptor, 0, sizeof(descriptor));
    descriptor.type = CUFILE_OPAQUE_FD;
    descriptor.of.fd = fd;
    cufile_result_t registered = cufile.handle_register(&args.handle, &descriptor);
    if (registered.code != 0) {
        printf("BASELINE skipped cufile: cuFileHandleRegister: cuFile error %d, CUDA error %d\n",
               registered.code, registered.cuda_code);
        return 0;
    }
    result("storage_cufile_write", rate(cufile_case, &args, 1, device, size, block), "GB/s");
    result("storage_cufile_read", rate(cufile_case, &args, 0, device, size, block), "GB/s");
    cufile.handle_deregister(args.handle);
    close(fd);
    return 0;
}
