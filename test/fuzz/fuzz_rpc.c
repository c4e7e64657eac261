/*
 * The RPC frame parser: what one connection to an engine's RPC listener can
 * send.  The input is the byte stream; frames are read as rpc_server.c
 * reads them (16-byte header through ferry_rpc_header_unpack, then the
 * payload), and each payload goes through the wire reader the way
 * src/core/engine_rpc.c's handlers read it (FETCH, NOTIFY, INVALIDATE; PROBE
 * has no payload), and the way a client reads a PROBE reply.  Keep the
 * reads below in step with engine_rpc.c: same fields, same buffer sizes.
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

/* One string read: terminated inside its buffer, and "" when the read failed. */
static void get_str(ferry_wire_reader_t *in, char *text, size_t size)
{
    ferry_wire_get_str(in, text, size);
    FUZZ_CHECK(strnlen(text, size) < size);
    if (in->failed)
        FUZZ_CHECK(text[0] == '\0');
}

/* What was read must be what a writer makes of the same fields. */
static void check_encoding(const ferry_wire_reader_t *in, ferry_wire_writer_t *out)
{
    FUZZ_CHECK(!out->failed);
    FUZZ_CHECK(out->length == in->offset);
    FUZZ_CHECK(out->length == 0 || memcmp(out->data, in->data, out->length) == 0);
    free(out->data);
}

static void read_fetch(ferry_wire_reader_t *in)
{
    char name[1024], from[300];
    get_str(in, name, sizeof(name));
    get_str(in, from, sizeof(from));
    check_reader(in);
    if (in->failed)
        return;
    ferry_wire_writer_t out = {0};
    ferry_wire_put_str(&out, name);
    ferry_wire_put_str(&out, from);
    check_encoding(in, &out);
}

static void read_notify(ferry_wire_reader_t *in)
{
    char from[256];
    size_t length;
    get_str(in, from, sizeof(from));
    const void *msg = ferry_wire_get_bytes(in, &length);
    check_reader(in);
    if (in->failed) {
        FUZZ_CHECK(msg == NULL && length == 0);
        return;
    }
    FUZZ_CHECK(msg != NULL);
    FUZZ_CHECK((const uint8_t *)msg + length <= in->data + in->length);
    ferry_wire_writer_t out = {0};
    ferry_wire_put_str(&out, from);
    ferry_wire_put_bytes(&out, msg, length);
    check_encoding(in, &out);
}

static void read_invalidate(ferry_wire_reader_t *in)
{
    char name[1024];
    get_str(in, name, sizeof(name));
    uint64_t generation = ferry_wire_get_u64(in);
    check_reader(in);
    if (in->failed) {
        FUZZ_CHECK(generation == 0);
        return;
    }
    ferry_wire_writer_t out = {0};
    ferry_wire_put_str(&out, name);
    ferry_wire_put_u64(&out, generation);
    check_encoding(in, &out);
}

static void read_probe_reply(ferry_wire_reader_t *in)
{
    char name[1024];
    uint64_t generation = ferry_wire_get_u64(in);
    get_str(in, name, sizeof(name));
    check_reader(in);
    if (in->failed)
        return;
    ferry_wire_writer_t out = {0};
    ferry_wire_put_u64(&out, generation);
    ferry_wire_put_str(&out, name);
    check_encoding(in, &out);
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
