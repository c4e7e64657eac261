/* Descriptors for the codec tests (test_descriptor). */
#ifndef FERRY_TEST_DESCRIPTOR_SAMPLES_H
#define FERRY_TEST_DESCRIPTOR_SAMPLES_H

#include "../src/core/core.h"

/* n_buffers buffers over three transports ("tcp", "ucx", "local"): keys
 * present, absent and empty, one with every printable byte and some UTF-8,
 * two locations; seed varies addresses, lengths, generation and revision. */
ferry_descriptor_t *ferry_test_sample_desc(size_t n_buffers, uint64_t seed);
/* Criterion-asserts that a and b hold the same value (revision aside). */
void ferry_test_expect_same_desc(const ferry_descriptor_t *a, const ferry_descriptor_t *b);

#endif
