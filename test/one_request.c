#include "one_request.h"

#include <criterion/criterion.h>

ferry_status_t one_request(ferry_engine_h engine, ferry_opcode_t op, void *buf,
                           ferry_segment_h segment, uint64_t remote, size_t length,
                           ferry_xfer_status_t *xs_p)
{
    return one_request_via(engine, op, buf, segment, remote, length, NULL, xs_p);
}

ferry_status_t one_request_via(ferry_engine_h engine, ferry_opcode_t op, void *buf,
                               ferry_segment_h segment, uint64_t remote, size_t length,
                               const char *transport, ferry_xfer_status_t *xs_p)
{
    ferry_batch_h batch;
    cr_assert_eq(ferry_batch_create(engine, 1, &batch), FERRY_OK);
    ferry_request_t req = {.opcode = op, .local = buf, .target = segment, .target_offset = remote,
                           .length = length, .transport = transport};
    ferry_status_t status = ferry_batch_submit(batch, &req, 1);
    if (status == FERRY_OK)
        status = ferry_batch_wait(batch, 30000);
    if (xs_p != NULL && ferry_batch_status(batch, 0, xs_p) != FERRY_OK)
        *xs_p = (ferry_xfer_status_t){0};
    cr_assert_eq(ferry_batch_destroy(batch), FERRY_OK);
    return status;
}

ferry_status_t one_request_served_by(ferry_engine_h engine, ferry_opcode_t op, void *buf,
                                     ferry_segment_h segment, uint64_t remote, size_t length,
                                     const char *want_transport)
{
    ferry_xfer_status_t xs;
    ferry_status_t status = one_request(engine, op, buf, segment, remote, length, &xs);
    if (status == FERRY_OK && want_transport != NULL) {
        cr_assert_eq(xs.state, FERRY_XFER_COMPLETED);
        cr_assert_eq(xs.transferred, length);
        cr_assert_str_eq(xs.transport, want_transport, "served by %s", xs.transport);
    }
    return status;
}
