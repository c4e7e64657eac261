/*
 * Shared by the libFuzzer harnesses in this folder (contrib/fuzz.sh builds
 * them; doc/fuzzing.md says how to run them).  Each harness feeds what a
 * peer, a server or a metadata store could send to the code that first reads
 * it, and checks the invariants that code promises; a broken one aborts, so
 * libFuzzer keeps the input.
 */
#ifndef FERRY_FUZZ_COMMON_H
#define FERRY_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "fuzz check failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);   \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

/* The next n bytes of the input, or NULL (and nothing taken) when fewer remain. */
static inline const uint8_t *fuzz_take(const uint8_t **data_p, size_t *size_p, size_t n)
{
    if (*size_p < n)
        return NULL;
    const uint8_t *at = *data_p;
    *data_p += n;
    *size_p -= n;
    return at;
}

/* A NUL-terminated copy: bodies reach our readers that way. */
char *fuzz_text(const uint8_t *data, size_t size);

#endif
