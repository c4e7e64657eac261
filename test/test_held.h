/*
 * For tests that look inside the segment cache: the descriptor an engine
 * holds for one of its open segments (referenced; the caller unrefs it).
 */
#ifndef FERRY_TEST_HELD_H
#define FERRY_TEST_HELD_H

#include <criterion/criterion.h>

#include "../src/core/core.h"

static inline ferry_descriptor_t *held(ferry_engine_h reader, ferry_segment_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(reader);
    ferry_segment_t *segment = ferry_handle_lookup((uint64_t)(uintptr_t)handle,
                                                   FERRY_HANDLE_SEGMENT, engine);
    cr_assert_not_null(segment);
    ferry_descriptor_t *desc;
    cr_assert_eq(ferry_segment_descriptor(engine, segment, &desc), FERRY_OK);
    return desc;
}

#endif
