/*
 * The RPC frame parser: what one connection to an engine's RPC listener can
 * send.  The input is the byte stream; frames are read as rpc_server.c
 * reads them (16-byte header through ferry_rpc_header_unpack, then the
 * payload), and each payload goes through the readers the engine's
 * handlers use (src/rpc/rpc_message.c: FETCH, NOTIFY, INVALIDATE; PROBE has
 * no payload), and the one a client reads a PROBE reply with.
 *
 * Checked: a header that unpacks packs back to the same 16 bytes; a reader
 * never runs past its payload, and fails cleanly (empty strings, NULL
 * bytes); what a request parses to encodes back to the bytes it came from.
 */
#include "fuzz_common.h"

#include "../../src/rpc/rpc.h"

#include <string.h>

/* FERRY_RPC_MAX_FRAME's default */
#define FUZZ_MAX_FRAME ((size_t)64 << 20)

static void check_reader(const ferry_wire_reader_t *in)
{
    FUZZ_CHECK(in->offset <= in->length);
}

/* What was read must be what the writer makes of the same fields. */
static void check_encoding(const ferry_wire_reader_t *in, ferry_wire_writer_t *out,
                           ferry_status_t written)
{
    FUZZ_CHECK(written == FERRY_OK);
    FUZZ_CHECK(out->length == in->offset);
    FUZZ_CHECK(out->length == 0 || memcmp(out->data, in->data, out->length) == 0);
    free(out->data);
}

/* A string read: terminated inside its buffer. */
#define CHECK_STRING(field) FUZZ_CHECK(strnlen((field), sizeof(field)) < sizeof(field))

static void read_fetch(ferry_wire_reader_t *in)
{
    ferry_rpc_fetch_t m;
    ferry_status_t status = ferry_rpc_fetch_read(in, &m);
    check_reader(in);
    CHECK_STRING(m.name);
    CHECK_STRING(m.from);
    if (status != FERRY_OK)
        return;
    ferry_wire_writer_t out = {0};
    check_encoding(in, &out, m.extended ? ferry_rpc_fetch_since_write(&out, &m)
                                        : ferry_rpc_fetch_write(&out, m.name, m.from));
}

static void read_notify(ferry_wire_reader_t *in)
{
    ferry_rpc_notify_t m;
    ferry_status_t status = ferry_rpc_notify_read(in, &m);
    check_reader(in);
    CHECK_STRING(m.from);
    if (status != FERRY_OK) {
        FUZZ_CHECK(m.msg == NULL && m.length == 0);
        return;
    }
    FUZZ_CHECK(m.msg != NULL);
    FUZZ_CHECK((const uint8_t *)m.msg + m.length <= in->data + in->length);
    ferry_wire_writer_t out = {0};
    check_encoding(in, &out, ferry_rpc_notify_write(&out, m.from, m.msg, m.length));
}

static void read_invalidate(ferry_wire_reader_t *in)
{
    ferry_rpc_invalidate_t m;
    ferry_status_t status = ferry_rpc_invalidate_read(in, &m);
    check_reader(in);
    CHECK_STRING(m.name);
    if (status != FERRY_OK)
        return;
    ferry_wire_writer_t out = {0};
    check_encoding(in, &out, ferry_rpc_invalidate_write(&out, m.name, m.generation));
}

static void read_probe_reply(ferry_wire_reader_t *in)
{
    ferry_rpc_probe_reply_t m;
    ferry_status_t status = ferry_rpc_probe_reply_read(in, &m);
    check_reader(in);
    CHECK_STRING(m.name);
    if (status != FERRY_OK)
        return;
    ferry_wire_writer_t out = {0};
    check_encoding(in, &out, ferry_rpc_probe_reply_write(&out, m.generation, m.name));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (;;) {
        const uint8_t *bytes = fuzz_take(&data, &size, FERRY_RPC_HEADER_SIZE);
        if (bytes == NULL)
            return 0; /* closed between frames, or inside a header */
        ferry_rpc_header_t header;
        if (ferry_rpc_header_unpack(bytes, FUZZ_MAX_FRAME, &header) != FERRY_OK)
            return 0; /* the listener closes the connection */
        FUZZ_CHECK(header.length <= FUZZ_MAX_FRAME);
        FUZZ_CHECK(header.type >= FERRY_RPC_FETCH && header.type <= FERRY_RPC_ERROR_REPLY);
        uint8_t packed[FERRY_RPC_HEADER_SIZE];
        ferry_rpc_header_pack(&header, packed);
        FUZZ_CHECK(memcmp(packed, bytes, sizeof(packed)) == 0);

        const uint8_t *payload = fuzz_take(&data, &size, header.length);
        if (payload == NULL)
            return 0; /* closed inside the payload */
        /* the server hands a handler a non-NULL payload, also when empty */
        static const uint8_t empty[1];
        ferry_wire_reader_t in = {.data = header.length ? payload : empty,
                                  .length = header.length};
        switch (header.type) {
        case FERRY_RPC_FETCH: read_fetch(&in); break;
        case FERRY_RPC_NOTIFY: read_notify(&in); break;
        case FERRY_RPC_INVALIDATE: read_invalidate(&in); break;
        case FERRY_RPC_PROBE_REPLY: read_probe_reply(&in); break;
        default: break; /* PROBE reads nothing; the other replies are text or empty */
        }
    }
}
