/*
 * ThreadSanitizer builds only: lets Criterion's runner start.
 *
 * Criterion (its BoxFort) maps the arena it shares with each test process
 * at a random address in [0x200000000000, 0x600000000000), MAP_FIXED, after
 * mincore() says the pages are free; it gives up after a few tries.  Under
 * TSan nearly all of that range is TSan's own (shadow and meta memory,
 * reserved), and its mmap refuses a MAP_FIXED outside application memory,
 * so every test program died with "Could not initialize inheritable arena"
 * (Criterion issue 274).  BoxFort draws the address from rand_r(): when
 * libcriterion asks, we answer from the window that lands in TSan's
 * application range for PIE programs, below where the kernel puts the
 * program itself (0x550000000000 - 0x554000000000); every other caller
 * gets rand_r's own answer.  Nothing else about the tests changes.
 */
#ifdef __SANITIZE_THREAD__
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

/* BoxFort: base = 0x200000000000 + (rand_r() & 0x3fffff) * 16 MiB. */
#define ARENA_WINDOW_FIRST 0x350000 /* 0x550000000000 */
#define ARENA_WINDOW_SLOTS 0x4000   /* 256 GiB */

/* Default visibility: -fvisibility=hidden would keep it from libcriterion. */
__attribute__((visibility("default"))) int rand_r(unsigned *seed);

int rand_r(unsigned *seed)
{
    static int (*next_rand_r)(unsigned *);
    if (next_rand_r == NULL)
        *(void **)&next_rand_r = dlsym(RTLD_NEXT, "rand_r");
    int value = next_rand_r(seed);
    Dl_info caller;
    if (dladdr(__builtin_return_address(0), &caller) != 0 && caller.dli_fname != NULL &&
        strstr(caller.dli_fname, "libcriterion") != NULL)
        return ARENA_WINDOW_FIRST + value % ARENA_WINDOW_SLOTS;
    return value;
}
#else
/* ISO C wants something in a translation unit. */
typedef int ferry_tsan_criterion_arena_unused;
#endif
