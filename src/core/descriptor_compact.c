/*
 * The compact text form of a segment descriptor: the same value as the
 * JSON form (descriptor.c), written and read an order of magnitude faster,
 * for every store that does not need JSON (doc/metadata.md, "Descriptor
 * forms").  It stays text, because the metadata API carries C strings and
 * etcd, redis and PMIx values are easiest kept printable: one line per
 * item, hex numbers, strings prefixed by their length so that no byte needs
 * escaping and the parser never searches for a delimiter.
 *
 *   ferry:desc:1                         magic and form version
 *   name <str>                           non-empty
 *   generation <hex>
 *   revision <hex>                       publishes that changed something
 *   host <str>
 *   rpc <str>
 *   transports <hex n>                   then n lines, in desc->transports order:
 *   <str name> <str endpoint>            name non-empty, names distinct
 *   buffers <hex n>                      then n lines, ascending by addr:
 *   <hex addr> <hex length> <r|w|rw> <str location> <key>...
 *                                        one <key> per transport, in order:
 *                                        <str>, or "-" when it has none
 *
 * <hex> is 1 to 16 lowercase hex digits without leading zeros ("0" for
 * zero); <str> is <hex length>:<bytes>, the bytes UTF-8 without NUL (what a
 * JSON string holds, so either form can carry whatever the other does).
 * Every line ends in "\n"; the text ends after the last buffer line.  The
 * writer is canonical: a descriptor has exactly one text.
 *
 * The reader trusts nothing and applies the JSON reader's limits (64 MiB,
 * 1,000,000 buffers, 64 transports, 64 KiB per string); counts are checked
 * against the bytes left before anything is allocated for them; overlaps,
 * empty buffers and ends past 2^64 - 1 are refused by
 * ferry_descriptor_finish().  Strings of consecutive buffers that are equal
 * (a location, the tcp key "") are stored once.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

/* The shortest buffer line: "0 1 r 0:" and a newline, before any key. */
#define BUFFER_LINE_MIN 9
/* The shortest transport line: "1:x 0:" and a newline. */
#define TRANSPORT_LINE_MIN 7

/* ---------------- encode ---------------- */

static size_t hex_width(uint64_t value)
{
    size_t width = 1;
    while (value >>= 4)
        width++;
    return width;
}

static char *put_hex(char *out, uint64_t value)
{
    static const char digits[] = "0123456789abcdef";
    size_t width = hex_width(value);
    for (size_t i = width; i-- > 0; value >>= 4)
        out[i] = digits[value & 0xf];
    return out + width;
}

static size_t str_size(const char *text)
{
    size_t length = strlen(text);
    return hex_width(length) + 1 + length;
}

static char *put_str(char *out, const char *text)
{
    size_t length = strlen(text);
    out = put_hex(out, length);
    *out++ = ':';
    memcpy(out, text, length);
    return out + length;
}

char *ferry_desc_compact_put_word(char *out, const char *word)
{
    size_t length = strlen(word);
    memcpy(out, word, length);
    return out + length;
}

static const char *or_empty(const char *text)
{
    return text ? text : "";
}

/* One buffer's line (without the newline); out NULL: only its size. */
static size_t buffer_line(const ferry_descriptor_t *desc, const ferry_desc_buffer_t *buffer,
                          char *out)
{
    const char *location = buffer->location ? buffer->location : "cpu";
    if (out == NULL) {
        size_t size = hex_width(buffer->addr) + 1 + hex_width(buffer->length) + 1 +
                      strlen(ferry_desc_access_text(buffer->access)) + 1 + str_size(location);
        for (size_t t = 0; t < desc->n_transports; t++) {
            const char *key = buffer->keys ? buffer->keys[t] : NULL;
            size += 1 + (key ? str_size(key) : 1);
        }
        return size;
    }
    char *start = out;
    out = put_hex(out, buffer->addr);
    *out++ = ' ';
    out = put_hex(out, buffer->length);
    *out++ = ' ';
    out = ferry_desc_compact_put_word(out, ferry_desc_access_text(buffer->access));
    *out++ = ' ';
    out = put_str(out, location);
    for (size_t t = 0; t < desc->n_transports; t++) {
        const char *key = buffer->keys ? buffer->keys[t] : NULL;
        *out++ = ' ';
        out = key ? put_str(out, key) : ferry_desc_compact_put_word(out, "-");
    }
    return (size_t)(out - start);
}

size_t ferry_desc_compact_buffer_size(const ferry_descriptor_t *desc,
                                      const ferry_desc_buffer_t *buffer)
{
    return buffer_line(desc, buffer, NULL);
}

char *ferry_desc_compact_put_buffer(const ferry_descriptor_t *desc,
                                    const ferry_desc_buffer_t *buffer, char *out)
{
    return out + buffer_line(desc, buffer, out);
}

char *ferry_desc_compact_put_hex(char *out, uint64_t value)
{
    return put_hex(out, value);
}

/* Whether every string the text will hold can be read back; logs. */
static int encodable(const ferry_descriptor_t *desc)
{
    const char *bad = NULL;
    if (desc->name == NULL || desc->name[0] == '\0') {
        ferry_error("segment descriptor: cannot encode: empty name");
        return 0;
    }
    if (!ferry_desc_text_valid(desc->name, strlen(desc->name)) ||
        !ferry_desc_text_valid(or_empty(desc->host_id), strlen(or_empty(desc->host_id))) ||
        !ferry_desc_text_valid(or_empty(desc->rpc), strlen(or_empty(desc->rpc))))
        bad = "name, host or rpc";
    for (size_t t = 0; !bad && t < desc->n_transports; t++) {
        const ferry_desc_transport_t *transport = &desc->transports[t];
        if (transport->name == NULL || transport->name[0] == '\0' ||
            !ferry_desc_text_valid(transport->name, strlen(transport->name)) ||
            !ferry_desc_text_valid(or_empty(transport->endpoint),
                                   strlen(or_empty(transport->endpoint))))
            bad = "transport";
        for (size_t u = 0; !bad && u < t; u++)
            if (strcmp(desc->transports[u].name, transport->name) == 0)
                bad = "transport (duplicate name)";
    }
    /* Buffers' strings come from registrations the engine checked, or from
     * a decoder that checked them: not walked again here (it would cost
     * what the encoding does). */
    if (bad != NULL)
        ferry_error("segment descriptor: cannot encode %s: missing or not UTF-8 text", bad);
    return bad == NULL;
}

ferry_status_t ferry_descriptor_compact_encode(const ferry_descriptor_t *desc, char **text_p,
                                               size_t *length_p)
{
    if (desc == NULL || text_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    *text_p = NULL;
    if (!encodable(desc))
        return FERRY_ERR_INVALID_PARAM;

    size_t n_buffers = 0;
    size_t size = strlen(FERRY_DESC_COMPACT_MAGIC) + 5 + str_size(desc->name) + 1 + 11 + 16 +
                  1 + 9 + 16 + 1 + 5 + str_size(or_empty(desc->host_id)) + 1 + 4 +
                  str_size(or_empty(desc->rpc)) + 1 + 11 + 16 + 1 + 8 + 16 + 1;
    for (size_t t = 0; t < desc->n_transports; t++)
        size += str_size(desc->transports[t].name) + 1 +
                str_size(or_empty(desc->transports[t].endpoint)) + 1;
    for (size_t i = 0; i < desc->n_buffers; i++) {
        /* a buffer peers may not touch is none of their business */
        if (ferry_desc_access_text(desc->buffers[i].access) == NULL)
            continue;
        size += buffer_line(desc, &desc->buffers[i], NULL) + 1;
        n_buffers++;
    }
    char *text = malloc(size + 1);
    if (text == NULL) {
        ferry_error("segment descriptor: cannot encode: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    char *out = ferry_desc_compact_put_word(text, FERRY_DESC_COMPACT_MAGIC);
    out = put_str(ferry_desc_compact_put_word(out, "name "), desc->name);
    out = put_hex(ferry_desc_compact_put_word(out, "\ngeneration "), desc->generation);
    out = put_hex(ferry_desc_compact_put_word(out, "\nrevision "), desc->revision);
    out = put_str(ferry_desc_compact_put_word(out, "\nhost "), or_empty(desc->host_id));
    out = put_str(ferry_desc_compact_put_word(out, "\nrpc "), or_empty(desc->rpc));
    out = put_hex(ferry_desc_compact_put_word(out, "\ntransports "), desc->n_transports);
    *out++ = '\n';
    for (size_t t = 0; t < desc->n_transports; t++) {
        out = put_str(out, desc->transports[t].name);
        *out++ = ' ';
        out = put_str(out, or_empty(desc->transports[t].endpoint));
        *out++ = '\n';
    }
    out = put_hex(ferry_desc_compact_put_word(out, "buffers "), n_buffers);
    *out++ = '\n';
    for (size_t i = 0; i < desc->n_buffers; i++) {
        if (ferry_desc_access_text(desc->buffers[i].access) == NULL)
            continue;
        out += buffer_line(desc, &desc->buffers[i], out);
        *out++ = '\n';
    }
    *out = '\0';
    *text_p = text;
    if (length_p != NULL)
        *length_p = (size_t)(out - text);
    return FERRY_OK;
}

/* ---------------- decode ---------------- */

/* The reader is ferry_desc_cursor_t (core.h) so that descriptor_changes.c
 * reads buffer lines the same way. */

static ferry_status_t bad(const ferry_desc_cursor_t *in, const char *what, const char *problem)
{
    return ferry_desc_decode_bad("", "compact", "line %zu: %s: %s", in->line, what, problem);
}

ferry_status_t ferry_desc_cursor_literal(ferry_desc_cursor_t *in, const char *word,
                                         const char *what)
{
    size_t length = strlen(word);
    if ((size_t)(in->end - in->p) < length || memcmp(in->p, word, length) != 0)
        return bad(in, what, "missing or out of place");
    in->p += length;
    for (size_t i = 0; i < length; i++)
        in->line += word[i] == '\n';
    return FERRY_OK;
}

ferry_status_t ferry_desc_cursor_hex(ferry_desc_cursor_t *in, const char *what,
                                     uint64_t *value_p)
{
    uint64_t value = 0;
    size_t digits = 0;
    for (; in->p < in->end; in->p++, digits++) {
        char c = *in->p;
        unsigned digit;
        if (c >= '0' && c <= '9')
            digit = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            digit = (unsigned)(c - 'a' + 10);
        else
            break;
        if (digits == 16)
            return bad(in, what, "more than 16 hex digits");
        if (digits == 1 && value == 0)
            return bad(in, what, "leading zero");
        value = value << 4 | digit;
    }
    if (digits == 0)
        return bad(in, what, "must be lowercase hex digits");
    *value_p = value;
    return FERRY_OK;
}

ferry_status_t ferry_desc_cursor_char(ferry_desc_cursor_t *in, char c, const char *what)
{
    if (in->p == in->end || *in->p != c)
        return bad(in, what, c == '\n' ? "line does not end here" : "separator missing");
    in->p++;
    if (c == '\n')
        in->line++;
    return FERRY_OK;
}

ferry_status_t ferry_desc_cursor_str(ferry_desc_cursor_t *in, const char *what,
                                     const char **text_p, size_t *length_p)
{
    uint64_t length;
    ferry_status_t status = ferry_desc_cursor_hex(in, what, &length);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, ':', what);
    if (status != FERRY_OK)
        return status;
    if (length > FERRY_DESC_MAX_STRING)
        return bad(in, what, "longer than 64 KiB");
    if (length > (uint64_t)(in->end - in->p))
        return bad(in, what, "runs past the end of the text");
    if (!ferry_desc_text_valid(in->p, (size_t)length))
        return bad(in, what, "not UTF-8 text (or holds NUL)");
    *text_p = in->p;
    *length_p = (size_t)length;
    in->p += length;
    return FERRY_OK;
}

/* A string malloc-ed (the few per descriptor that are not pooled). */
static ferry_status_t read_copy(ferry_desc_cursor_t *in, const char *what, char **copy_p)
{
    const char *text;
    size_t length;
    ferry_status_t status = ferry_desc_cursor_str(in, what, &text, &length);
    if (status != FERRY_OK)
        return status;
    if ((*copy_p = strndup(text, length)) == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    return FERRY_OK;
}

/* A count line "<word> <hex>\n", checked against the bytes left. */
static ferry_status_t read_count(ferry_desc_cursor_t *in, const char *word, size_t max,
                                 size_t line_min, size_t *count_p)
{
    uint64_t count;
    ferry_status_t status = ferry_desc_cursor_literal(in, word, word);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(in, word, &count);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, '\n', word);
    if (status != FERRY_OK)
        return status;
    if (count > max)
        return bad(in, word, "too many");
    if (count > (uint64_t)(in->end - in->p) / line_min)
        return bad(in, word, "more than the text holds");
    *count_p = (size_t)count;
    return FERRY_OK;
}

static ferry_status_t read_transports(ferry_desc_cursor_t *in, ferry_descriptor_t *desc)
{
    size_t count;
    ferry_status_t status = read_count(in, "transports ", FERRY_DESC_MAX_TRANSPORTS,
                                       TRANSPORT_LINE_MIN, &count);
    if (status != FERRY_OK)
        return status;
    desc->transports = calloc(count ? count : 1, sizeof(*desc->transports));
    if (desc->transports == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    for (size_t t = 0; t < count; t++) {
        ferry_desc_transport_t *transport = &desc->transports[t];
        desc->n_transports = t + 1; /* what unref frees */
        status = read_copy(in, "transport name", &transport->name);
        if (status == FERRY_OK)
            status = ferry_desc_cursor_char(in, ' ', "transport");
        if (status == FERRY_OK)
            status = read_copy(in, "transport endpoint", &transport->endpoint);
        if (status == FERRY_OK)
            status = ferry_desc_cursor_char(in, '\n', "transport");
        if (status != FERRY_OK)
            return status;
        if (transport->name[0] == '\0')
            return bad(in, "transport name", "empty");
        for (size_t u = 0; u < t; u++)
            if (strcmp(desc->transports[u].name, transport->name) == 0)
                return bad(in, "transport name", "named twice");
    }
    desc->n_transports = count;
    return FERRY_OK;
}

/* A pooled copy, or the previous buffer's when the bytes are equal. */
static const char *pooled(ferry_desc_pool_t *pool, const char *text, size_t length,
                          const char *previous)
{
    if (previous != NULL && strncmp(previous, text, length) == 0 && previous[length] == '\0')
        return previous;
    return ferry_desc_pool_strndup(pool, text, length);
}

ferry_status_t ferry_desc_cursor_buffer(ferry_desc_cursor_t *in, size_t n_transports,
                                        ferry_desc_pool_t *pool,
                                        const ferry_desc_buffer_t *previous,
                                        ferry_desc_buffer_t *buffer)
{
    ferry_status_t status = ferry_desc_cursor_hex(in, "buffer addr", &buffer->addr);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, ' ', "buffer");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(in, "buffer length", &buffer->length);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, ' ', "buffer");
    if (status != FERRY_OK)
        return status;
    if (buffer->length == 0)
        return bad(in, "buffer length", "must not be 0");
    if (buffer->length > UINT64_MAX - buffer->addr)
        return bad(in, "buffer length", "addr + length does not fit in 64 bits");

    const char *p = in->p;
    size_t left = (size_t)(in->end - p);
    if (left >= 3 && p[0] == 'r' && p[1] == 'w' && p[2] == ' ')
        buffer->access = FERRY_REG_REMOTE, in->p += 3;
    else if (left >= 2 && p[0] == 'r' && p[1] == ' ')
        buffer->access = FERRY_REG_REMOTE_READ, in->p += 2;
    else if (left >= 2 && p[0] == 'w' && p[1] == ' ')
        buffer->access = FERRY_REG_REMOTE_WRITE, in->p += 2;
    else
        return bad(in, "buffer access", "must be r, w or rw");

    const char *text;
    size_t length;
    if ((status = ferry_desc_cursor_str(in, "buffer location", &text, &length)) != FERRY_OK)
        return status;
    buffer->location = (char *)pooled(pool, text, length, previous ? previous->location : NULL);
    buffer->keys = ferry_desc_pool_alloc(pool, n_transports * sizeof(char *));
    if (buffer->location == NULL || buffer->keys == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    for (size_t t = 0; t < n_transports; t++) {
        if ((status = ferry_desc_cursor_char(in, ' ', "buffer key")) != FERRY_OK)
            return status;
        if (in->p < in->end && *in->p == '-') {
            in->p++;
            buffer->keys[t] = NULL;
            continue;
        }
        if ((status = ferry_desc_cursor_str(in, "buffer key", &text, &length)) != FERRY_OK)
            return status;
        buffer->keys[t] = (char *)pooled(pool, text, length, previous ? previous->keys[t] : NULL);
        if (buffer->keys[t] == NULL) {
            ferry_error("segment descriptor: out of memory");
            return FERRY_ERR_NO_MEMORY;
        }
    }
    return ferry_desc_cursor_char(in, '\n', "buffer");
}

static ferry_status_t read_buffers(ferry_desc_cursor_t *in, ferry_descriptor_t *desc)
{
    size_t count;
    ferry_status_t status = read_count(in, "buffers ", FERRY_DESC_MAX_BUFFERS,
                                       BUFFER_LINE_MIN + 2 * desc->n_transports, &count);
    if (status != FERRY_OK)
        return status;
    desc->buffers = calloc(count ? count : 1, sizeof(*desc->buffers));
    desc->pool = ferry_desc_pool_new(NULL);
    if (desc->buffers == NULL || desc->pool == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    /* The strings take less than the text they come from. */
    ferry_desc_pool_reserve(desc->pool, (size_t)(in->end - in->p) +
                                            count * desc->n_transports * sizeof(char *));
    desc->n_buffers = count; /* the pool holds the strings: unref frees a partial decode */
    for (size_t i = 0; i < count; i++) {
        status = ferry_desc_cursor_buffer(in, desc->n_transports, desc->pool,
                                          i ? &desc->buffers[i - 1] : NULL, &desc->buffers[i]);
        if (status != FERRY_OK)
            return status;
        /* one text per descriptor: the writer's order is the only one */
        if (i > 0 && desc->buffers[i].addr <= desc->buffers[i - 1].addr)
            return ferry_desc_decode_bad("", "compact", "line %zu: buffer addr: not above the "
                                         "one before (0x%llx)", in->line - 1,
                                         (unsigned long long)desc->buffers[i - 1].addr);
    }
    return FERRY_OK;
}

ferry_status_t ferry_descriptor_compact_decode(const char *text, size_t length,
                                               ferry_descriptor_t *desc)
{
    ferry_desc_cursor_t in = {.p = text, .end = text + length, .line = 1};
    ferry_status_t status = ferry_desc_cursor_literal(&in, FERRY_DESC_COMPACT_MAGIC, "magic");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_literal(&in, "name ", "name");
    if (status == FERRY_OK)
        status = read_copy(&in, "name", &desc->name);
    if (status == FERRY_OK && desc->name[0] == '\0')
        return bad(&in, "name", "must not be empty");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_literal(&in, "\ngeneration ", "generation");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(&in, "generation", &desc->generation);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_literal(&in, "\nrevision ", "revision");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(&in, "revision", &desc->revision);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_literal(&in, "\nhost ", "host");
    if (status == FERRY_OK)
        status = read_copy(&in, "host", &desc->host_id);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_literal(&in, "\nrpc ", "rpc");
    if (status == FERRY_OK)
        status = read_copy(&in, "rpc", &desc->rpc);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(&in, '\n', "rpc");
    if (status == FERRY_OK)
        status = read_transports(&in, desc);
    if (status == FERRY_OK)
        status = read_buffers(&in, desc);
    if (status == FERRY_OK && in.p != in.end)
        return bad(&in, "text", "continues after the last buffer");
    return status;
}
