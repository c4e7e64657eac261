/*
 * The testgpu vendor alone (test/accel_testgpu.c compiled in, no module):
 * what the engine's GPU tests rely on it for.  Device memory faults when the
 * CPU touches it, yet the vendor's copies move its bytes; pointer_query
 * knows device memory from host memory; a handle exported here opens in
 * another process and moves bytes both ways, with the true length whatever
 * the handle claims, and STALE once the allocation or its owner is gone;
 * copy_async completes later and its event says when.
 */
#include <criterion/criterion.h>

#include <errno.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ferry/accel.h>

const ferry_accel_ops_t *ferry_gpu_ipc_vendor(void);

static const ferry_accel_ops_t *vendor;

/* Criterion runs each test in its own process, so each initializes anew. */
static void two_devices(void)
{
    setenv("FERRY_TESTGPU_DEVICES", "2", 1);
    unsetenv("FERRY_TESTGPU_VISIBLE_DEVICES");
    vendor = ferry_gpu_ipc_vendor();
    char why[200] = "";
    cr_assert_eq(vendor->init(why, sizeof(why)), FERRY_OK, "init: %s", why);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131 + seed);
}

static int check(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != (unsigned char)(i * 131 + seed))
            return 0;
    }
    return 1;
}

Test(testgpu, off_unless_asked)
{
    unsetenv("FERRY_TESTGPU_DEVICES");
    const ferry_accel_ops_t *v = ferry_gpu_ipc_vendor();
    char why[200] = "";
    cr_assert_eq(v->init(why, sizeof(why)), FERRY_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "set FERRY_TESTGPU_DEVICES=N") != NULL, "why: %s", why);
    cr_assert_eq(v->device_count(), 0);
    void *ptr;
    cr_assert_neq(v->mem_alloc(0, 4096, &ptr), FERRY_OK);
}

Test(testgpu, table_is_complete)
{
    const ferry_accel_ops_t *v = ferry_gpu_ipc_vendor();
    cr_assert_eq(v->size, sizeof(ferry_accel_ops_t));
    cr_assert_str_eq(v->kind, "testgpu");
    cr_assert(FERRY_ACCEL_OPS_HAS(v, copy));
    cr_assert(FERRY_ACCEL_OPS_HAS(v, event_wait));
    cr_assert(FERRY_ACCEL_OPS_HAS(v, ipc_close));
}

Test(testgpu, visible_devices_reorder_ordinals_not_uuids)
{
    setenv("FERRY_TESTGPU_DEVICES", "3", 1);
    setenv("FERRY_TESTGPU_VISIBLE_DEVICES", "2,0", 1);
    const ferry_accel_ops_t *v = ferry_gpu_ipc_vendor();
    cr_assert_eq(v->init(NULL, 0), FERRY_OK);
    cr_assert_eq(v->device_count(), 2);
    char uuid0[FERRY_ACCEL_UUID_MAX], uuid1[FERRY_ACCEL_UUID_MAX];
    cr_assert_eq(v->device_uuid(0, uuid0, sizeof(uuid0)), FERRY_OK);
    cr_assert_eq(v->device_uuid(1, uuid1, sizeof(uuid1)), FERRY_OK);
    cr_assert(strncmp(uuid0, "TESTGPU-", 8) == 0 && strlen(uuid0) == 8 + 8 + 2, "%s", uuid0);
    cr_assert_eq(uuid0[strlen(uuid0) - 1], '2');
    cr_assert_eq(uuid1[strlen(uuid1) - 1], '0');
    cr_assert_neq(v->device_uuid(2, uuid0, sizeof(uuid0)), FERRY_OK);
    char text[200];
    cr_assert_eq(v->device_describe(0, text, sizeof(text)), FERRY_OK);
    cr_assert(strstr(text, "device 2") != NULL, "%s", text);
    /* memory allocated on ordinal 0 says so */
    void *ptr;
    ferry_accel_range_t range;
    cr_assert_eq(v->mem_alloc(1, 100, &ptr), FERRY_OK);
    cr_assert_eq(v->pointer_query(ptr, &range), FERRY_OK);
    cr_assert_eq(range.device, 1);
    v->mem_free(ptr);
}

Test(testgpu, alloc_query_and_copies_through_the_shadow, .init = two_devices)
{
    size_t n = 10000, page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *dev, *dev2;
    cr_assert_eq(vendor->mem_alloc(1, n, (void **)&dev), FERRY_OK);
    cr_assert_eq(vendor->mem_alloc(0, n, (void **)&dev2), FERRY_OK);

    ferry_accel_range_t range;
    cr_assert_eq(vendor->pointer_query(dev + 5000, &range), FERRY_OK);
    cr_assert_eq(range.base, (uintptr_t)dev);
    cr_assert_eq(range.length, (n + page - 1) / page * page);
    cr_assert_eq(range.device, 1);
    cr_assert_neq(range.buffer_id, 0);
    unsigned char host[10000], back[10000];
    cr_assert_eq(vendor->pointer_query(host, &range), FERRY_ERR_NOT_FOUND);
    cr_assert_eq(vendor->pointer_query(NULL, &range), FERRY_ERR_NOT_FOUND);
    cr_assert_eq(vendor->pointer_query((void *)1, &range), FERRY_ERR_NOT_FOUND);

    fill(host, n, 7);
    cr_assert_eq(vendor->copy(dev, host, n), FERRY_OK);
    cr_assert_eq(vendor->copy(dev2 + 1, dev, n - 1), FERRY_OK); /* device to device */
    memset(back, 0, n);
    cr_assert_eq(vendor->copy(back + 1, dev2 + 1, n - 1), FERRY_OK);
    cr_assert(check(back + 1, n - 1, 7));
    /* a copy that runs past the allocation is refused, not done */
    cr_assert_eq(vendor->copy(dev + range.length - 10, host, 20), FERRY_ERR_OUT_OF_RANGE);

    vendor->mem_free(dev);
    cr_assert_eq(vendor->pointer_query(dev, &range), FERRY_ERR_NOT_FOUND);
    vendor->mem_free(dev2);
}

/* The kernel reading the device pointer for a system call fails as the CPU
 * would (without a signal, which sanitizer builds take over). */
Test(testgpu, cpu_access_to_device_memory_faults, .init = two_devices)
{
    void *dev;
    cr_assert_eq(vendor->mem_alloc(0, 4096, &dev), FERRY_OK);
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    errno = 0;
    cr_assert_eq(write(fds[1], dev, 1), -1, "the device view is not readable");
    cr_assert_eq(errno, EFAULT);
    close(fds[0]);
    close(fds[1]);
    vendor->mem_free(dev);
}

Test(testgpu, buffer_ids_differ_at_a_reused_address, .init = two_devices)
{
    void *a, *b;
    ferry_accel_range_t ra, rb;
    cr_assert_eq(vendor->mem_alloc(0, 1 << 20, &a), FERRY_OK);
    cr_assert_eq(vendor->pointer_query(a, &ra), FERRY_OK);
    vendor->mem_free(a);
    cr_assert_eq(vendor->mem_alloc(0, 1 << 20, &b), FERRY_OK);
    cr_assert_eq(vendor->pointer_query(b, &rb), FERRY_OK);
    cr_assert_neq(ra.buffer_id, rb.buffer_id);
    vendor->mem_free(b);
}

Test(testgpu, host_alloc, .init = two_devices)
{
    unsigned char *h;
    cr_assert_eq(vendor->host_alloc(100000, (void **)&h), FERRY_OK);
    fill(h, 100000, 3);
    cr_assert(check(h, 100000, 3));
    cr_assert_eq(vendor->pointer_query(h, NULL), FERRY_ERR_NOT_FOUND);
    vendor->host_free(h);
}

/* The child opens the parent's allocation, checks the parent's bytes and
 * writes its own; exit code 0 when all went well. */
static int child_open(const char *handle, size_t expected, pid_t owner)
{
    void *base, *opened;
    size_t length;
    if (vendor->ipc_open(handle, owner, 0, &base, &length, &opened) != FERRY_OK)
        return 1;
    if (length != expected)
        return 2;
    ferry_accel_range_t range;
    if (vendor->pointer_query((char *)base + 10, &range) != FERRY_OK ||
        range.base != (uintptr_t)base || range.length != expected)
        return 3;
    unsigned char *buf = malloc(expected);
    if (buf == NULL || vendor->copy(buf, base, expected) != FERRY_OK || !check(buf, expected, 11))
        return 4;
    fill(buf, expected, 99);
    if (vendor->copy(base, buf, expected) != FERRY_OK)
        return 5;
    vendor->ipc_close(opened);
    if (vendor->pointer_query(base, &range) != FERRY_ERR_NOT_FOUND)
        return 6;
    free(buf);
    return 0;
}

Test(testgpu, export_open_in_another_process_moves_bytes, .init = two_devices)
{
    size_t n = 3 * 4096;
    void *dev;
    cr_assert_eq(vendor->mem_alloc(1, n, &dev), FERRY_OK);
    unsigned char *buf = malloc(n);
    fill(buf, n, 11);
    cr_assert_eq(vendor->copy(dev, buf, n), FERRY_OK);
    ferry_accel_range_t range;
    char handle[FERRY_ACCEL_HANDLE_MAX];
    cr_assert_eq(vendor->pointer_query(dev, &range), FERRY_OK);
    cr_assert_eq(vendor->ipc_export(&range, handle, sizeof(handle)), FERRY_OK);
    cr_assert_eq(vendor->ipc_export(&range, handle, sizeof(handle)), FERRY_OK); /* again */

    pid_t parent = getpid();
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0)
        _exit(child_open(handle, n, parent));
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed at step %d",
              WEXITSTATUS(status));
    cr_assert_eq(vendor->copy(buf, dev, n), FERRY_OK);
    cr_assert(check(buf, n, 99), "the child's bytes did not arrive");
    vendor->mem_free(dev);
    free(buf);
}

Test(testgpu, handle_claims_are_not_trusted, .init = two_devices)
{
    void *dev, *base, *opened;
    size_t length;
    cr_assert_eq(vendor->mem_alloc(0, 8192, &dev), FERRY_OK);
    ferry_accel_range_t range;
    cr_assert_eq(vendor->pointer_query(dev, &range), FERRY_OK);
    char handle[FERRY_ACCEL_HANDLE_MAX], forged[FERRY_ACCEL_HANDLE_MAX];
    cr_assert_eq(vendor->ipc_export(&range, handle, sizeof(handle)), FERRY_OK);
    int fd;
    size_t claimed;
    unsigned long long id;
    cr_assert_eq(sscanf(handle, "memfd:%d:%zu:%llu", &fd, &claimed, &id), 3);
    cr_assert_eq(claimed, 8192);

    /* a longer length than the memfd's: the true length is mapped */
    snprintf(forged, sizeof(forged), "memfd:%d:%zu:%llu", fd, (size_t)1 << 30, id);
    cr_assert_eq(vendor->ipc_open(forged, getpid(), -1, &base, &length, &opened), FERRY_OK);
    cr_assert_eq(length, 8192);
    cr_assert_eq(vendor->copy((char *)base + 8000, "x", 1), FERRY_OK);
    cr_assert_eq(vendor->copy((char *)base + 8192 - 1, "xy", 2), FERRY_ERR_OUT_OF_RANGE);
    vendor->ipc_close(opened);

    /* another buffer's id, or a descriptor that is no memfd of ours: stale */
    snprintf(forged, sizeof(forged), "memfd:%d:%zu:%llu", fd, claimed, id + 1000);
    cr_assert_eq(vendor->ipc_open(forged, getpid(), -1, &base, &length, &opened), FERRY_ERR_STALE);
    snprintf(forged, sizeof(forged), "memfd:%d:%zu:%llu", 2, claimed, id);
    cr_assert_eq(vendor->ipc_open(forged, getpid(), -1, &base, &length, &opened), FERRY_ERR_STALE);
    /* not a handle of this vendor */
    cr_assert_eq(vendor->ipc_open("cuda:abc", getpid(), -1, &base, &length, &opened),
                 FERRY_ERR_INVALID_PARAM);
    snprintf(forged, sizeof(forged), "memfd:%d:%zu:%llu trailing", fd, claimed, id);
    cr_assert_eq(vendor->ipc_open(forged, getpid(), -1, &base, &length, &opened),
                 FERRY_ERR_INVALID_PARAM);

    /* freed by its owner: stale */
    vendor->mem_free(dev);
    cr_assert_eq(vendor->ipc_open(handle, getpid(), -1, &base, &length, &opened), FERRY_ERR_STALE);
}

Test(testgpu, a_gone_owner_is_stale, .init = two_devices)
{
    int pipe_fds[2];
    cr_assert_eq(pipe(pipe_fds), 0);
    pid_t child = fork();
    cr_assert(child >= 0);
    if (child == 0) {
        /* the owner: allocate, export, say the handle, exit */
        void *dev;
        ferry_accel_range_t range;
        char handle[FERRY_ACCEL_HANDLE_MAX] = "";
        if (vendor->mem_alloc(0, 4096, &dev) == FERRY_OK &&
            vendor->pointer_query(dev, &range) == FERRY_OK)
            vendor->ipc_export(&range, handle, sizeof(handle));
        ssize_t w = write(pipe_fds[1], handle, sizeof(handle));
        _exit(w == (ssize_t)sizeof(handle) ? 0 : 1);
    }
    char handle[FERRY_ACCEL_HANDLE_MAX];
    cr_assert_eq(read(pipe_fds[0], handle, sizeof(handle)), (ssize_t)sizeof(handle));
    int status;
    cr_assert_eq(waitpid(child, &status, 0), child);
    cr_assert(strncmp(handle, "memfd:", 6) == 0, "handle: %s", handle);
    void *base, *opened;
    size_t length;
    cr_assert_eq(vendor->ipc_open(handle, child, -1, &base, &length, &opened), FERRY_ERR_STALE);
}

Test(testgpu, copy_async_completes_later_and_the_event_says_when, .init = two_devices)
{
    size_t n = 16 << 20;
    int rounds = 16;
    unsigned char *host = malloc(n), *back = malloc(n);
    void *dev, *stream, *event, *unused_event;
    fill(host, n, 5);
    cr_assert_eq(vendor->mem_alloc(0, n, &dev), FERRY_OK);
    cr_assert_eq(vendor->stream_create(0, &stream), FERRY_OK);
    cr_assert_eq(vendor->event_create(0, &event), FERRY_OK);
    cr_assert_eq(vendor->event_create(0, &unused_event), FERRY_OK);
    cr_assert_eq(vendor->event_query(unused_event), FERRY_OK); /* never recorded */

    /* 256 MiB of copies are queued in microseconds and take tens of
     * milliseconds to run: the event cannot have passed yet. */
    for (int i = 0; i < rounds; i++)
        cr_assert_eq(vendor->copy_async(stream, dev, host, n), FERRY_OK);
    cr_assert_eq(vendor->copy_async(stream, back, dev, n), FERRY_OK);
    cr_assert_eq(vendor->event_record(event, stream), FERRY_OK);
    cr_assert_eq(vendor->event_query(event), FERRY_INPROGRESS);
    cr_assert_eq(vendor->event_wait(event), FERRY_OK);
    cr_assert_eq(vendor->event_query(event), FERRY_OK);
    cr_assert(check(back, n, 5));

    /* an event destroyed with its mark still queued, and a stream
     * destroyed with work queued: the work finishes, nothing is touched
     * after it is freed (ASan builds check) */
    cr_assert_eq(vendor->copy_async(stream, dev, host, n), FERRY_OK);
    cr_assert_eq(vendor->event_record(unused_event, stream), FERRY_OK);
    vendor->event_destroy(unused_event);
    vendor->stream_destroy(stream);
    vendor->event_destroy(event);
    vendor->mem_free(dev);
    free(host);
    free(back);
}
