/*
 * The accelerator vendor contract (accel.h), for whichever vendor
 * FERRY_TEST_GPU_KIND names (default the test suite's "testgpu"; the GPU
 * machine's check sets "cuda"), loaded from its module as the engine loads
 * it: device UUIDs, pointer_query of device and host memory, allocation
 * ranges, copies in every direction, pinned host memory, asynchronous
 * copies finished by events, and exported handles.  Skips with one line
 * when the vendor has no device here.  Sharing between processes is
 * test_gpu_ipc's (through the transport).
 */
#include <criterion/criterion.h>

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../src/core/core.h"
#include "test_pattern.h"

#define MIB ((size_t)1 << 20)

static const ferry_accel_ops_t *vendor;
static char kind[32];

static void find_vendor(void)
{
    const char *k = getenv("FERRY_TEST_GPU_KIND");
    snprintf(kind, sizeof(kind), "%s", k && *k ? k : "testgpu");
    if (strcmp(kind, "testgpu") == 0)
        setenv("FERRY_TESTGPU_DEVICES", "2", 0);
    vendor = ferry_accel_find(getenv("FERRY_MODULE_DIR"), kind);
    if (vendor == NULL)
        cr_skip_test("no %s device here (ferry_info -d says why): vendor tests skipped", kind);
}

TestSuite(accel_vendor, .init = find_vendor);

/* Device memory filled with the pattern through a host buffer. */
static void *device_with_pattern(int device, size_t length, unsigned seed)
{
    void *dev;
    unsigned char *host = malloc(length);
    cr_assert_eq(vendor->mem_alloc(device, length, &dev), FERRY_OK);
    test_pattern_fill(host, length, seed);
    cr_assert_eq(vendor->copy(dev, host, length), FERRY_OK);
    free(host);
    return dev;
}

static void expect_pattern(const void *dev, size_t length, unsigned seed)
{
    unsigned char *host = malloc(length);
    cr_assert_eq(vendor->copy(host, dev, length), FERRY_OK);
    cr_assert_eq(test_pattern_check(host, length, seed), SIZE_MAX,
                 "device bytes differ from the pattern");
    free(host);
}

Test(accel_vendor, devices_have_stable_distinct_uuids)
{
    int count = vendor->device_count();
    cr_assert_gt(count, 0);
    char first[FERRY_ACCEL_UUID_MAX] = "";
    for (int d = 0; d < count; d++) {
        char uuid[FERRY_ACCEL_UUID_MAX], again[FERRY_ACCEL_UUID_MAX], text[256];
        cr_assert_eq(vendor->device_uuid(d, uuid, sizeof(uuid)), FERRY_OK);
        cr_assert_eq(vendor->device_uuid(d, again, sizeof(again)), FERRY_OK);
        cr_assert(strlen(uuid) > 0 && strcmp(uuid, again) == 0, "%s / %s", uuid, again);
        if (d == 0)
            snprintf(first, sizeof(first), "%s", uuid);
        else
            cr_assert(strcmp(first, uuid) != 0, "devices 0 and %d share %s", d, uuid);
        cr_assert_eq(vendor->device_describe(d, text, sizeof(text)), FERRY_OK);
        cr_assert(strlen(text) > 0);
    }
    char uuid[FERRY_ACCEL_UUID_MAX];
    cr_assert_neq(vendor->device_uuid(count, uuid, sizeof(uuid)), FERRY_OK);
    void *ptr;
    cr_assert_neq(vendor->mem_alloc(count, 4096, &ptr), FERRY_OK);
}

Test(accel_vendor, pointer_query_knows_device_memory_from_host_memory)
{
    size_t n = MIB + 123;
    char *dev;
    cr_assert_eq(vendor->mem_alloc(0, n, (void **)&dev), FERRY_OK);
    ferry_accel_range_t range, inner;
    cr_assert_eq(vendor->pointer_query(dev, &range), FERRY_OK);
    cr_assert_eq(range.base, (uintptr_t)dev);
    cr_assert_geq(range.length, n);
    cr_assert_eq(range.device, 0);
    cr_assert_eq(vendor->pointer_query(dev + n - 1, &inner), FERRY_OK);
    cr_assert_eq(inner.base, range.base);
    cr_assert_eq(inner.length, range.length);
    cr_assert_eq(inner.buffer_id, range.buffer_id);

    char stack[64];
    char *heap = malloc(64);
    void *pinned;
    cr_assert_eq(vendor->host_alloc(4096, &pinned), FERRY_OK);
    cr_assert_eq(vendor->pointer_query(stack, &range), FERRY_ERR_NOT_FOUND);
    cr_assert_eq(vendor->pointer_query(heap, &range), FERRY_ERR_NOT_FOUND);
    cr_assert_eq(vendor->pointer_query(pinned, &range), FERRY_ERR_NOT_FOUND);
    cr_assert_eq(vendor->pointer_query(NULL, &range), FERRY_ERR_NOT_FOUND);
    cr_assert_eq(vendor->pointer_query((void *)16, &range), FERRY_ERR_NOT_FOUND);
    vendor->host_free(pinned);
    free(heap);
    vendor->mem_free(dev);
}

Test(accel_vendor, a_reused_address_gets_another_buffer_id)
{
    void *a, *b;
    ferry_accel_range_t ra, rb;
    cr_assert_eq(vendor->mem_alloc(0, 4 * MIB, &a), FERRY_OK);
    cr_assert_eq(vendor->pointer_query(a, &ra), FERRY_OK);
    vendor->mem_free(a);
    cr_assert_eq(vendor->mem_alloc(0, 4 * MIB, &b), FERRY_OK);
    cr_assert_eq(vendor->pointer_query(b, &rb), FERRY_OK);
    /* 0 means the vendor does not know (HIP 5): nothing to compare */
    if (a == b && ra.buffer_id != 0)
        cr_assert_neq(ra.buffer_id, rb.buffer_id, "the same id for two allocations at %p", a);
    vendor->mem_free(b);
}

Test(accel_vendor, copies_in_every_direction)
{
    size_t n = 3 * MIB + 5;
    char *src = device_with_pattern(0, n, 21);
    char *dst;
    cr_assert_eq(vendor->mem_alloc(vendor->device_count() > 1 ? 1 : 0, n, (void **)&dst), FERRY_OK);
    cr_assert_eq(vendor->copy(dst, src, n), FERRY_OK); /* device to device (maybe peer) */
    expect_pattern(dst, n, 21);

    /* odd offsets and lengths inside the allocations */
    unsigned char host[1000];
    test_pattern_fill(host, sizeof(host), 77);
    cr_assert_eq(vendor->copy(dst + 12345, host, sizeof(host)), FERRY_OK);
    cr_assert_eq(vendor->copy(src + 3, dst + 12345, sizeof(host)), FERRY_OK);
    memset(host, 0, sizeof(host));
    cr_assert_eq(vendor->copy(host, src + 3, sizeof(host)), FERRY_OK);
    cr_assert_eq(test_pattern_check(host, sizeof(host), 77), SIZE_MAX);

    /* host to host works too (the engine does not ask, but may) */
    unsigned char other[1000];
    cr_assert_eq(vendor->copy(other, host, sizeof(host)), FERRY_OK);
    cr_assert(memcmp(other, host, sizeof(host)) == 0);
    vendor->mem_free(src);
    vendor->mem_free(dst);
}

Test(accel_vendor, async_copies_finish_by_their_event)
{
    size_t n = 64 * MIB;
    unsigned char *pinned, *back;
    void *dev, *stream, *event, *idle;
    cr_assert_eq(vendor->host_alloc(n, (void **)&pinned), FERRY_OK);
    cr_assert_eq(vendor->host_alloc(n, (void **)&back), FERRY_OK);
    test_pattern_fill(pinned, n, 5);
    memset(back, 0, n);
    cr_assert_eq(vendor->mem_alloc(0, n, &dev), FERRY_OK);
    cr_assert_eq(vendor->stream_create(0, &stream), FERRY_OK);
    cr_assert_eq(vendor->event_create(0, &event), FERRY_OK);
    cr_assert_eq(vendor->event_create(0, &idle), FERRY_OK);
    cr_assert_eq(vendor->event_query(idle), FERRY_OK); /* never recorded: nothing to wait for */

    cr_assert_eq(vendor->copy_async(stream, dev, pinned, n), FERRY_OK);
    cr_assert_eq(vendor->copy_async(stream, back, dev, n), FERRY_OK);
    cr_assert_eq(vendor->event_record(event, stream), FERRY_OK);
    ferry_status_t early = vendor->event_query(event);
    cr_assert(early == FERRY_OK || early == FERRY_INPROGRESS, "event_query: %d", early);
    cr_assert_eq(vendor->event_wait(event), FERRY_OK);
    cr_assert_eq(vendor->event_query(event), FERRY_OK);
    cr_assert_eq(test_pattern_check(back, n, 5), SIZE_MAX,
                 "the copies had not finished at the event");

    /* an event recorded again marks the newer point */
    cr_assert_eq(vendor->copy_async(stream, back, dev, MIB), FERRY_OK);
    cr_assert_eq(vendor->event_record(event, stream), FERRY_OK);
    cr_assert_eq(vendor->event_wait(event), FERRY_OK);

    vendor->event_destroy(idle);
    vendor->event_destroy(event);
    vendor->stream_destroy(stream);
    vendor->mem_free(dev);
    vendor->host_free(back);
    vendor->host_free(pinned);
}

static int open_descriptors(void)
{
    int count = 0;
    DIR *dir = opendir("/proc/self/fd");
    cr_assert(dir != NULL);
    while (readdir(dir) != NULL)
        count++;
    closedir(dir);
    return count;
}

Test(accel_vendor, export_gives_handle_text)
{
    void *dev;
    ferry_accel_range_t range;
    char handle[FERRY_ACCEL_HANDLE_MAX], again[FERRY_ACCEL_HANDLE_MAX];
    cr_assert_eq(vendor->mem_alloc(0, 2 * MIB, &dev), FERRY_OK);
    cr_assert_eq(vendor->pointer_query(dev, &range), FERRY_OK);
    cr_assert_eq(vendor->ipc_export(&range, handle, sizeof(handle)), FERRY_OK);
    cr_assert(strlen(handle) > 0 && strlen(handle) < sizeof(handle));
    cr_assert(strchr(handle, '\n') == NULL && strchr(handle, ' ') == NULL, "handle: %s", handle);
    /* exporting again is allowed and costs nothing lasting: no descriptor
     * per export (a VMM or memfd handle names one of ours) */
    cr_assert_eq(vendor->ipc_export(&range, again, sizeof(again)), FERRY_OK);
    int fds = open_descriptors();
    for (int i = 0; i < 100; i++)
        cr_assert_eq(vendor->ipc_export(&range, again, sizeof(again)), FERRY_OK);
    cr_assert_eq(open_descriptors(), fds);
    void *base, *opened;
    size_t length;
    cr_assert_eq(vendor->ipc_open("no handle of any vendor", getpid(), 0, &base, &length, &opened),
                 FERRY_ERR_INVALID_PARAM);
    vendor->mem_free(dev);
}

Test(accel_vendor, host_register_pins_once)
{
    if (!FERRY_ACCEL_OPS_HAS(vendor, host_unregister))
        cr_skip_test("%s has no host_register", kind);
    size_t n = 8 * MIB;
    unsigned char *host = aligned_alloc(4096, n);
    void *dev, *stream, *event;
    test_pattern_fill(host, n, 9);
    cr_assert_eq(vendor->host_register(host, n), FERRY_OK);
    /* registered already (by the application, here by us): in use as it is */
    cr_assert_eq(vendor->host_register(host, n), FERRY_ERR_BUSY);
    cr_assert_eq(vendor->host_register(host + MIB, MIB), FERRY_ERR_BUSY);

    cr_assert_eq(vendor->mem_alloc(0, n, &dev), FERRY_OK);
    cr_assert_eq(vendor->stream_create(0, &stream), FERRY_OK);
    cr_assert_eq(vendor->event_create(0, &event), FERRY_OK);
    cr_assert_eq(vendor->copy_async(stream, dev, host, n), FERRY_OK);
    cr_assert_eq(vendor->event_record(event, stream), FERRY_OK);
    cr_assert_eq(vendor->event_wait(event), FERRY_OK);
    expect_pattern(dev, n, 9);

    vendor->host_unregister(host);
    cr_assert_eq(vendor->host_register(host, n), FERRY_OK); /* undone: registers anew */
    vendor->host_unregister(host);
    vendor->event_destroy(event);
    vendor->stream_destroy(stream);
    vendor->mem_free(dev);
    free(host);
}
