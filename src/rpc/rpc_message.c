/*
 * The RPC requests' payloads: one writer and one reader per message, so the
 * engine that sends, the engine that serves and the fuzz harness that
 * reads hostile payloads (test/fuzz/fuzz_rpc.c) share one definition.
 * Readers copy strings into bounded buffers and fail on a truncated or
 * malformed payload (FERRY_ERR_PROTOCOL).
 */
#include "rpc.h"

#include <stdlib.h>

static ferry_status_t read_end(const ferry_wire_reader_t *in)
{
    return in->failed ? FERRY_ERR_PROTOCOL : FERRY_OK;
}

static ferry_status_t write_end(ferry_wire_writer_t *out)
{
    if (!out->failed)
        return FERRY_OK;
    free(out->data);
    *out = (ferry_wire_writer_t){0};
    return FERRY_ERR_NO_MEMORY;
}

ferry_status_t ferry_rpc_fetch_write(ferry_wire_writer_t *out, const char *name, const char *from)
{
    ferry_wire_put_str(out, name);
    ferry_wire_put_str(out, from);
    return write_end(out);
}

ferry_status_t ferry_rpc_fetch_since_write(ferry_wire_writer_t *out, const ferry_rpc_fetch_t *m)
{
    ferry_wire_put_str(out, m->name);
    ferry_wire_put_str(out, m->from);
    ferry_wire_put_u64(out, m->accept);
    ferry_wire_put_u64(out, m->generation);
    ferry_wire_put_u64(out, m->revision);
    return write_end(out);
}

ferry_status_t ferry_rpc_fetch_read(ferry_wire_reader_t *in, ferry_rpc_fetch_t *m)
{
    ferry_wire_get_str(in, m->name, sizeof(m->name));
    ferry_wire_get_str(in, m->from, sizeof(m->from));
    m->extended = !in->failed && in->offset < in->length;
    m->accept = m->extended ? ferry_wire_get_u64(in) : 0;
    m->generation = m->extended ? ferry_wire_get_u64(in) : 0;
    m->revision = m->extended ? ferry_wire_get_u64(in) : 0;
    return read_end(in);
}

ferry_status_t ferry_rpc_notify_write(ferry_wire_writer_t *out, const char *from,
                                      const void *msg, size_t length)
{
    ferry_wire_put_str(out, from);
    ferry_wire_put_bytes(out, msg, length);
    return write_end(out);
}

ferry_status_t ferry_rpc_notify_read(ferry_wire_reader_t *in, ferry_rpc_notify_t *m)
{
    ferry_wire_get_str(in, m->from, sizeof(m->from));
    m->msg = ferry_wire_get_bytes(in, &m->length);
    return read_end(in);
}

ferry_status_t ferry_rpc_invalidate_write(ferry_wire_writer_t *out, const char *name,
                                          uint64_t generation)
{
    ferry_wire_put_str(out, name);
    ferry_wire_put_u64(out, generation);
    return write_end(out);
}

ferry_status_t ferry_rpc_invalidate_read(ferry_wire_reader_t *in, ferry_rpc_invalidate_t *m)
{
    ferry_wire_get_str(in, m->name, sizeof(m->name));
    m->generation = ferry_wire_get_u64(in);
    return read_end(in);
}

ferry_status_t ferry_rpc_probe_reply_write(ferry_wire_writer_t *out, uint64_t generation,
                                           const char *name)
{
    ferry_wire_put_u64(out, generation);
    ferry_wire_put_str(out, name);
    return write_end(out);
}

ferry_status_t ferry_rpc_probe_reply_read(ferry_wire_reader_t *in, ferry_rpc_probe_reply_t *m)
{
    m->generation = ferry_wire_get_u64(in);
    ferry_wire_get_str(in, m->name, sizeof(m->name));
    return read_end(in);
}
