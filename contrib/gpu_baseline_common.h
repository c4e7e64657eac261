/*
 * What the raw CUDA baselines (gpu_baseline.cu, gpu_storage_baseline.cu)
 * share: a clock, the check of a CUDA runtime call, and the one line each
 * number is printed as ("BASELINE name=NAME value=X unit=UNIT").  Define
 * BASELINE_PROGRAM (the program's name, for error lines) before including.
 */
#ifndef FERRY_GPU_BASELINE_COMMON_H
#define FERRY_GPU_BASELINE_COMMON_H

#include <cuda_runtime.h>

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

#define CHECK(call)                                                                   \
    do {                                                                              \
        cudaError_t err_ = (call);                                                    \
        if (err_ != cudaSuccess) {                                                    \
            fprintf(stderr, BASELINE_PROGRAM ": %s: %s\n", #call,                     \
                    cudaGetErrorString(err_));                                        \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

static void result(const char *name, double value, const char *unit)
{
    printf("BASELINE name=%s value=%.4f unit=%s\n", name, value, unit);
    fflush(stdout);
}

#endif
