/*
 * The segment descriptor decoder (src/core/descriptor.c and, for the
 * compact form, descriptor_compact.c): what a metadata store or a p2p FETCH
 * hands the engine.  A descriptor it accepts must obey what the rest of the
 * engine relies on (buffers sorted, disjoint, non-empty, ending inside 64
 * bits, found by ferry_descriptor_find), and must encode and decode again
 * to the same value, and encode to the same text, in both forms; a compact
 * text that decodes is the one text of its value.  Inputs that begin
 * "FERRYB" go to the segment blob decoder instead.
 */
#include "fuzz_common.h"

#include "../../src/core/core.h"

#include <string.h>

static int same_text(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

static void check_same(const ferry_descriptor_t *a, const ferry_descriptor_t *b)
{
    FUZZ_CHECK(same_text(a->name, b->name));
    FUZZ_CHECK(a->generation == b->generation);
    FUZZ_CHECK(same_text(a->host_id, b->host_id));
    FUZZ_CHECK(same_text(a->rpc, b->rpc));
    FUZZ_CHECK(a->n_transports == b->n_transports);
    for (size_t t = 0; t < a->n_transports; t++) {
        FUZZ_CHECK(same_text(a->transports[t].name, b->transports[t].name));
        FUZZ_CHECK(same_text(a->transports[t].endpoint, b->transports[t].endpoint));
    }
    FUZZ_CHECK(a->n_buffers == b->n_buffers);
    for (size_t i = 0; i < a->n_buffers; i++) {
        const ferry_desc_buffer_t *x = &a->buffers[i], *y = &b->buffers[i];
        FUZZ_CHECK(x->addr == y->addr && x->length == y->length && x->access == y->access);
        FUZZ_CHECK(same_text(x->location, y->location));
        for (size_t t = 0; t < a->n_transports; t++)
            FUZZ_CHECK(same_text(x->keys[t], y->keys[t]));
    }
}

static void check_buffers(const ferry_descriptor_t *desc)
{
    FUZZ_CHECK(desc->name != NULL && desc->name[0] != '\0');
    for (size_t i = 0; i < desc->n_buffers; i++) {
        const ferry_desc_buffer_t *buffer = &desc->buffers[i];
        FUZZ_CHECK(buffer->length > 0 && buffer->length <= UINT64_MAX - buffer->addr);
        FUZZ_CHECK(i == 0 || desc->buffers[i - 1].addr + desc->buffers[i - 1].length <=
                                 buffer->addr);
        FUZZ_CHECK(ferry_descriptor_find(desc, buffer->addr, buffer->length) == buffer);
        FUZZ_CHECK(ferry_descriptor_find(desc, buffer->addr + buffer->length - 1, 1) == buffer);
        /* one byte past its end is another buffer's or nobody's */
        if (buffer->addr + buffer->length - 1 < UINT64_MAX)
            FUZZ_CHECK(ferry_descriptor_find(desc, buffer->addr, buffer->length + 1) == NULL);
    }
}

/* Encode in one form, decode, compare; and the text is canonical. */
static void check_form(const ferry_descriptor_t *desc, ferry_desc_form_t form)
{
    char *text, *text_again;
    size_t length;
    FUZZ_CHECK(ferry_descriptor_encode_as(desc, form, &text, &length) == FERRY_OK);
    FUZZ_CHECK(ferry_descriptor_text_form(text, length) == form);
    ferry_descriptor_t *again;
    FUZZ_CHECK(ferry_descriptor_decode(text, length, &again) == FERRY_OK);
    check_same(desc, again);
    FUZZ_CHECK(ferry_descriptor_encode_as(again, form, &text_again, NULL) == FERRY_OK);
    FUZZ_CHECK(strcmp(text, text_again) == 0);
    free(text_again);
    free(text);
    ferry_descriptor_unref(again);
}

/* A segment blob (descriptor_blob.c): what ferry_segment_open_blob takes
 * from an application.  One it accepts is a descriptor like any other, and
 * its one blob: it encodes again to the same bytes. */
static int blob_input(const uint8_t *data, size_t size, ferry_descriptor_t **desc_p)
{
    if (ferry_descriptor_blob_decode(data, size, desc_p) != FERRY_OK)
        return 0;
    uint8_t *blob;
    size_t length;
    FUZZ_CHECK(ferry_descriptor_blob_encode(*desc_p, &blob, &length) == FERRY_OK);
    FUZZ_CHECK(length == size && memcmp(blob, data, size) == 0);
    free(blob);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ferry_descriptor_t *desc;
    if (size >= 6 && memcmp(data, "FERRYB", 6) == 0) {
        if (!blob_input(data, size, &desc))
            return 0;
        check_buffers(desc);
        check_form(desc, FERRY_DESC_FORM_COMPACT);
        ferry_descriptor_unref(desc);
        return 0;
    }
    if (ferry_descriptor_decode((const char *)data, size, &desc) != FERRY_OK)
        return 0;
    check_buffers(desc);
    check_form(desc, FERRY_DESC_FORM_JSON);
    check_form(desc, FERRY_DESC_FORM_COMPACT);
    if (ferry_descriptor_text_form((const char *)data, size) == FERRY_DESC_FORM_COMPACT) {
        char *text;
        size_t length;
        FUZZ_CHECK(ferry_descriptor_compact_encode(desc, &text, &length) == FERRY_OK);
        FUZZ_CHECK(length == size && memcmp(text, data, size) == 0);
        free(text);
    }
    ferry_descriptor_unref(desc);
    return 0;
}
