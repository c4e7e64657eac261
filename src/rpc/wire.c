/*
 * RPC payload encoding: big-endian u64, strings and byte strings as a u32
 * big-endian length followed by the bytes.  Both sides keep a sticky `failed`
 * flag so a caller can encode or decode a whole message and check once.
 */
#include "rpc.h"

#include <stdlib.h>
#include <string.h>

/* Room for small messages without a second realloc. */
#define WIRE_INITIAL_CAPACITY 256

static int writer_reserve(ferry_wire_writer_t *writer, size_t extra)
{
    if (writer->failed)
        return 0;
    if (extra <= writer->capacity - writer->length)
        return 1;
    if (extra > SIZE_MAX / 2 - writer->length) {
        writer->failed = 1;
        return 0;
    }
    size_t capacity = writer->capacity ? writer->capacity : WIRE_INITIAL_CAPACITY;
    while (capacity - writer->length < extra)
        capacity *= 2;
    uint8_t *data = realloc(writer->data, capacity);
    if (data == NULL) {
        writer->failed = 1;
        return 0;
    }
    writer->data = data;
    writer->capacity = capacity;
    return 1;
}

static void put_be(uint8_t *out, uint64_t value, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        out[i] = (uint8_t)(value >> (8 * (bytes - 1 - i)));
}

static uint64_t get_be(const uint8_t *in, size_t bytes)
{
    uint64_t value = 0;
    for (size_t i = 0; i < bytes; i++)
        value = (value << 8) | in[i];
    return value;
}

void ferry_wire_put_u64(ferry_wire_writer_t *writer, uint64_t value)
{
    if (!writer_reserve(writer, 8))
        return;
    put_be(writer->data + writer->length, value, 8);
    writer->length += 8;
}

void ferry_wire_put_bytes(ferry_wire_writer_t *writer, const void *data, size_t length)
{
    /* The length prefix is 32 bits; a longer field cannot be represented. */
    if (length > UINT32_MAX || (data == NULL && length > 0)) {
        writer->failed = 1;
        return;
    }
    if (!writer_reserve(writer, 4 + length))
        return;
    put_be(writer->data + writer->length, length, 4);
    if (length > 0)
        memcpy(writer->data + writer->length + 4, data, length);
    writer->length += 4 + length;
}

/* NULL encodes as "": optional fields need no separate presence flag. */
void ferry_wire_put_str(ferry_wire_writer_t *writer, const char *text)
{
    if (text == NULL)
        text = "";
    ferry_wire_put_bytes(writer, text, strlen(text));
}

/* Returns a pointer to the next `bytes` bytes and consumes them, or NULL and
 * marks the reader failed when fewer remain. */
static const uint8_t *reader_take(ferry_wire_reader_t *reader, size_t bytes)
{
    if (reader->failed || reader->offset > reader->length ||
        bytes > reader->length - reader->offset) {
        reader->failed = 1;
        return NULL;
    }
    const uint8_t *at = reader->data + reader->offset;
    reader->offset += bytes;
    return at;
}

uint64_t ferry_wire_get_u64(ferry_wire_reader_t *reader)
{
    const uint8_t *at = reader_take(reader, 8);
    return at ? get_be(at, 8) : 0;
}

const void *ferry_wire_get_bytes(ferry_wire_reader_t *reader, size_t *length_p)
{
    const uint8_t *at = reader_take(reader, 4);
    const uint8_t *bytes = NULL;
    size_t length = 0;
    if (at != NULL) {
        length = (size_t)get_be(at, 4);
        bytes = reader_take(reader, length);
        if (bytes == NULL)
            length = 0;
    }
    if (length_p != NULL)
        *length_p = length;
    return bytes;
}

void ferry_wire_get_str(ferry_wire_reader_t *reader, char *out, size_t out_size)
{
    size_t length;
    const char *text = ferry_wire_get_bytes(reader, &length);
    /* An embedded NUL would let "a\0b" pass for "a": refuse it. */
    if (text != NULL && (length >= out_size || memchr(text, '\0', length) != NULL))
        reader->failed = 1;
    if (reader->failed) {
        if (out_size > 0)
            out[0] = '\0';
        return;
    }
    memcpy(out, text, length);
    out[length] = '\0';
}
