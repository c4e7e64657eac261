/* A small, seeded random generator (xorshift64) for tests that want the
 * same "random" cases on every run. */
#ifndef FERRY_TEST_RNG_H
#define FERRY_TEST_RNG_H

#include <stdint.h>

/* *state must start non-zero. */
static inline uint64_t test_rng_next(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

#endif
