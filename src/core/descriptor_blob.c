/*
 * The segment blob: a descriptor as bytes that an application carries
 * itself (its own side channel: a KV-cache router, a launcher, a socket)
 * instead of a metadata store.  It wraps the compact form (descriptor_compact.c,
 * which holds the name, generation, revision, host identity and RPC
 * endpoint) in a binary header that lets a reader say exactly what is wrong
 * with bytes that were cut, mixed up or corrupted on the way:
 *
 *   offset  size  field
 *   0       6     magic "FERRYB"
 *   6       2     blob version, big-endian: 1
 *   8       4     length of the descriptor text that follows, big-endian
 *   12      4     FNV-1a (32 bits) of that text, big-endian
 *   16      n     the descriptor in the compact form ("ferry:desc:1\n...")
 *
 * The blob is exactly 16 + n bytes: nothing may trail it.  A reader of
 * version 1 refuses other versions (a later writer bumps it only for a
 * change a version 1 reader would misread).  The writer is canonical, so a
 * blob that decodes encodes again to the same bytes.
 */
#include "core.h"

#include <arpa/inet.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BLOB_MAGIC "FERRYB"
#define BLOB_MAGIC_LENGTH 6
#define BLOB_VERSION 1

static uint32_t fnv1a32(const uint8_t *bytes, size_t length)
{
    uint32_t hash = 2166136261u;
    for (size_t i = 0; i < length; i++)
        hash = (hash ^ bytes[i]) * 16777619u;
    return hash;
}

static void put_be32(uint8_t *out, uint32_t value)
{
    uint32_t wire = htonl(value);
    memcpy(out, &wire, sizeof(wire));
}

static uint32_t get_be32(const uint8_t *in)
{
    uint32_t wire;
    memcpy(&wire, in, sizeof(wire));
    return ntohl(wire);
}

ferry_status_t ferry_descriptor_blob_wrap(const char *text, size_t length, uint8_t **blob_p,
                                          size_t *length_p)
{
    if (length > FERRY_DESC_MAX_TEXT)
        return FERRY_ERR_NO_RESOURCE;
    uint8_t *blob = malloc(FERRY_DESC_BLOB_HEADER + length);
    if (blob == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(blob, BLOB_MAGIC, BLOB_MAGIC_LENGTH);
    blob[6] = 0;
    blob[7] = BLOB_VERSION;
    put_be32(blob + 8, (uint32_t)length);
    put_be32(blob + 12, fnv1a32((const uint8_t *)text, length));
    memcpy(blob + FERRY_DESC_BLOB_HEADER, text, length);
    *blob_p = blob;
    *length_p = FERRY_DESC_BLOB_HEADER + length;
    return FERRY_OK;
}

ferry_status_t ferry_descriptor_blob_encode(const ferry_descriptor_t *desc, uint8_t **blob_p,
                                            size_t *length_p)
{
    char *text;
    size_t length;
    ferry_status_t status = ferry_descriptor_compact_encode(desc, &text, &length);
    if (status != FERRY_OK)
        return status;
    status = ferry_descriptor_blob_wrap(text, length, blob_p, length_p);
    free(text);
    return status;
}

/* One log line for what is wrong with the wrapping; FERRY_ERR_DECODE. */
__attribute__((format(printf, 1, 2))) static ferry_status_t blob_bad(const char *fmt, ...)
{
    char why[256];
    va_list args;
    va_start(args, fmt);
    vsnprintf(why, sizeof(why), fmt, args);
    va_end(args);
    ferry_error("segment blob: %s", why);
    return FERRY_ERR_DECODE;
}

ferry_status_t ferry_descriptor_blob_decode(const void *data, size_t length,
                                            ferry_descriptor_t **desc_p)
{
    const uint8_t *blob = data;
    if (blob == NULL || desc_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    *desc_p = NULL;
    if (length < FERRY_DESC_BLOB_HEADER)
        return blob_bad("%zu bytes, shorter than its %d-byte header", length,
                        FERRY_DESC_BLOB_HEADER);
    if (memcmp(blob, BLOB_MAGIC, BLOB_MAGIC_LENGTH) != 0)
        return blob_bad("no \"" BLOB_MAGIC "\" magic: not a segment blob");
    unsigned version = (unsigned)blob[6] << 8 | blob[7];
    if (version != BLOB_VERSION)
        return blob_bad("version %u; this library reads version %d", version, BLOB_VERSION);
    size_t text_length = get_be32(blob + 8);
    if (text_length != length - FERRY_DESC_BLOB_HEADER)
        return blob_bad("its header announces %zu bytes of descriptor, it holds %zu "
                        "(cut short, or more bytes after it)", text_length,
                        length - FERRY_DESC_BLOB_HEADER);
    const uint8_t *text = blob + FERRY_DESC_BLOB_HEADER;
    uint32_t sum = fnv1a32(text, text_length), want = get_be32(blob + 12);
    if (sum != want)
        return blob_bad("checksum 0x%08x of its descriptor, the header says 0x%08x "
                        "(corrupted)", sum, want);
    if (ferry_descriptor_text_form((const char *)text, text_length) != FERRY_DESC_FORM_COMPACT)
        return blob_bad("the descriptor inside is not in the compact form");
    /* The compact decoder says what is wrong inside, once. */
    return ferry_descriptor_decode((const char *)text, text_length, desc_p);
}
