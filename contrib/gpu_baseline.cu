/*
 * The raw CUDA numbers ferry's GPU paths are judged against (issue 18,
 * "Performance"), measured with the CUDA runtime alone, in the same run as
 * ferry_bench (contrib/gpu-check.sh):
 *
 *   d2d_*          cudaMemcpy device to device in one process, one
 *                  synchronous copy at a time (1 GiB, 4 MiB, 64 KiB)
 *   sync_copy_8b   latency of one synchronous 8 B device-to-device copy
 *   h2d_pinned     cudaMemcpy from cudaMallocHost memory to the device
 *   h2d_pageable   cudaMemcpy from malloc memory to the device
 *   ipc_open_first a fresh process's first cudaIpcOpenMemHandle of a peer
 *                  buffer, CUDA context creation included
 *   ipc_*          copies from a process's own buffer into a peer's buffer
 *                  mapped with cudaIpcOpenMemHandle (1 GiB, 4 MiB one at a
 *                  time, 4 MiB with 16 in flight on one stream, 64 KiB, 8 B);
 *                  ipc_read_*: the other way, out of the peer's buffer
 *
 * One line per number: "BASELINE name=NAME value=X unit=GB/s|us|ms".
 * Without a device it prints "BASELINE skipped: <why>" and exits 3.
 *
 * Build: nvcc -O2 -o gpu_baseline contrib/gpu_baseline.cu
 * Run:   ./gpu_baseline [device]        (GPU_BASELINE_SECONDS: time per case)
 *
 * The peer is a child forked before this process touches CUDA (a CUDA
 * context does not survive fork), so its first open is a fresh process's.
 */
#include <cuda_runtime.h>

#define BASELINE_PROGRAM "gpu_baseline"
#include "gpu_baseline_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define GIB ((size_t)1 << 30)
#define MIB ((size_t)1 << 20)
#define KIB ((size_t)1 << 10)

static double seconds_per_case = 0.5;

/* Repeat one synchronous copy of length bytes for about seconds_per_case;
 * bytes per second. */
static double copy_rate(void *dst, const void *src, size_t length, cudaMemcpyKind kind)
{
    CHECK(cudaMemcpy(dst, src, length, kind)); /* warm up */
    CHECK(cudaDeviceSynchronize());
    unsigned long long copies = 0;
    double begin = now(), elapsed;
    do {
        for (int i = 0; i < 8; i++) {
            CHECK(cudaMemcpy(dst, src, length, kind));
            CHECK(cudaDeviceSynchronize());
        }
        copies += 8;
        elapsed = now() - begin;
    } while (elapsed < seconds_per_case);
    return (double)copies * length / elapsed;
}

/* in_flight copies of length bytes on one stream, then one wait, repeated;
 * bytes per second. */
static double window_rate(void *dst, const void *src, size_t length, int in_flight)
{
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    unsigned long long copies = 0;
    double begin = now(), elapsed;
    do {
        for (int i = 0; i < in_flight; i++)
            CHECK(cudaMemcpyAsync(dst, src, length, cudaMemcpyDeviceToDevice, stream));
        CHECK(cudaStreamSynchronize(stream));
        copies += (unsigned long long)in_flight;
        elapsed = now() - begin;
    } while (elapsed < seconds_per_case);
    CHECK(cudaStreamDestroy(stream));
    return (double)copies * length / elapsed;
}

static void one_process(int device)
{
    void *a, *b, *pinned, *pageable;
    CHECK(cudaSetDevice(device));
    CHECK(cudaMalloc(&a, GIB));
    CHECK(cudaMalloc(&b, GIB));
    CHECK(cudaMemset(a, 1, GIB));
    result("d2d_1g", copy_rate(b, a, GIB, cudaMemcpyDeviceToDevice) / 1e9, "GB/s");
    result("d2d_4m", copy_rate(b, a, 4 * MIB, cudaMemcpyDeviceToDevice) / 1e9, "GB/s");
    result("d2d_64k", copy_rate(b, a, 64 * KIB, cudaMemcpyDeviceToDevice) / 1e9, "GB/s");
    result("d2d_4m_16_in_flight", window_rate(b, a, 4 * MIB, 16) / 1e9, "GB/s");
    result("sync_copy_8b", 8 / copy_rate(b, a, 8, cudaMemcpyDeviceToDevice) * 1e6, "us");
    size_t host_length = 256 * MIB;
    CHECK(cudaMallocHost(&pinned, host_length));
    memset(pinned, 2, host_length);
    result("h2d_pinned", copy_rate(a, pinned, host_length, cudaMemcpyHostToDevice) / 1e9,
           "GB/s");
    result("d2h_pinned", copy_rate(pinned, a, host_length, cudaMemcpyDeviceToHost) / 1e9,
           "GB/s");
    CHECK(cudaFreeHost(pinned));
    pageable = malloc(host_length);
    if (pageable != NULL) {
        memset(pageable, 3, host_length);
        result("h2d_pageable",
               copy_rate(a, pageable, host_length, cudaMemcpyHostToDevice) / 1e9, "GB/s");
        free(pageable);
    }
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

/* The peer (a fresh process): open the owner's buffer, copy into it. */
static int peer(int device, int from_owner, int to_owner)
{
    cudaIpcMemHandle_t handle;
    if (read(from_owner, &handle, sizeof(handle)) != (ssize_t)sizeof(handle))
        return 1;
    void *mapped, *own;
    double begin = now();
    CHECK(cudaSetDevice(device));
    CHECK(cudaIpcOpenMemHandle(&mapped, handle, cudaIpcMemLazyEnablePeerAccess));
    result("ipc_open_first", (now() - begin) * 1e3, "ms");
    CHECK(cudaMalloc(&own, GIB));
    CHECK(cudaMemset(own, 4, GIB));
    result("ipc_1g", copy_rate(mapped, own, GIB, cudaMemcpyDeviceToDevice) / 1e9, "GB/s");
    result("ipc_4m", copy_rate(mapped, own, 4 * MIB, cudaMemcpyDeviceToDevice) / 1e9, "GB/s");
    result("ipc_4m_16_in_flight", window_rate(mapped, own, 4 * MIB, 16) / 1e9, "GB/s");
    result("ipc_read_1g", copy_rate(own, mapped, GIB, cudaMemcpyDeviceToDevice) / 1e9, "GB/s");
    result("ipc_read_4m", copy_rate(own, mapped, 4 * MIB, cudaMemcpyDeviceToDevice) / 1e9,
           "GB/s");
    result("ipc_64k", copy_rate(mapped, own, 64 * KIB, cudaMemcpyDeviceToDevice) / 1e9, "GB/s");
    result("ipc_sync_copy_8b", 8 / copy_rate(mapped, own, 8, cudaMemcpyDeviceToDevice) * 1e6,
           "us");
    CHECK(cudaIpcCloseMemHandle(mapped));
    CHECK(cudaFree(own));
    char done = 1;
    return write(to_owner, &done, 1) == 1 ? 0 : 1;
}

static int two_processes(int device)
{
    int to_peer[2], to_owner[2];
    if (pipe(to_peer) != 0 || pipe(to_owner) != 0)
        return 1;
    fflush(stdout);
    pid_t pid = fork(); /* before this process's first CUDA call */
    if (pid < 0)
        return 1;
    if (pid == 0) {
        /* Only the other side keeps the ends we do not use: a side that
         * dies is then an end of file for the other, not a hang. */
        close(to_peer[1]);
        close(to_owner[0]);
        _exit(peer(device, to_peer[0], to_owner[1]));
    }
    close(to_peer[0]);
    close(to_owner[1]);
    void *buffer;
    cudaIpcMemHandle_t handle;
    CHECK(cudaSetDevice(device));
    CHECK(cudaMalloc(&buffer, GIB));
    CHECK(cudaIpcGetMemHandle(&handle, buffer));
    if (write(to_peer[1], &handle, sizeof(handle)) != (ssize_t)sizeof(handle))
        return 1;
    char done = 0;
    /* The buffer lives until the peer is done with it (or died). */
    if (read(to_owner[0], &done, 1) != 1)
        done = 0;
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(cudaFree(buffer));
    return done == 1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    int device = argc > 1 ? atoi(argv[1]) : 0;
    const char *s = getenv("GPU_BASELINE_SECONDS");
    if (s != NULL && atof(s) > 0)
        seconds_per_case = atof(s);
    /* The device check runs in a child, so that this process is still
     * CUDA-free when it forks the IPC peer. */
    pid_t pid = fork();
    if (pid == 0) {
        int count = 0;
        cudaError_t err = cudaGetDeviceCount(&count);
        if (err != cudaSuccess || count <= device) {
            printf("BASELINE skipped: no CUDA device %d (%s)\n", device,
                   err != cudaSuccess ? cudaGetErrorString(err) : "too few devices");
            fflush(stdout);
            _exit(3);
        }
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
            printf("BASELINE device=%d name=\"%s\" memory_gib=%.0f\n", device, prop.name,
                   prop.totalGlobalMem / (double)GIB);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status))
        return 1;
    if (WEXITSTATUS(status) != 0)
        return WEXITSTATUS(status);
    /* A failed IPC case still leaves the one-process numbers to measure. */
    int ipc_failed = two_processes(device) != 0;
    if (ipc_failed)
        fprintf(stderr, "gpu_baseline: the two-process IPC case failed\n");
    one_process(device);
    return ipc_failed ? 1 : 0;
}
