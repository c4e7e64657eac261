/* RPC frame header: 16 bytes, big-endian (layout in rpc.h). */
#include "rpc.h"

static void put_u16(uint8_t *out, uint16_t value)
{
    out[0] = (uint8_t)(value >> 8);
    out[1] = (uint8_t)value;
}

static void put_u32(uint8_t *out, uint32_t value)
{
    out[0] = (uint8_t)(value >> 24);
    out[1] = (uint8_t)(value >> 16);
    out[2] = (uint8_t)(value >> 8);
    out[3] = (uint8_t)value;
}

static uint16_t get_u16(const uint8_t *in)
{
    return (uint16_t)((in[0] << 8) | in[1]);
}

static uint32_t get_u32(const uint8_t *in)
{
    return ((uint32_t)in[0] << 24) | ((uint32_t)in[1] << 16) | ((uint32_t)in[2] << 8) |
           (uint32_t)in[3];
}

void ferry_rpc_header_pack(const ferry_rpc_header_t *header, uint8_t out[FERRY_RPC_HEADER_SIZE])
{
    put_u32(out, header->magic);
    out[4] = header->version;
    out[5] = header->type;
    put_u16(out + 6, header->reserved);
    put_u32(out + 8, (uint32_t)header->status);
    put_u32(out + 12, header->length);
}

/* No logging here: the caller knows the peer and says who sent the frame. */
ferry_status_t ferry_rpc_header_unpack(const uint8_t in[FERRY_RPC_HEADER_SIZE],
                                       size_t max_frame, ferry_rpc_header_t *header)
{
    header->magic = get_u32(in);
    header->version = in[4];
    header->type = in[5];
    header->reserved = get_u16(in + 6);
    header->status = (int32_t)get_u32(in + 8);
    header->length = get_u32(in + 12);
    if (header->magic != FERRY_RPC_MAGIC || header->version != FERRY_RPC_VERSION ||
        header->reserved != 0)
        return FERRY_ERR_PROTOCOL;
    if (header->type < FERRY_RPC_FETCH || header->type > FERRY_RPC_ERROR_REPLY)
        return FERRY_ERR_PROTOCOL;
    if (header->length > max_frame)
        return FERRY_ERR_PROTOCOL;
    return FERRY_OK;
}
