/* The tcp target's parsers (tcp_wire.c): what an initiator's HELLO and
 * REQUEST headers may hold, and what closes the connection. */
#include <criterion/criterion.h>

#include "../src/transport/tcp/tcp.h"

#define MAX_SLICE ((size_t)1 << 20)

static void hello_bytes(unsigned char *bytes, uint16_t version, uint16_t rpc_len)
{
    ferry_tcp_encode_hello(bytes, 0x1234, "", 0);
    ferry_tcp_put16(bytes + 4, version);
    ferry_tcp_put16(bytes + 16, rpc_len);
}

Test(tcp_wire, hello_fields_and_bounds)
{
    unsigned char bytes[FERRY_TCP_HELLO_SIZE];
    ferry_tcp_hello_t hello;
    hello_bytes(bytes, FERRY_TCP_VERSION, FERRY_TCP_HELLO_RPC_MAX);
    cr_assert_eq(ferry_tcp_hello_parse(bytes, &hello), FERRY_OK);
    cr_assert_eq(hello.expected_generation, 0x1234);
    cr_assert_eq(hello.rpc_len, FERRY_TCP_HELLO_RPC_MAX);

    hello_bytes(bytes, FERRY_TCP_VERSION, FERRY_TCP_HELLO_RPC_MAX + 1);
    cr_assert_eq(ferry_tcp_hello_parse(bytes, &hello), FERRY_ERR_PROTOCOL);
    /* another version is answered (UNSUPPORTED), not just closed */
    hello_bytes(bytes, FERRY_TCP_VERSION + 1, 0);
    cr_assert_eq(ferry_tcp_hello_parse(bytes, &hello), FERRY_ERR_UNSUPPORTED);
    hello_bytes(bytes, FERRY_TCP_VERSION, 0);
    bytes[0] ^= 1;
    cr_assert_eq(ferry_tcp_hello_parse(bytes, &hello), FERRY_ERR_PROTOCOL);
}

Test(tcp_wire, hello_rpc_endpoint_is_one_c_string)
{
    char rpc[FERRY_TCP_HELLO_RPC_MAX + 1] = "host:1x";
    cr_assert_eq(ferry_tcp_hello_rpc_parse(rpc, 6), FERRY_OK);
    cr_assert_str_eq(rpc, "host:1");
    memcpy(rpc, "a\0b", 3);
    cr_assert_eq(ferry_tcp_hello_rpc_parse(rpc, 3), FERRY_ERR_PROTOCOL);
}

Test(tcp_wire, request_ops_and_lengths)
{
    unsigned char bytes[FERRY_TCP_REQUEST_SIZE];
    ferry_tcp_request_t request;
    ferry_tcp_encode_request(bytes, FERRY_TCP_OP_WRITE, 7, 0x1000, MAX_SLICE);
    cr_assert_eq(ferry_tcp_request_parse(bytes, MAX_SLICE, &request), FERRY_OK);
    cr_assert(request.op == FERRY_TCP_OP_WRITE && request.id == 7 && request.addr == 0x1000 &&
              request.length == MAX_SLICE);
    ferry_tcp_encode_request(bytes, FERRY_TCP_OP_READ, 8, UINT64_MAX, 1);
    cr_assert_eq(ferry_tcp_request_parse(bytes, MAX_SLICE, &request), FERRY_OK,
                 "a range that wraps is the engine's to refuse, with a status");

    ferry_tcp_encode_request(bytes, FERRY_TCP_OP_READ, 9, 0x1000, MAX_SLICE + 1);
    cr_assert_eq(ferry_tcp_request_parse(bytes, MAX_SLICE, &request), FERRY_ERR_PROTOCOL);
    ferry_tcp_encode_request(bytes, FERRY_TCP_OP_WRITE, 10, 0x1000, 0);
    cr_assert_eq(ferry_tcp_request_parse(bytes, MAX_SLICE, &request), FERRY_ERR_PROTOCOL);
    ferry_tcp_encode_request(bytes, 3, 11, 0x1000, 8);
    cr_assert_eq(ferry_tcp_request_parse(bytes, MAX_SLICE, &request), FERRY_ERR_PROTOCOL);
}
