/*
 * HTTP bodies as the http and etcd stores take them: curl hands a reply to
 * md_curl.c's write callback in pieces, which gathers them under a size
 * bound into one NUL-terminated body; the http store's fetch hands that
 * body to the engine, which decodes it as a descriptor (segment_cache.c:
 * up to the first NUL).  The callback is static, so this file includes
 * md_curl.c.
 *
 * The input's first byte picks the piece sizes, the second the bound;
 * the rest is the body.  Checked: the gathered body is exactly the bytes
 * received, terminated; a body over the bound stops the transfer at the
 * piece that crosses it, and nothing past the bound is kept.
 */
#include "fuzz_common.h"

#include "../../src/metadata/md_curl.c"
#include "../../src/core/core.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *knobs = fuzz_take(&data, &size, 2);
    if (knobs == NULL)
        return 0;
    unsigned piece_seed = knobs[0];
    /* bound: 0 .. size + 7 bytes, or (often) the stores' own large bound */
    size_t max = knobs[1] < 128 ? (size_t)knobs[1] * (size + 8) / 128 : (size_t)96 << 20;

    ferry_md_reply_t reply;
    memset(&reply, 0, sizeof(reply));
    sink_t sink = {.reply = &reply, .max = max};
    size_t fed = 0;
    int stopped = 0;
    while (fed < size) {
        /* piece sizes 1..64 from a small generator: both tiny and whole pieces */
        piece_seed = piece_seed * 1103515245u + 12345u;
        size_t piece = 1 + (piece_seed >> 16) % 64;
        if (piece > size - fed)
            piece = size - fed;
        size_t taken = on_data((char *)data + fed, 1, piece, &sink);
        if (taken != piece) {
            FUZZ_CHECK(taken == 0 && sink.overflow && fed + piece > max);
            stopped = 1;
            break;
        }
        fed += piece;
    }
    FUZZ_CHECK(stopped || fed == size);
    FUZZ_CHECK(reply.length == fed && reply.length <= max);
    if (reply.body != NULL) {
        FUZZ_CHECK(memcmp(reply.body, data, reply.length) == 0);
        FUZZ_CHECK(reply.body[reply.length] == '\0');
    }
    if (!stopped && reply.body != NULL) {
        ferry_descriptor_t *desc;
        if (ferry_descriptor_decode(reply.body, strlen(reply.body), &desc) == FERRY_OK)
            ferry_descriptor_unref(desc);
    }
    ferry_md_reply_free(&reply);
    return 0;
}
