/*
 * Copies into memory another process reads: what the same-host transports
 * (ucx into attached memory, cxl into the window) do for a WRITE.
 *
 * From FERRY_COPY_NT_MIN bytes on x86-64 the bulk goes out with
 * non-temporal stores: they skip the read-for-ownership of each
 * destination line that plain stores pay, and do not push the caller's
 * working set out of the cache for data another process consumes.  On this
 * project's 2-core VM a 4 MiB copy runs 1.35-1.40x faster (5.0 -> 7.0 GB/s)
 * and a 256 KiB one 1.17x; below that plain memcpy keeps the data in the
 * cache the reader shares.  A destination written again by the thread
 * that wrote it last (one buffer rewritten in a loop) is likely still in
 * this core's cache, where plain stores are faster than any trip to
 * memory: it gets memcpy too.  An sfence ends a non-temporal copy: such
 * stores are ordered by nothing else.
 */
#include "util.h"

#include <stdatomic.h>
#include <string.h>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define FERRY_HAVE_NT_COPY 1
#endif

static atomic_size_t nt_min = 256 * 1024;
static _Thread_local const void *last_dst; /* this thread's previous large destination */

void ferry_copy_set_nt_min(size_t bytes)
{
    atomic_store_explicit(&nt_min, bytes, memory_order_relaxed);
}

#ifdef FERRY_HAVE_NT_COPY
static void copy_nt(unsigned char *dst, const unsigned char *src, size_t length)
{
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15; /* streaming stores need 16-byte lines */
    memcpy(dst, src, head);
    dst += head;
    src += head;
    length -= head;
    for (; length >= 64; length -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)src);
        __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
    memcpy(dst, src, length);
    _mm_sfence();
}
#endif

int ferry_copy_nt_wanted(const void *dst, size_t length)
{
#ifdef FERRY_HAVE_NT_COPY
    size_t min = atomic_load_explicit(&nt_min, memory_order_relaxed);
    if (min != 0 && length >= min && length >= 64) { /* small copies skip the TLS access */
        int again = dst == last_dst;
        last_dst = dst;
        return !again;
    }
#else
    (void)dst;
    (void)length;
#endif
    return 0;
}

void ferry_copy_piece(void *dst, const void *src, size_t length, int nt)
{
#ifdef FERRY_HAVE_NT_COPY
    if (nt && length >= 64) {
        copy_nt(dst, src, length);
        return;
    }
#else
    (void)nt;
#endif
    memcpy(dst, src, length);
}

void ferry_copy_to_peer(void *dst, const void *src, size_t length)
{
    if (length < 64) { /* never streamed: no setting to read */
        memcpy(dst, src, length);
        return;
    }
    ferry_copy_piece(dst, src, length, ferry_copy_nt_wanted(dst, length));
}
