/*
 * The tcp target's request parser: what one connection to a tcp listener can
 * send.  The input is the byte stream, read as tcp_target.c reads it: the
 * HELLO (ferry_tcp_hello_parse, then its rpc bytes), then request headers
 * (ferry_tcp_request_parse), each WRITE followed by its payload.
 *
 * Checked: what parses encodes back to the same bytes (the fields the
 * target ignores aside), the rpc endpoint is one C string of the announced
 * length, and every request the parser passes has a known op and a length
 * in 1..max_slice.
 */
#include "fuzz_common.h"

#include "../../src/transport/tcp/tcp.h"

/* FERRY_TCP_MAX_SLICE's default */
#define FUZZ_MAX_SLICE ((size_t)64 << 20)

static int read_hello(const uint8_t **data_p, size_t *size_p)
{
    const uint8_t *bytes = fuzz_take(data_p, size_p, FERRY_TCP_HELLO_SIZE);
    if (bytes == NULL)
        return 0;
    ferry_tcp_hello_t hello;
    ferry_status_t status = ferry_tcp_hello_parse(bytes, &hello);
    FUZZ_CHECK(status == FERRY_OK || status == FERRY_ERR_PROTOCOL ||
               status == FERRY_ERR_UNSUPPORTED);
    if (status != FERRY_OK)
        return 0;
    FUZZ_CHECK(hello.rpc_len <= FERRY_TCP_HELLO_RPC_MAX);

    const uint8_t *rpc_bytes = fuzz_take(data_p, size_p, hello.rpc_len);
    if (rpc_bytes == NULL)
        return 0;
    char rpc[FERRY_TCP_HELLO_RPC_MAX + 1];
    memcpy(rpc, rpc_bytes, hello.rpc_len);
    if (ferry_tcp_hello_rpc_parse(rpc, hello.rpc_len) != FERRY_OK)
        return 0;
    FUZZ_CHECK(strlen(rpc) == hello.rpc_len);

    /* the initiator's encoder writes what the target read; flags (bytes 6-7)
     * are not read */
    unsigned char again[FERRY_TCP_HELLO_SIZE + FERRY_TCP_HELLO_RPC_MAX];
    size_t length = ferry_tcp_encode_hello(again, hello.expected_generation, rpc, hello.rpc_len);
    FUZZ_CHECK(length == FERRY_TCP_HELLO_SIZE + hello.rpc_len);
    FUZZ_CHECK(memcmp(again, bytes, 6) == 0);
    FUZZ_CHECK(memcmp(again + 8, bytes + 8, FERRY_TCP_HELLO_SIZE - 8) == 0);
    FUZZ_CHECK(memcmp(again + FERRY_TCP_HELLO_SIZE, rpc_bytes, hello.rpc_len) == 0);
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!read_hello(&data, &size))
        return 0;
    for (;;) {
        const uint8_t *bytes = fuzz_take(&data, &size, FERRY_TCP_REQUEST_SIZE);
        if (bytes == NULL)
            return 0;
        ferry_tcp_request_t request;
        if (ferry_tcp_request_parse(bytes, FUZZ_MAX_SLICE, &request) != FERRY_OK)
            return 0; /* the target closes the connection */
        FUZZ_CHECK(request.op == FERRY_TCP_OP_WRITE || request.op == FERRY_TCP_OP_READ);
        FUZZ_CHECK(request.length > 0 && request.length <= FUZZ_MAX_SLICE);
        /* pad and reserved (bytes 1-7) are not read */
        unsigned char again[FERRY_TCP_REQUEST_SIZE];
        ferry_tcp_encode_request(again, request.op, request.id, request.addr, request.length);
        FUZZ_CHECK(again[0] == bytes[0]);
        FUZZ_CHECK(memcmp(again + 8, bytes + 8, FERRY_TCP_REQUEST_SIZE - 8) == 0);
        if (request.op == FERRY_TCP_OP_WRITE) {
            /* the payload, stored or drained: the stream stays in step */
            size_t payload = request.length < size ? (size_t)request.length : size;
            fuzz_take(&data, &size, payload);
        }
    }
}
