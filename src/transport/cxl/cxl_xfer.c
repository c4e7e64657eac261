/*
 * cxl transfers: each slice is a bounds-checked copy between the caller's
 * buffer and the window, done in the caller's thread; every slice is
 * finished before submit returns.
 */
#include "cxl.h"
#include "../../util/util.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

/* Every store of the copy is in the window before what follows: the
 * compiler's seq_cst fence ("lock or" with GCC on x86) orders ordinary
 * stores; the non-temporal stores a large memcpy may use need sfence. */
static inline void store_fence(void)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_sfence();
#endif
    atomic_thread_fence(memory_order_seq_cst);
}

static int parse_hex(const char *text, char stop, uint64_t *value_p, const char **end_p)
{
    if (!isxdigit((unsigned char)text[0]))
        return 0; /* strtoull would take spaces and a sign */
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 16);
    if (errno != 0 || *end != stop)
        return 0;
    *value_p = value;
    *end_p = end;
    return 1;
}

int ferry_cxl_key_parse(const char *key, uint64_t *offset_p, uint64_t *addr_p)
{
    const char *end;
    return key != NULL && parse_hex(key, '@', offset_p, &end) &&
           parse_hex(end + 1, '\0', addr_p, &end);
}

/* The window offset a slice addresses: off + (remote_addr - addr). */
static int slice_offset(const ferry_slice_t *s, uint64_t *offset_p)
{
    uint64_t off, addr;
    if (!ferry_cxl_key_parse(s->remote_key, &off, &addr) || s->remote_addr < addr ||
        s->remote_addr - addr > UINT64_MAX - off)
        return 0;
    *offset_p = off + (s->remote_addr - addr);
    return 1;
}

static ferry_status_t copy_slice(ferry_cxl_t *cxl, const ferry_peer_t *peer,
                                 const ferry_slice_t *s)
{
    ferry_cxl_window_t *window = &cxl->window;
    const char *what = s->opcode == FERRY_OP_WRITE ? "write" : "read";
    uint64_t offset;
    uint32_t hold;
    if (!slice_offset(s, &offset)) {
        ferry_error("cxl: %s of [0x%llx, +%zu) at %s refused: its key \"%s\" maps it to no "
                    "window offset", what, (unsigned long long)s->remote_addr, s->length,
                    peer->name, s->remote_key ? s->remote_key : "");
        return FERRY_ERR_OUT_OF_RANGE;
    }
    if (ferry_cxl_range_acquire(window, offset, s->length, peer->generation, &hold) != FERRY_OK) {
        ferry_error("cxl: %s of [0x%llx, +%zu) at %s refused: window offset 0x%llx is not inside "
                    "one of its allocations in %s (%zu bytes)", what,
                    (unsigned long long)s->remote_addr, s->length, peer->name,
                    (unsigned long long)offset, window->path, window->size);
        return FERRY_ERR_OUT_OF_RANGE;
    }
    /* memmove where a forged key names the chunks the local buffer lies in. */
    unsigned char *there = window->base + offset;
    unsigned char *mine = s->local;
    int overlap = there < mine + s->length && mine < there + s->length;
    if (s->opcode == FERRY_OP_WRITE) {
        if (overlap) {
            memmove(there, s->local, s->length);
        } else { /* non-temporal when large, shared with the copy helpers when larger */
            ferry_copy_item_t copy = {there, s->local, s->length, 1};
            ferry_copy_many(&copy, 1);
        }
        store_fence(); /* in the window before the request completes */
    } else {
        /* Nothing of the window is read before what made us ask. */
        atomic_thread_fence(memory_order_seq_cst);
        if (overlap) {
            memmove(s->local, there, s->length);
        } else {
            ferry_copy_item_t copy = {s->local, there, s->length, 0};
            ferry_copy_many(&copy, 1);
        }
    }
    ferry_cxl_range_release(window, hold);
    return FERRY_OK;
}

ferry_status_t ferry_cxl_submit(void *ctx, const ferry_peer_t *peer, ferry_slice_t *slices)
{
    ferry_cxl_t *cxl = ctx;
    if (slices == NULL || peer == NULL)
        return FERRY_ERR_INVALID_PARAM;
    for (ferry_slice_t *s = slices; s != NULL; s = s->next)
        if (s->length == 0 || s->local == NULL ||
            (s->opcode != FERRY_OP_READ && s->opcode != FERRY_OP_WRITE))
            return FERRY_ERR_INVALID_PARAM;
    /* reaches() compared the endpoints; a descriptor is immutable, but a
     * caller may hand us any peer. */
    if (peer->endpoint == NULL || strcmp(peer->endpoint, cxl->address) != 0)
        return FERRY_ERR_UNSUPPORTED;
    if (!ferry_cxl_window_intact(&cxl->window))
        return FERRY_ERR_IO;
    /* Until one slice is done, a failure queues nothing; after that, each
     * slice reports its own result. */
    ferry_status_t first = copy_slice(cxl, peer, slices);
    if (first != FERRY_OK)
        return first;
    /* The slices finish in runs of one result, a call per run (one, as a
     * rule): the engine settles a run's requests together. */
    ferry_slice_t *run = slices, *last = NULL;
    ferry_status_t run_status = FERRY_OK;
    for (ferry_slice_t *s = slices; s != NULL; last = s, s = s->next) {
        ferry_status_t status = s == slices ? FERRY_OK : copy_slice(cxl, peer, s);
        if (status != run_status) {
            last->next = NULL;
            ferry_transport_slices_done(&cxl->svc, run, run_status);
            run = s;
            run_status = status;
        }
    }
    ferry_transport_slices_done(&cxl->svc, run, run_status);
    return FERRY_OK;
}
