/* The accelerator vendor the GPU tests use, and device memory filled and
 * checked through it (the tests never touch device memory with the CPU). */
#ifndef FERRY_TEST_GPU_VENDOR_H
#define FERRY_TEST_GPU_VENDOR_H

#include <ferry/accel.h>

#include <stddef.h>

/* FERRY_TEST_GPU_KIND's vendor (default the suite's "testgpu", given two
 * devices), or NULL when it has no usable device; kind[kind_size] and
 * device0[device0_size] ("<kind>:0") are filled either way. */
const ferry_accel_ops_t *gpu_vendor_find(char *kind, size_t kind_size, char *device0,
                                         size_t device0_size);
/* Fill device memory with test_pattern_fill's pattern, through a host copy. */
void gpu_vendor_fill(const ferry_accel_ops_t *vendor, void *device, size_t length,
                     unsigned seed);
/* test_pattern_check of device memory: SIZE_MAX when it holds the pattern. */
size_t gpu_vendor_check(const ferry_accel_ops_t *vendor, const void *device, size_t length,
                        unsigned seed);

#endif
