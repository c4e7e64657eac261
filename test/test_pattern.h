/* Byte patterns the tests write and check on both sides. */
#ifndef FERRY_TEST_PATTERN_H
#define FERRY_TEST_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static inline unsigned char test_pattern_byte(size_t i, unsigned seed)
{
    uint64_t x = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
    return (unsigned char)(x >> 56);
}

static inline void test_pattern_fill(unsigned char *p, size_t length, unsigned seed)
{
    for (size_t i = 0; i < length; i++)
        p[i] = test_pattern_byte(i, seed);
}

/* Index of the first wrong byte, or SIZE_MAX. */
static inline size_t test_pattern_check(const unsigned char *p, size_t length, unsigned seed)
{
    for (size_t i = 0; i < length; i++)
        if (p[i] != test_pattern_byte(i, seed))
            return i;
    return SIZE_MAX;
}

static inline uint64_t test_checksum(const unsigned char *p, size_t length)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < length; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

#endif
