/* What the C API suites (test_capi_*.c) share: one engine over tcp and a
 * local buffer, set up and torn down around each test. */
#ifndef FERRY_TEST_CAPI_COMMON_H
#define FERRY_TEST_CAPI_COMMON_H

#include <ferry/ferry.h>

#define CAPI_LOCAL_SIZE ((size_t)8 << 20)

extern ferry_engine_h capi_engine;
extern unsigned char *capi_local; /* CAPI_LOCAL_SIZE bytes */

void capi_setup(void);
void capi_teardown(void);
/* Write length bytes of pattern seed from capi_local to remote of segment
 * (one request, its own batch, 30 s at most); its status. */
ferry_status_t capi_write(ferry_segment_h segment, uint64_t remote, size_t length,
                          unsigned seed);

/* Start a ferry_test_peer (env as for peer_start) and open its segment. */
struct peer_process;
ferry_segment_h capi_open_peer(struct peer_process *peer, const char *const *env);

#endif
