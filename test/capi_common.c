/* The C API suites' engine and buffer (capi_common.h). */
#include "capi_common.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#include "one_request.h"
#include "peer_process.h"
#include "test_pattern.h"

ferry_engine_h capi_engine;
unsigned char *capi_local;

void capi_setup(void)
{
    setenv("FERRY_TCP_TIMEOUT", "1000", 1);
    setenv("FERRY_TRANSPORTS", "tcp", 1); /* peers inherit both */
    cr_assert_eq(ferry_engine_create(NULL, &capi_engine), FERRY_OK);
    cr_assert_eq(posix_memalign((void **)&capi_local, 4096, CAPI_LOCAL_SIZE), 0);
}

void capi_teardown(void)
{
    ferry_engine_destroy(capi_engine);
    free(capi_local);
}

ferry_status_t capi_write(ferry_segment_h segment, uint64_t remote, size_t length,
                          unsigned seed)
{
    test_pattern_fill(capi_local, length, seed);
    return one_request(capi_engine, FERRY_OP_WRITE, capi_local, segment, remote, length, NULL);
}

ferry_segment_h capi_open_peer(struct peer_process *peer, const char *const *env)
{
    ferry_segment_h segment;
    cr_assert_eq(peer_start(peer, env), 0);
    cr_assert_eq(ferry_segment_open(capi_engine, peer->name, &segment), FERRY_OK);
    return segment;
}
