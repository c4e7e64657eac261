/*
 * The change-set decoder and apply (src/core/descriptor_changes.c): what a
 * p2p owner answers to "changes since revision v".  Whatever decodes must
 * encode to the same text; applied to a descriptor, the result (when
 * accepted) obeys the descriptor's invariants (sorted, disjoint, non-empty,
 * inside 64 bits) and holds exactly one buffer at each added address.
 */
#include "fuzz_common.h"

#include "../../src/core/core.h"

#include <string.h>

/* The base: generation abc, revision 3, two transports, three buffers. */
static const char base_text[] =
    "ferry:desc:1\nname 3:seg\ngeneration abc\nrevision 3\nhost 0:\nrpc 0:\n"
    "transports 2\n3:tcp 0:\n3:ucx 0:\nbuffers 3\n1000 1000 rw 3:cpu 0: 1:a\n"
    "3000 10 r 3:cpu 0: -\n8000 100 w 6:cuda:0 - 1:b\n";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ferry_desc_changes_t changes;
    if (ferry_desc_changes_decode((const char *)data, size, &changes) != FERRY_OK)
        return 0;
    char *text;
    size_t length;
    FUZZ_CHECK(ferry_desc_changes_encode(&changes, changes.from, &text, &length) == FERRY_OK);
    FUZZ_CHECK(length == size && memcmp(text, data, size) == 0);
    free(text);

    ferry_descriptor_t *base, *applied;
    FUZZ_CHECK(ferry_descriptor_decode(base_text, strlen(base_text), &base) == FERRY_OK);
    if (ferry_descriptor_apply(base, &changes, &applied) == FERRY_OK) {
        FUZZ_CHECK(applied->revision == changes.from + changes.n_steps);
        for (size_t i = 0; i < applied->n_buffers; i++) {
            const ferry_desc_buffer_t *b = &applied->buffers[i];
            FUZZ_CHECK(b->length > 0 && b->length <= UINT64_MAX - b->addr);
            FUZZ_CHECK(i == 0 || applied->buffers[i - 1].addr + applied->buffers[i - 1].length <=
                                     b->addr);
            FUZZ_CHECK(ferry_descriptor_find(applied, b->addr, b->length) == b);
        }
        const ferry_desc_step_t *last = changes.n_steps ? &changes.steps[changes.n_steps - 1]
                                                        : NULL;
        for (size_t i = 0; last != NULL && i < last->n_added; i++)
            FUZZ_CHECK(ferry_descriptor_find(applied, last->added[i].addr, 1) != NULL);
        /* the result is a descriptor like any other: its text decodes */
        FUZZ_CHECK(ferry_descriptor_compact_encode(applied, &text, &length) == FERRY_OK);
        ferry_descriptor_t *again;
        FUZZ_CHECK(ferry_descriptor_decode(text, length, &again) == FERRY_OK);
        FUZZ_CHECK(again->n_buffers == applied->n_buffers);
        ferry_descriptor_unref(again);
        free(text);
        ferry_descriptor_unref(applied);
    }
    ferry_descriptor_unref(base);
    ferry_desc_changes_fini(&changes);
    return 0;
}
