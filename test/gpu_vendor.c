#include "gpu_vendor.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/core/core.h"
#include "test_pattern.h"

const ferry_accel_ops_t *gpu_vendor_find(char *kind, size_t kind_size, char *device0,
                                         size_t device0_size)
{
    const char *k = getenv("FERRY_TEST_GPU_KIND");
    snprintf(kind, kind_size, "%s", k && *k ? k : "testgpu");
    snprintf(device0, device0_size, "%s:0", kind);
    if (strcmp(kind, "testgpu") == 0)
        setenv("FERRY_TESTGPU_DEVICES", "2", 0);
    return ferry_accel_find(getenv("FERRY_MODULE_DIR"), kind);
}

void gpu_vendor_fill(const ferry_accel_ops_t *vendor, void *device, size_t length,
                     unsigned seed)
{
    unsigned char *host = malloc(length);
    cr_assert_not_null(host);
    test_pattern_fill(host, length, seed);
    cr_assert_eq(vendor->copy(device, host, length), FERRY_OK);
    free(host);
}

size_t gpu_vendor_check(const ferry_accel_ops_t *vendor, const void *device, size_t length,
                        unsigned seed)
{
    unsigned char *host = malloc(length);
    cr_assert_not_null(host);
    cr_assert_eq(vendor->copy(host, device, length), FERRY_OK);
    size_t bad = test_pattern_check(host, length, seed);
    free(host);
    return bad;
}
