/*
 * The storage key: the text a storage buffer's descriptor entry carries for
 * the transports that reach storage (FERRY_TRANSPORT_STORAGE, the file
 * transport).  It says where the storage lives, which part of it the buffer
 * is and how a peer recognises the same storage on its own host:
 *
 *   v1 addr=<hex> len=<hex> off=<hex> align=<hex> opt=<hex> kind=<file|block>
 *      host=<esc> dev=<hex> ino=<hex> wwid=<esc|-> path=<esc>
 *
 * on one line, single spaces, fields in that order.  addr and len repeat the
 * buffer's (the transport gets the key, not the buffer); off is the range's
 * offset in the file; align the direct-I/O alignment (a power of two, at
 * most 1 MiB); opt the FERRY_STORAGE_* options; host the owner's host
 * identity; dev and ino the file's st_dev and st_ino (a block device: its
 * st_rdev, ino 0); wwid a block device's WWID from sysfs ("-": none), by
 * which a peer on another host finds the namespace attached there; path the
 * owner's path.  <hex> as in the compact descriptor (lowercase, no leading
 * zero); <esc> keeps [A-Za-z0-9._/+:@,~-] and writes every other byte as
 * %XX (uppercase), so a value never holds a space.
 *
 * The reader is strict: it parses, writes the key again and compares, so a
 * key has one text and anything else (a second space, a leading zero, an
 * unknown option bit) is refused.  The descriptor decoders run it on every
 * storage key (ferry_storage_key_check), so a hostile descriptor is refused
 * when it is read, not when a transport opens a path from it.
 */
#include "core.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#define KNOWN_OPTIONS                                                                      \
    (FERRY_STORAGE_BUFFERED | FERRY_STORAGE_DIRECT | FERRY_STORAGE_DURABLE |               \
     FERRY_STORAGE_SHARED)

static int kept(unsigned char c)
{
    return isalnum(c) || strchr("._/+:@,~-", c) != NULL;
}

/* Escaped value into out (size n); returns the length it needs. */
static size_t put_esc(char *out, size_t n, const char *value)
{
    static const char digits[] = "0123456789ABCDEF";
    size_t at = 0;
    for (const unsigned char *p = (const unsigned char *)value; *p; p++) {
        if (kept(*p)) {
            if (at + 1 < n)
                out[at] = (char)*p;
            at++;
            continue;
        }
        if (at + 3 < n) {
            out[at] = '%';
            out[at + 1] = digits[*p >> 4];
            out[at + 2] = digits[*p & 15];
        }
        at += 3;
    }
    if (n > 0)
        out[at < n ? at : n - 1] = '\0';
    return at;
}

#define KEY_FORMAT                                                                         \
    "v1 addr=%llx len=%llx off=%llx align=%x opt=%x kind=%s host=%s dev=%llx ino=%llx "     \
    "wwid=%s path=%s"
#define KEY_ARGS                                                                           \
    (unsigned long long)key->addr, (unsigned long long)key->length,                        \
        (unsigned long long)key->offset, key->align, key->options,                         \
        key->kind == FERRY_STORAGE_KIND_BLOCK ? "block" : "file", host,                    \
        (unsigned long long)key->dev, (unsigned long long)key->ino, wwid, path

char *ferry_storage_key_format(const ferry_storage_key_t *key)
{
    char host[3 * FERRY_STORAGE_HOST_MAX + 1], wwid[3 * FERRY_STORAGE_WWID_MAX + 1];
    char path[3 * FERRY_STORAGE_PATH_MAX + 1];
    put_esc(host, sizeof(host), key->host);
    put_esc(path, sizeof(path), key->path);
    if (key->wwid[0] != '\0')
        put_esc(wwid, sizeof(wwid), key->wwid);
    else
        strcpy(wwid, "-");
    /* snprintf twice, not ferry_strdup_printf: the fuzz harnesses build
     * the descriptor code, and this file with it, without src/util */
    int size = snprintf(NULL, 0, KEY_FORMAT, KEY_ARGS);
    char *text = size < 0 ? NULL : malloc((size_t)size + 1);
    if (text != NULL)
        snprintf(text, (size_t)size + 1, KEY_FORMAT, KEY_ARGS);
    return text;
}

/* ---- the reader ---- */

typedef struct reader {
    const char *p;
    const char *why; /* set on the first failure */
} reader_t;

static int fail(reader_t *in, const char *why)
{
    if (in->why == NULL)
        in->why = why;
    return 0;
}

/* "name=" then the value up to the next space (or the end): [*start, *end). */
static int field(reader_t *in, const char *name, const char **start_p, size_t *length_p)
{
    size_t n = strlen(name);
    if (in->why != NULL)
        return 0;
    if (strncmp(in->p, name, n) != 0 || in->p[n] != '=')
        return fail(in, name);
    const char *start = in->p + n + 1, *end = start;
    while (*end != '\0' && *end != ' ')
        end++;
    if (end == start)
        return fail(in, name);
    *start_p = start;
    *length_p = (size_t)(end - start);
    in->p = *end == ' ' ? end + 1 : end;
    return 1;
}

static int hex_field(reader_t *in, const char *name, uint64_t *value_p)
{
    const char *start;
    size_t length;
    if (!field(in, name, &start, &length))
        return 0;
    if (length > 16)
        return fail(in, name);
    uint64_t value = 0;
    for (size_t i = 0; i < length; i++) {
        char c = start[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return fail(in, name);
        value = value << 4 | (uint64_t)(c <= '9' ? c - '0' : c - 'a' + 10);
    }
    *value_p = value;
    return 1;
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The value unescaped into out[size]; NUL, a bad escape or too long fail. */
static int esc_field(reader_t *in, const char *name, char *out, size_t size)
{
    const char *start;
    size_t length, at = 0;
    if (!field(in, name, &start, &length))
        return 0;
    for (size_t i = 0; i < length; i++) {
        int c = (unsigned char)start[i];
        if (c == '%') {
            if (i + 2 >= length)
                return fail(in, name);
            int hi = hex_value(start[i + 1]), lo = hex_value(start[i + 2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return fail(in, name);
            c = hi << 4 | lo;
            i += 2;
        }
        if (at + 1 >= size)
            return fail(in, name);
        out[at++] = (char)c;
    }
    out[at] = '\0';
    return 1;
}

ferry_status_t ferry_storage_key_parse(const char *text, ferry_storage_key_t *key,
                                       const char **why_p)
{
    reader_t in = {.p = text, .why = NULL};
    memset(key, 0, sizeof(*key));
    *why_p = NULL;
    if (text == NULL || strlen(text) > FERRY_STORAGE_KEY_MAX) {
        *why_p = "missing or longer than the limit";
        return FERRY_ERR_DECODE;
    }
    if (strncmp(in.p, "v1 ", 3) != 0) {
        *why_p = "version (not \"v1 \")";
        return FERRY_ERR_DECODE;
    }
    in.p += 3;
    uint64_t align = 0, options = 0;
    const char *kind;
    size_t kind_length = 0;
    hex_field(&in, "addr", &key->addr);
    hex_field(&in, "len", &key->length);
    hex_field(&in, "off", &key->offset);
    hex_field(&in, "align", &align);
    hex_field(&in, "opt", &options);
    if (field(&in, "kind", &kind, &kind_length)) {
        if (kind_length == 4 && strncmp(kind, "file", 4) == 0)
            key->kind = FERRY_STORAGE_KIND_FILE;
        else if (kind_length == 5 && strncmp(kind, "block", 5) == 0)
            key->kind = FERRY_STORAGE_KIND_BLOCK;
        else
            fail(&in, "kind (not file or block)");
    }
    esc_field(&in, "host", key->host, sizeof(key->host));
    hex_field(&in, "dev", &key->dev);
    hex_field(&in, "ino", &key->ino);
    esc_field(&in, "wwid", key->wwid, sizeof(key->wwid));
    esc_field(&in, "path", key->path, sizeof(key->path));
    if (in.why == NULL && *in.p != '\0')
        fail(&in, "text after path");
    if (in.why == NULL && strcmp(key->wwid, "-") == 0)
        key->wwid[0] = '\0';
    /* the values, now that the fields are there */
    if (in.why == NULL && (key->length == 0 || key->length > UINT64_MAX - key->addr))
        fail(&in, "len (0, or addr + len past 2^64)");
    if (in.why == NULL && key->length > UINT64_MAX - key->offset)
        fail(&in, "off (off + len past 2^64)");
    if (in.why == NULL && (align == 0 || align > FERRY_STORAGE_ALIGN_MAX || (align & (align - 1))))
        fail(&in, "align (not a power of two up to 1 MiB)");
    if (in.why == NULL && (options & ~(uint64_t)KNOWN_OPTIONS))
        fail(&in, "opt (unknown option bits)");
    if (in.why == NULL && key->path[0] != '/')
        fail(&in, "path (not absolute)");
    if (in.why == NULL && key->kind == FERRY_STORAGE_KIND_BLOCK && key->ino != 0)
        fail(&in, "ino (a block device has none)");
    key->align = (uint32_t)align;
    key->options = (unsigned)options;
    if (in.why == NULL) {
        /* one text per key: what we would write must be what we read */
        char *again = ferry_storage_key_format(key);
        if (again == NULL) {
            *why_p = "out of memory";
            return FERRY_ERR_NO_MEMORY;
        }
        if (strcmp(again, text) != 0)
            fail(&in, "not in canonical form (spacing, escapes, leading zeros)");
        free(again);
    }
    *why_p = in.why;
    return in.why == NULL ? FERRY_OK : FERRY_ERR_DECODE;
}

ferry_status_t ferry_storage_key_check(const ferry_descriptor_t *desc,
                                       const ferry_desc_buffer_t *buffer, const char *text)
{
    ferry_storage_key_t *key = malloc(sizeof(*key));
    if (key == NULL)
        return FERRY_ERR_NO_MEMORY;
    const char *why;
    ferry_status_t status = ferry_storage_key_parse(text, key, &why);
    if (status == FERRY_OK && (key->addr != buffer->addr || key->length != buffer->length))
        why = "addr and len are not the buffer's", status = FERRY_ERR_DECODE;
    if (status == FERRY_OK && strcmp(key->host, desc->host_id ? desc->host_id : "") != 0)
        why = "host is not the descriptor's", status = FERRY_ERR_DECODE;
    if (status == FERRY_OK && buffer->location != NULL &&
        strcmp(buffer->location, FERRY_STORAGE_LOCATION) != 0)
        why = "the buffer's location is not \"" FERRY_STORAGE_LOCATION "\"",
        status = FERRY_ERR_DECODE;
    free(key);
    if (status == FERRY_ERR_DECODE)
        return ferry_desc_decode_bad("buffers", "keys", "storage key of buffer 0x%llx: %s",
                                     (unsigned long long)buffer->addr, why);
    return status;
}

ferry_status_t ferry_storage_keys_check(const ferry_descriptor_t *desc, size_t first,
                                        size_t count)
{
    /* Storage keys are those of the transports that reach storage: the
     * file transport's, named here because a decoder knows no plugin. */
    int t = ferry_descriptor_transport_index(desc, FERRY_STORAGE_TRANSPORT);
    for (size_t i = first; i < first + count; i++) {
        const ferry_desc_buffer_t *buffer = &desc->buffers[i];
        const char *text = t >= 0 && buffer->keys != NULL ? buffer->keys[t] : NULL;
        if (text != NULL) {
            ferry_status_t status = ferry_storage_key_check(desc, buffer, text);
            if (status != FERRY_OK)
                return status;
        } else if (buffer->location != NULL &&
                   strcmp(buffer->location, FERRY_STORAGE_LOCATION) == 0 && t >= 0) {
            return ferry_desc_decode_bad("buffers", "keys", "buffer 0x%llx at location \""
                                         FERRY_STORAGE_LOCATION "\" has no storage key",
                                         (unsigned long long)buffer->addr);
        }
    }
    return FERRY_OK;
}
