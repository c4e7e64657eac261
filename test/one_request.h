/* One request in its own batch, for tests that look at single transfers. */
#ifndef FERRY_TEST_ONE_REQUEST_H
#define FERRY_TEST_ONE_REQUEST_H

#include <ferry/ferry.h>

/* Submit, wait (30 s at most) and destroy the batch; *xs_p (if not NULL)
 * gets the request's status as ferry_batch_status reports it. */
ferry_status_t one_request(ferry_engine_h engine, ferry_opcode_t op, void *buf,
                           ferry_segment_h segment, uint64_t remote, size_t length,
                           ferry_xfer_status_t *xs_p);
/* The same with the request's transport field set (NULL: the engine picks). */
ferry_status_t one_request_via(ferry_engine_h engine, ferry_opcode_t op, void *buf,
                               ferry_segment_h segment, uint64_t remote, size_t length,
                               const char *transport, ferry_xfer_status_t *xs_p);
/* The same; when it completed and want_transport is not NULL, asserts that
 * all of it was transferred by that transport. */
ferry_status_t one_request_served_by(ferry_engine_h engine, ferry_opcode_t op, void *buf,
                                     ferry_segment_h segment, uint64_t remote, size_t length,
                                     const char *want_transport);

#endif
