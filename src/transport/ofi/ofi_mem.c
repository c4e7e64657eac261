/*
 * Memory registration under the provider's MR mode, and the key strings
 * peers use (format in ofi.h).
 *
 *   FI_MR_PROV_KEY   the provider picks the key (fi_mr_key); else we do,
 *                    from a counter unique in the domain.
 *   FI_MR_VIRT_ADDR  peers address the buffer by virtual address; else by
 *                    offset from the registered start (the key's <base>).
 *   FI_MR_ENDPOINT   the MR is bound to the target endpoint and enabled.
 *   FI_MR_RAW        the key string carries fi_mr_raw_attr's bytes and base;
 *                    the initiator maps them per operation (fi_mr_map_raw).
 *   FI_MR_LOCAL      local buffers need a descriptor: a registered local
 *                    buffer gives its MR's (slice->local_memh); another
 *                    one, or any under FI_MR_ENDPOINT (its MR is bound to
 *                    the target endpoint, not the lane), gets an MR of
 *                    its own for the operation, closed at its completion.
 *                    No bounce buffer: registering on the fly costs a
 *                    system call, a bounce a copy of the whole slice.
 *   FI_MR_ALLOCATED  host pages are faulted in before registering
 *                    (populate_pages).
 *   FI_MR_HMEM       device memory (cuda:N, rocm:N) is registered with its
 *                    iface when the provider offered FI_HMEM, else it gets
 *                    no key (FERRY_ERR_UNSUPPORTED).  Untested here.
 * Neither tcp;ofi_rxm (mr_mode 0) nor shm (FI_MR_VIRT_ADDR) asks for
 * LOCAL, ENDPOINT, RAW or PROV_KEY with libfabric 1.17: test/ofi_mr_shim.c
 * makes them ask, and test_ofi_mr runs this code under each mode.
 */
#include "ofi.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const uint64_t remote_access = FI_REMOTE_READ | FI_REMOTE_WRITE;
static const uint64_t local_access = FI_READ | FI_WRITE;

/* The iface and device of a location, 0 when it is host memory, -1 when
 * it is memory we cannot register. */
static int hmem_iface(const ferry_ofi_t *ofi, const char *location, enum fi_hmem_iface *iface_p,
                      int *device_p)
{
    if (ferry_location_is_host(location))
        return 0;
    if (!ofi->hmem)
        return -1;
    const char *colon = strchr(location, ':');
    *device_p = colon ? atoi(colon + 1) : 0;
    if (ferry_location_is_kind(location, "cuda"))
        *iface_p = FI_HMEM_CUDA;
    else if (ferry_location_is_kind(location, "rocm"))
        *iface_p = FI_HMEM_ROCR;
    else
        return -1;
    return 1;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22 /* Linux 5.14 */
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

/* FI_MR_ALLOCATED: the provider registers only pages that exist ("backed
 * by physical memory pages at the time the registration call is made",
 * fi_mr(3)); a buffer mapped but not yet touched (a fresh mmap, a large
 * malloc) has none.  Fault them in: writable where the mapping allows (a
 * write lands there), else readable; a kernel without MADV_POPULATE_*
 * (before 5.14) gets a read of each page.  Whatever still fails is the
 * provider's to refuse. */
static void populate_pages(void *addr, size_t length)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || length == 0)
        return;
    uintptr_t first = (uintptr_t)addr & ~(uintptr_t)(page - 1);
    size_t span = (uintptr_t)addr + length - first;
    if (madvise((void *)first, span, MADV_POPULATE_WRITE) == 0 ||
        madvise((void *)first, span, MADV_POPULATE_READ) == 0 || errno != EINVAL)
        return;
    for (uintptr_t at = (uintptr_t)addr; at < (uintptr_t)addr + length;
         at = (at & ~(uintptr_t)(page - 1)) + (uintptr_t)page)
        (void)*(volatile const unsigned char *)at;
}

static int register_mr(ferry_ofi_t *ofi, void *addr, size_t length, uint64_t access,
                       const char *location, struct fid_mr **mr_p)
{
    struct iovec iov = {.iov_base = addr, .iov_len = length};
    struct fi_mr_attr attr = {.mr_iov = &iov, .iov_count = 1, .access = access};
    if (!(ofi->mr_mode & FI_MR_PROV_KEY))
        attr.requested_key = atomic_fetch_add_explicit(&ofi->next_key, 1, memory_order_relaxed);
    enum fi_hmem_iface iface = FI_HMEM_SYSTEM;
    int device = 0;
    int kind = hmem_iface(ofi, location, &iface, &device);
    if (kind < 0)
        return -FI_EOPNOTSUPP;
    if (kind > 0) {
        attr.iface = iface;
        if (iface == FI_HMEM_CUDA)
            attr.device.cuda = device;
    } else if (ofi->mr_mode & FI_MR_ALLOCATED) {
        populate_pages(addr, length);
    }
    return fi_mr_regattr(ofi->domain, &attr, kind > 0 ? FI_HMEM_DEVICE_ONLY : 0, mr_p);
}

/* Bind to the endpoint and enable, where the provider asks for it. */
static int enable_mr(ferry_ofi_t *ofi, struct fid_mr *mr, struct fid_ep *ep)
{
    if (!(ofi->mr_mode & FI_MR_ENDPOINT))
        return 0;
    int ret = fi_mr_bind(mr, &ep->fid, 0);
    return ret != 0 ? ret : fi_mr_enable(mr);
}

/* A raw key longer than this is refused (a provider's answer, not a size
 * to allocate blindly). */
#define RAW_KEY_MAX 4096

/* Under FI_MR_RAW the key string ends with ":<base>:<raw key>", both as
 * fi_mr_raw_attr gave them: the peer's fi_mr_map_raw wants that base, which
 * is not always the registered start (0 where addresses are offsets). */
static char *key_text(ferry_ofi_t *ofi, ferry_ofi_mem_t *mem)
{
    char *raw_hex = NULL;
    uint64_t raw_base = 0;
    if (ofi->mr_mode & FI_MR_RAW) {
        unsigned char first[256], *raw = first;
        size_t raw_size = sizeof(first);
        int ret = fi_mr_raw_attr(mem->mr, &raw_base, raw, &raw_size, 0);
        /* A longer key: the provider said how long; ask again with that
         * (fi_mr(3): -FI_ETOOSMALL and the size needed in key_size). */
        if (ret == -FI_ETOOSMALL && raw_size > sizeof(first) && raw_size <= RAW_KEY_MAX) {
            if ((raw = malloc(raw_size)) == NULL)
                return NULL;
            ret = fi_mr_raw_attr(mem->mr, &raw_base, raw, &raw_size, 0);
        }
        if (ret != 0)
            ferry_error("ofi: fi_mr_raw_attr (%zu bytes): %s", raw_size, fi_strerror(-ret));
        else
            raw_hex = ferry_ofi_hex_encode(raw, raw_size);
        if (raw != first)
            free(raw);
        if (raw_hex == NULL)
            return NULL;
    }
    char head[128];
    snprintf(head, sizeof(head), FERRY_OFI_KEY_PREFIX "%" PRIx64 ":%" PRIxPTR ":%zx",
             fi_mr_key(mem->mr), (uintptr_t)mem->addr, mem->length);
    char base_text[24] = "";
    if (raw_hex != NULL)
        snprintf(base_text, sizeof(base_text), ":%" PRIx64 ":", raw_base);
    size_t length = strlen(head) + strlen(base_text) + (raw_hex ? strlen(raw_hex) : 0) + 1;
    char *text = malloc(length);
    if (text != NULL)
        snprintf(text, length, "%s%s%s", head, base_text, raw_hex ? raw_hex : "");
    free(raw_hex);
    return text;
}

ferry_status_t ferry_ofi_mem_register(void *ctx, void *addr, size_t length,
                                      const char *location, char **key_p, void **memh_p)
{
    ferry_ofi_t *ofi = ctx;
    *key_p = NULL;
    *memh_p = NULL;
    enum fi_hmem_iface iface;
    int device;
    if (ferry_location_is_cxl(location) || hmem_iface(ofi, location, &iface, &device) < 0)
        return FERRY_ERR_UNSUPPORTED;
    ferry_ofi_mem_t *mem = calloc(1, sizeof(*mem));
    if (mem == NULL)
        return FERRY_ERR_NO_MEMORY;
    mem->addr = addr;
    mem->length = length;
    int ret = register_mr(ofi, addr, length, remote_access | local_access, location, &mem->mr);
    if (ret == 0 && (ret = enable_mr(ofi, mem->mr, ofi->target_ep)) != 0) {
        fi_close(&mem->mr->fid);
        mem->mr = NULL;
    }
    if (ret != 0) {
        ferry_error("ofi: registering %zu bytes at %p (%s): %s", length, addr,
                    location ? location : "cpu", fi_strerror(-ret));
        free(mem);
        return ret == -FI_EOPNOTSUPP ? FERRY_ERR_UNSUPPORTED : ferry_ofi_status(ret);
    }
    mem->desc = fi_mr_desc(mem->mr);
    *key_p = key_text(ofi, mem);
    if (*key_p == NULL) {
        ferry_ofi_mem_deregister(ofi, mem);
        return FERRY_ERR_NO_MEMORY;
    }
    *memh_p = mem;
    return FERRY_OK;
}

void ferry_ofi_mem_deregister(void *ctx, void *memh)
{
    ferry_ofi_mem_t *mem = memh;
    if (mem == NULL)
        return;
    int ret = fi_close(&mem->mr->fid);
    if (ret != 0)
        ferry_warn("ofi: deregistering %p: %s", mem->addr, fi_strerror(-ret));
    free(mem);
}

static int parse_hex_field(const char **text_p, uint64_t *value_p)
{
    const char *p = *text_p;
    uint64_t value = 0;
    size_t digits = 0;
    for (; *p != '\0' && *p != ':'; p++, digits++) {
        char c = *p;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0 || digits >= 16)
            return -1;
        value = value << 4 | (uint64_t)d;
    }
    if (digits == 0)
        return -1;
    *value_p = value;
    *text_p = p;
    return 0;
}

ferry_status_t ferry_ofi_key_parse(const char *text, ferry_ofi_key_t *key_p)
{
    memset(key_p, 0, sizeof(*key_p));
    size_t prefix = strlen(FERRY_OFI_KEY_PREFIX);
    if (text == NULL || strncmp(text, FERRY_OFI_KEY_PREFIX, prefix) != 0)
        return FERRY_ERR_DECODE;
    const char *p = text + prefix;
    if (parse_hex_field(&p, &key_p->key) != 0 || *p++ != ':' ||
        parse_hex_field(&p, &key_p->base) != 0 || *p++ != ':' ||
        parse_hex_field(&p, &key_p->length) != 0)
        return FERRY_ERR_DECODE;
    if (*p == ':') {
        p++;
        if (parse_hex_field(&p, &key_p->raw_base) != 0 || *p != ':')
            return FERRY_ERR_DECODE;
        key_p->raw = ferry_ofi_hex_decode(p + 1, strlen(p + 1), &key_p->raw_length);
        if (key_p->raw == NULL)
            return FERRY_ERR_DECODE;
    } else if (*p != '\0') {
        return FERRY_ERR_DECODE;
    }
    return FERRY_OK;
}

ferry_status_t ferry_ofi_local_desc(ferry_ofi_t *ofi, ferry_ofi_op_t *op, struct fid_ep *ep,
                                    void **desc_p)
{
    *desc_p = NULL;
    if (!(ofi->mr_mode & FI_MR_LOCAL))
        return FERRY_OK;
    const ferry_ofi_mem_t *mem = op->slice->local_memh;
    if (mem != NULL && !(ofi->mr_mode & FI_MR_ENDPOINT)) {
        *desc_p = mem->desc;
        return FERRY_OK;
    }
    if (op->local_mr != NULL) {
        *desc_p = fi_mr_desc(op->local_mr);
        return FERRY_OK; /* a post answered -FI_EAGAIN and is tried again */
    }
    int ret = register_mr(ofi, op->slice->local, op->slice->length, local_access, "cpu",
                          &op->local_mr);
    if (ret == 0 && (ret = enable_mr(ofi, op->local_mr, ep)) != 0) {
        fi_close(&op->local_mr->fid);
        op->local_mr = NULL;
    }
    if (ret != 0) {
        ferry_error("ofi: registering a local buffer of %zu bytes: %s", op->slice->length,
                    fi_strerror(-ret));
        return ferry_ofi_status(ret);
    }
    *desc_p = fi_mr_desc(op->local_mr);
    return FERRY_OK;
}

void ferry_ofi_op_release_local(ferry_ofi_op_t *op)
{
    if (op->local_mr != NULL)
        fi_close(&op->local_mr->fid);
    op->local_mr = NULL;
}

void ferry_ofi_op_release_mr(ferry_ofi_t *ofi, ferry_ofi_op_t *op)
{
    ferry_ofi_op_release_local(op);
    if (op->raw_mapped)
        fi_mr_unmap_key(ofi->domain, op->raw_key);
    op->raw_mapped = 0;
}
