/*
 * ucx memory: ucp_mem_map of registered ranges, the packed rkey as base64
 * text for the descriptor, and the per-endpoint cache of unpacked rkeys.
 */
#include "ucx.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define RKEY_BUCKETS 64

typedef struct ferry_ucx_memh {
    ucp_mem_h memh;
    void *addr;
    size_t length;
} ferry_ucx_memh_t;

/* ---------------- base64 (RFC 4648, padded) ---------------- */

static const char b64_alphabet[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *ferry_ucx_base64_encode(const void *data, size_t length)
{
    const unsigned char *in = data;
    char *out = malloc((length + 2) / 3 * 4 + 1), *p = out;
    if (out == NULL)
        return NULL;
    size_t i = 0;
    for (; i + 2 < length; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        *p++ = b64_alphabet[v >> 18];
        *p++ = b64_alphabet[(v >> 12) & 63];
        *p++ = b64_alphabet[(v >> 6) & 63];
        *p++ = b64_alphabet[v & 63];
    }
    if (i < length) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < length ? (uint32_t)in[i + 1] << 8 : 0);
        *p++ = b64_alphabet[v >> 18];
        *p++ = b64_alphabet[(v >> 12) & 63];
        *p++ = i + 1 < length ? b64_alphabet[(v >> 6) & 63] : '=';
        *p++ = '=';
    }
    *p = '\0';
    return out;
}

static int b64_value(char c)
{
    const char *hit = c ? strchr(b64_alphabet, c) : NULL;
    return hit ? (int)(hit - b64_alphabet) : -1;
}

void *ferry_ucx_base64_decode(const char *text, size_t text_length, size_t *length_p)
{
    if (text_length == 0 || text_length % 4 != 0)
        return NULL;
    size_t pad = (text[text_length - 1] == '=') + (text[text_length - 2] == '=');
    unsigned char *out = malloc(text_length / 4 * 3), *p = out;
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < text_length; i += 4) {
        int last = i + 4 == text_length;
        int v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = (last && k >= 4 - (int)pad) ? 0 : b64_value(text[i + k]);
            if (v[k] < 0) {
                free(out);
                return NULL;
            }
        }
        uint32_t bits = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)v[2] << 6 |
                        (uint32_t)v[3];
        *p++ = (unsigned char)(bits >> 16);
        if (!last || pad < 2)
            *p++ = (unsigned char)(bits >> 8);
        if (!last || pad < 1)
            *p++ = (unsigned char)bits;
    }
    *length_p = (size_t)(p - out);
    return out;
}

/* ---------------- registration ---------------- */

/* "cpu", "cpu:N", "cxl", "cxl:N" -> host; "cuda:N" -> CUDA; "rocm:N" -> ROCm;
 * 0 if unknown. */
static int location_memory_type(const char *location, ucs_memory_type_t *type_p)
{
    static const struct {
        const char *prefix;
        ucs_memory_type_t type;
    } kinds[] = {
        {"cpu", UCS_MEMORY_TYPE_HOST}, /* any case: "CPU" has always worked here */
        {"host", UCS_MEMORY_TYPE_HOST},
        {"cuda_managed", UCS_MEMORY_TYPE_CUDA_MANAGED},
        {"cuda", UCS_MEMORY_TYPE_CUDA},
        {"rocm_managed", UCS_MEMORY_TYPE_ROCM_MANAGED},
        {"rocm", UCS_MEMORY_TYPE_ROCM},
        {"hip", UCS_MEMORY_TYPE_ROCM},
    };
    if (ferry_location_is_host(location)) {
        *type_p = UCS_MEMORY_TYPE_HOST;
        return 1;
    }
    for (size_t i = 0; i < FERRY_UCX_ARRAY_SIZE(kinds); i++) {
        size_t n = strlen(kinds[i].prefix);
        if (strncasecmp(location, kinds[i].prefix, n) == 0 &&
            (location[n] == '\0' || location[n] == ':')) {
            *type_p = kinds[i].type;
            return 1;
        }
    }
    return 0;
}

/* ucp_mem_map with params, then the packed rkey as base64.  *memh_p stays
 * NULL (and FERRY_OK is returned) when UCX cannot map that memory. */
static ferry_status_t map_and_pack(ferry_ucx_t *ucx, ucp_mem_map_params_t *params,
                                   const char *location, char **key_p, void **memh_p)
{
    *key_p = NULL;
    *memh_p = NULL;
    ferry_ucx_memh_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return FERRY_ERR_NO_MEMORY;
    ucs_memory_type_t type;
    if (location_memory_type(location, &type)) {
        params->field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        params->memory_type = type;
    } /* else UCX detects the memory type itself */
    ucs_status_t status = ucp_mem_map(ucx->context, params, &m->memh);
    if (status != UCS_OK) {
        /* No key means "ucx does not reach this buffer": the engine picks
         * another transport for it instead of refusing the registration. */
        static atomic_int warned;
        if (atomic_exchange(&warned, 1) == 0)
            ferry_warn("ucx: cannot map [%p, +%zu) at %s: %s; ucx will not serve such "
                       "buffers (is UCX built with support for that memory?)", params->address,
                       params->length, location ? location : "cpu", ucs_status_string(status));
        free(m);
        return FERRY_OK;
    }
    ucp_mem_attr_t attr = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
    status = ucp_mem_query(m->memh, &attr);
    m->addr = status == UCS_OK ? attr.address : params->address;
    m->length = status == UCS_OK ? attr.length : params->length;
    void *packed;
    size_t packed_size;
    status = ucp_rkey_pack(ucx->context, m->memh, &packed, &packed_size);
    if (status != UCS_OK) {
        ferry_error("ucx: ucp_rkey_pack of [%p, +%zu) failed: %s", m->addr, m->length,
                    ucs_status_string(status));
        ucp_mem_unmap(ucx->context, m->memh);
        free(m);
        return FERRY_ERR_NO_RESOURCE;
    }
    /* The descriptor holds text: the packed key travels as base64, and the
     * packed buffer is not needed once encoded. */
    *key_p = ferry_ucx_base64_encode(packed, packed_size);
    ucp_rkey_buffer_release(packed);
    if (*key_p == NULL) {
        ucp_mem_unmap(ucx->context, m->memh);
        free(m);
        return FERRY_ERR_NO_MEMORY;
    }
    *memh_p = m;
    return FERRY_OK;
}

/* Whether UCX moves memory at that location itself: host memory, or
 * device memory of a type this UCX was built for (a UCX without CUDA
 * support would copy "cuda" memory with the CPU on the target). */
int ferry_ucx_local_memory(void *ctx, const char *location)
{
    ferry_ucx_t *ucx = ctx;
    ucs_memory_type_t type;
    if (ferry_location_is_host(location))
        return 1;
    if (!location_memory_type(location, &type))
        return 0; /* a device kind UCX has no name for (the test suite's) */
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    return ucp_context_query(ucx->context, &attr) == UCS_OK &&
           (attr.memory_types & UCS_BIT(type)) != 0;
}

ferry_status_t ferry_ucx_mem_register(void *ctx, void *addr, size_t length, const char *location,
                                      char **key_p, void **memh_p)
{
    if (!ferry_ucx_local_memory(ctx, location)) {
        *key_p = NULL;
        *memh_p = NULL;
        return FERRY_ERR_UNSUPPORTED; /* the engine stages it, peers use another transport */
    }
    ucp_mem_map_params_t params = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH,
        .address = addr,
        .length = length,
    };
    return map_and_pack(ctx, &params, location, key_p, memh_p);
}

/* Memory UCX allocates can be reached in ways user memory cannot: on one
 * host, posix shared memory that peers map and write with plain stores
 * (rkey_ptr), where registered user memory goes through UCX's RMA emulation
 * over the shared-memory FIFOs. */
ferry_status_t ferry_ucx_mem_alloc(void *ctx, size_t length, const char *location, void **addr_p,
                                   char **key_p, void **memh_p)
{
    ucs_memory_type_t type;
    if (!location_memory_type(location, &type))
        return FERRY_ERR_UNSUPPORTED; /* nothing to detect a type from */
    /* "cxl" memory is the CXL window's, which only the cxl transport hands
     * out: UCX memory in its place would not be in the window at all. */
    if (ferry_location_is_cxl(location))
        return FERRY_ERR_UNSUPPORTED;
    ucp_mem_map_params_t params = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL,
        .length = length,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    ferry_status_t status = map_and_pack(ctx, &params, location, key_p, memh_p);
    if (status == FERRY_OK && *memh_p == NULL)
        status = FERRY_ERR_UNSUPPORTED;
    if (status != FERRY_OK)
        return status;
    *addr_p = ((ferry_ucx_memh_t *)*memh_p)->addr;
    return FERRY_OK;
}

void ferry_ucx_mem_deregister(void *ctx, void *memh)
{
    ferry_ucx_t *ucx = ctx;
    ferry_ucx_memh_t *m = memh;
    if (m == NULL)
        return;
    ucs_status_t status = ucp_mem_unmap(ucx->context, m->memh);
    if (status != UCS_OK)
        ferry_warn("ucx: ucp_mem_unmap of [%p, +%zu) failed: %s", m->addr, m->length,
                   ucs_status_string(status));
    free(m);
}

ucp_mem_h ferry_ucx_memh(const void *memh)
{
    return memh ? ((const ferry_ucx_memh_t *)memh)->memh : NULL;
}

/* ---------------- the rkey cache of an endpoint (ep->lock) ---------------- */

ferry_status_t ferry_ucx_rkey_get(ferry_ucx_ep_t *ep, const char *key,
                                  ferry_ucx_rkey_t **entry_p)
{
    if (ep->rkeys == NULL && (ep->rkeys = calloc(RKEY_BUCKETS, sizeof(*ep->rkeys))) == NULL)
        return FERRY_ERR_NO_MEMORY;
    uint64_t hash = ferry_ucx_hash(key, 0);
    ferry_ucx_rkey_t **bucket = &ep->rkeys[hash % RKEY_BUCKETS];
    for (ferry_ucx_rkey_t *e = *bucket; e != NULL; e = e->next) {
        if (e->hash == hash && strcmp(e->key, key) == 0) {
            *entry_p = e;
            return FERRY_OK;
        }
    }
    size_t packed_size;
    void *packed = ferry_ucx_base64_decode(key, strlen(key), &packed_size);
    if (packed == NULL) {
        ferry_error("ucx: the key of a buffer of %s is not base64 text", ep->name);
        return FERRY_ERR_DECODE;
    }
    ferry_ucx_rkey_t *e = calloc(1, sizeof(*e));
    if (e == NULL || (e->key = strdup(key)) == NULL) {
        free(e);
        free(packed);
        return FERRY_ERR_NO_MEMORY;
    }
    ucs_status_t status = ucp_ep_rkey_unpack(ep->ep, packed, &e->rkey);
    free(packed);
    if (status != UCS_OK) {
        ferry_error("ucx: cannot unpack the rkey of a buffer of %s: %s", ep->name,
                    ucs_status_string(status));
        free(e->key);
        free(e);
        return FERRY_ERR_DECODE;
    }
    /* Memory UCX allocated (ferry_alloc) on this host is attached: UCX then
     * writes it with plain stores.  The sm rkey is an offset, so any
     * address answers the question. */
    void *mapped;
    e->direct = ucp_rkey_ptr(e->rkey, 0, &mapped) == UCS_OK;
    e->hash = hash;
    e->next = *bucket;
    *bucket = e;
    ep->n_rkeys++;
    *entry_p = e;
    return FERRY_OK;
}

/* The bounds of our mapping that holds addr, from /proc/self/maps. */
static int mapping_bounds(uintptr_t addr, uintptr_t *lo_p, uintptr_t *hi_p)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    if (maps == NULL)
        return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof(line), maps) != NULL) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && addr >= lo && addr < hi) {
            *lo_p = lo;
            *hi_p = hi;
            found = 1;
        }
    }
    fclose(maps);
    return found;
}

void *ferry_ucx_direct_map(ferry_ucx_rkey_t *e, uint64_t remote_addr, size_t length)
{
    /* Where UCX attached the peer's memory, and how far that mapping goes,
     * so no descriptor can make us copy past its end. */
    void *ptr;
    if (ucp_rkey_ptr(e->rkey, remote_addr, &ptr) != UCS_OK ||
        !mapping_bounds((uintptr_t)ptr, &e->map_lo, &e->map_hi)) {
        e->map_lo = e->map_hi = 1; /* nothing fits: every range is refused */
        return NULL;
    }
    e->delta = (uintptr_t)ptr - (uintptr_t)remote_addr;
    return ferry_ucx_direct_ptr(e, remote_addr, length);
}

void ferry_ucx_rkeys_flush(ferry_ucx_ep_t *ep)
{
    if (ep->rkeys == NULL)
        return;
    for (size_t b = 0; b < RKEY_BUCKETS; b++) {
        for (ferry_ucx_rkey_t *e = ep->rkeys[b], *next; e != NULL; e = next) {
            next = e->next;
            ucp_rkey_destroy(e->rkey);
            free(e->key);
            free(e);
        }
        ep->rkeys[b] = NULL;
    }
    ep->n_rkeys = 0;
    ep->rkeys_flushes++;
}
