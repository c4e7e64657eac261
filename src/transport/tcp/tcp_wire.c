/*
 * What a tcp target reads from an initiator, parsed: the HELLO and each
 * REQUEST header (formats in tcp.h).  No socket here, so the fuzz harness
 * (test/fuzz/fuzz_tcp.c) feeds these exactly what a hostile initiator could
 * send.  Each violation is logged here, once; the caller closes the
 * connection.
 */
#include "tcp.h"

ferry_status_t ferry_tcp_hello_parse(const unsigned char *bytes, ferry_tcp_hello_t *hello)
{
    if (ferry_tcp_get32(bytes) != FERRY_TCP_MAGIC) {
        ferry_warn("tcp: a connection did not start with a ferry HELLO; closing it");
        return FERRY_ERR_PROTOCOL;
    }
    hello->version = ferry_tcp_get16(bytes + 4);
    if (hello->version != FERRY_TCP_VERSION) {
        ferry_warn("tcp: a peer speaks wire version %u, this engine %d; closing", hello->version,
                   FERRY_TCP_VERSION);
        return FERRY_ERR_UNSUPPORTED;
    }
    hello->expected_generation = ferry_tcp_get64(bytes + 8);
    hello->rpc_len = ferry_tcp_get16(bytes + 16);
    if (hello->rpc_len > FERRY_TCP_HELLO_RPC_MAX) {
        ferry_warn("tcp: HELLO with a %u-byte RPC endpoint (max %d); closing", hello->rpc_len,
                   FERRY_TCP_HELLO_RPC_MAX);
        return FERRY_ERR_PROTOCOL;
    }
    return FERRY_OK;
}

ferry_status_t ferry_tcp_hello_rpc_parse(char *rpc, size_t rpc_len)
{
    /* A NUL inside would let "a\0b" pass for "a" as the peer's name. */
    if (rpc_len > FERRY_TCP_HELLO_RPC_MAX || memchr(rpc, '\0', rpc_len) != NULL) {
        ferry_warn("tcp: HELLO with a malformed RPC endpoint; closing");
        return FERRY_ERR_PROTOCOL;
    }
    rpc[rpc_len] = '\0';
    return FERRY_OK;
}

ferry_status_t ferry_tcp_request_parse(const unsigned char *bytes, size_t max_slice,
                                       ferry_tcp_request_t *request)
{
    request->op = bytes[0];
    request->id = ferry_tcp_get64(bytes + 8);
    request->addr = ferry_tcp_get64(bytes + 16);
    request->length = ferry_tcp_get64(bytes + 24);
    if ((request->op != FERRY_TCP_OP_WRITE && request->op != FERRY_TCP_OP_READ) ||
        request->length == 0 || request->length > max_slice) {
        ferry_warn("tcp: protocol error from a peer (op %u, length %llu, max %zu); closing",
                   request->op, (unsigned long long)request->length, max_slice);
        return FERRY_ERR_PROTOCOL;
    }
    return FERRY_OK;
}
