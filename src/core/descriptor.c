/*
 * The segment descriptor: what an engine publishes about its registered memory,
 * and the strict JSON codec for it.  Descriptors come from other processes over
 * the network, so the decoder trusts nothing: every field is type-checked and
 * bounded, and any problem is FERRY_ERR_DECODE, logged once naming the field.
 *
 * Wire format, version 1 (FERRY_DESCRIPTOR_VERSION), compact JSON:
 *
 *   {"version":1,
 *    "name":"seg",                      non-empty string
 *    "generation":"0x1234abcd",         "0x" + hex digits, 64 bits
 *    "host":"<host id>",                string (may be empty)
 *    "rpc":"host:port",                 string (may be empty)
 *    "transports":{"tcp":"127.0.0.1:4567", "ucx":"<base64>"},
 *                                       name -> endpoint; object order is
 *                                       desc->transports[] order
 *    "buffers":[{"addr":"0x7f0000001000",  "0x" + hex digits, 64 bits
 *                "length":"4096",          decimal digits, 64 bits, not 0
 *                "location":"cpu",         string
 *                "access":"rw",            "r", "w" or "rw"
 *                "keys":{"tcp":"", "ucx":"..."}}],
 *                                       transport name -> key string; a
 *                                       transport without a key is absent
 *    "files":[]}                        reserved: must be an array if present
 *                                       (storage buffers travel as buffers at
 *                                       location "file" whose "file" key is a
 *                                       storage key, storage_key.c, checked by
 *                                       ferry_descriptor_finish)
 *
 * 64-bit values travel as strings so that no JSON number (double or int64)
 * ever carries them.  Unknown members are ignored so a newer writer can add
 * fields; known members must have the right type.  Limits that reject absurd
 * input before it costs memory: 64 MiB of JSON, 1,000,000 buffers,
 * 64 transports, 64 KiB per string.  Buffers must be disjoint and end at or
 * below 2^64 - 1 (addr + length fits in 64 bits), so lookups never overflow.
 * Buffers with no remote access are never published.
 *
 * The same value has a second, compact text form (descriptor_compact.c), ten
 * times smaller to decode; ferry_descriptor_decode() takes either, told
 * apart by the first bytes ("ferry:desc:1\n" or JSON), so a reader of this
 * version understands every writer.  Which form an engine writes:
 * doc/metadata.md, "Descriptor forms".  The JSON form carries no revision
 * (descriptor.h: revision 0), so it stays byte for byte what older
 * engines write and compare.
 */
#include "core.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#define DESC_MAX_JSON FERRY_DESC_MAX_TEXT
#define DESC_MAX_STRING FERRY_DESC_MAX_STRING
#define DESC_MAX_BUFFERS FERRY_DESC_MAX_BUFFERS
#define DESC_MAX_TRANSPORTS FERRY_DESC_MAX_TRANSPORTS

_Static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "strtoull() parses 64 bits");

/* ---------------- lifetime ---------------- */

ferry_descriptor_t *ferry_descriptor_new(void)
{
    static atomic_uint_fast64_t serials;
    ferry_descriptor_t *desc = calloc(1, sizeof(*desc));
    if (desc == NULL)
        return NULL;
    atomic_init(&desc->refs, 1);
    desc->serial = atomic_fetch_add_explicit(&serials, 1, memory_order_relaxed) + 1;
    return desc;
}

ferry_descriptor_t *ferry_descriptor_ref(ferry_descriptor_t *desc)
{
    if (desc != NULL)
        atomic_fetch_add_explicit(&desc->refs, 1, memory_order_relaxed);
    return desc;
}

static void descriptor_free(ferry_descriptor_t *desc)
{
    for (size_t i = 0; desc->pool == NULL && i < desc->n_buffers; i++) {
        ferry_desc_buffer_t *buffer = &desc->buffers[i];
        if (buffer->keys != NULL) {
            for (size_t t = 0; t < desc->n_transports; t++)
                free(buffer->keys[t]);
            free(buffer->keys);
        }
        free(buffer->location);
    }
    free(desc->buffers);
    ferry_desc_pool_unref(desc->pool);
    if (desc->confirm_base != NULL) /* the last holder: no one else reads it */
        ferry_descriptor_unref(desc->confirm_base);
    for (size_t t = 0; t < desc->n_transports; t++) {
        free(desc->transports[t].name);
        free(desc->transports[t].endpoint);
    }
    free(desc->transports);
    free(desc->name);
    free(desc->host_id);
    free(desc->rpc);
    free(desc);
}

void ferry_descriptor_ref_n(ferry_descriptor_t *desc, unsigned n)
{
    /* relaxed, as ferry_descriptor_ref: the caller holds one already */
    atomic_fetch_add_explicit(&desc->refs, n, memory_order_relaxed);
}

void ferry_descriptor_unref_n(ferry_descriptor_t *desc, unsigned n)
{
    if (desc == NULL || n == 0)
        return;
    /* acq_rel: the last holder must see every write made through other refs */
    if (atomic_fetch_sub_explicit(&desc->refs, n, memory_order_acq_rel) == n)
        descriptor_free(desc);
}

void ferry_descriptor_unref(ferry_descriptor_t *desc)
{
    ferry_descriptor_unref_n(desc, 1);
}

/* ---------------- finish, find ---------------- */

static int buffer_compare(const void *a, const void *b)
{
    const ferry_desc_buffer_t *x = a, *y = b;
    return (x->addr > y->addr) - (x->addr < y->addr);
}

ferry_status_t ferry_descriptor_finish(ferry_descriptor_t *desc)
{
    if (desc == NULL || (desc->n_buffers > 0 && desc->buffers == NULL))
        return FERRY_ERR_INVALID_PARAM;

    /* find() relies on non-empty buffers whose end fits in 64 bits; the
     * decoder checks this already, the builder gets it checked here */
    for (size_t i = 0; i < desc->n_buffers; i++) {
        const ferry_desc_buffer_t *buffer = &desc->buffers[i];
        if (buffer->length == 0 || buffer->length > UINT64_MAX - buffer->addr) {
            ferry_error("segment descriptor: buffer at 0x%" PRIx64 " length %" PRIu64
                        ": empty or past the end of the address space",
                        buffer->addr, buffer->length);
            return FERRY_ERR_DECODE;
        }
    }
    /* Encoders write buffers in order: sorting them again is the cost of a
     * hand-built (or foreign) descriptor only. */
    size_t sorted = 1;
    while (sorted < desc->n_buffers && desc->buffers[sorted - 1].addr < desc->buffers[sorted].addr)
        sorted++;
    if (sorted < desc->n_buffers)
        qsort(desc->buffers, desc->n_buffers, sizeof(desc->buffers[0]), buffer_compare);

    for (size_t i = 1; i < desc->n_buffers; i++) {
        const ferry_desc_buffer_t *prev = &desc->buffers[i - 1], *cur = &desc->buffers[i];
        if (prev->addr + prev->length <= cur->addr)
            continue;
        if (prev->addr == cur->addr && prev->length == cur->length)
            ferry_error("segment descriptor: buffers: duplicate buffer at 0x%" PRIx64
                        " length %" PRIu64, cur->addr, cur->length);
        else
            ferry_error("segment descriptor: buffers: buffer at 0x%" PRIx64 " length %" PRIu64
                        " overlaps buffer at 0x%" PRIx64 " length %" PRIu64,
                        cur->addr, cur->length, prev->addr, prev->length);
        return FERRY_ERR_DECODE;
    }
    return ferry_storage_keys_check(desc, 0, desc->n_buffers);
}

const ferry_desc_buffer_t *ferry_descriptor_find(const ferry_descriptor_t *desc, uint64_t addr,
                                                 uint64_t length)
{
    if (desc == NULL || length == 0 || desc->n_buffers == 0)
        return NULL;

    /* first buffer starting after addr; the candidate is the one before it */
    size_t low = 0, high = desc->n_buffers;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (desc->buffers[mid].addr <= addr)
            low = mid + 1;
        else
            high = mid;
    }
    if (low == 0)
        return NULL;

    const ferry_desc_buffer_t *buffer = &desc->buffers[low - 1];
    uint64_t offset = addr - buffer->addr; /* no wrap: buffer->addr <= addr */
    if (offset >= buffer->length || length > buffer->length - offset)
        return NULL;
    return buffer;
}

static int same_text(const char *a, const char *b)
{
    return a == b || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

int ferry_descriptor_same(const ferry_descriptor_t *a, const ferry_descriptor_t *b)
{
    if (!same_text(a->name, b->name) || a->generation != b->generation ||
        !same_text(a->host_id, b->host_id) || !same_text(a->rpc, b->rpc) ||
        a->n_transports != b->n_transports || a->n_buffers != b->n_buffers)
        return 0;
    for (size_t t = 0; t < a->n_transports; t++)
        if (!same_text(a->transports[t].name, b->transports[t].name) ||
            !same_text(a->transports[t].endpoint, b->transports[t].endpoint))
            return 0;
    for (size_t i = 0; i < a->n_buffers; i++) {
        const ferry_desc_buffer_t *x = &a->buffers[i], *y = &b->buffers[i];
        if (x->addr != y->addr || x->length != y->length || x->access != y->access ||
            !same_text(x->location, y->location))
            return 0;
        for (size_t t = 0; t < a->n_transports; t++)
            if (!same_text(x->keys ? x->keys[t] : NULL, y->keys ? y->keys[t] : NULL))
                return 0;
    }
    return 1;
}

int ferry_descriptor_transport_index(const ferry_descriptor_t *desc, const char *name)
{
    if (desc == NULL || name == NULL)
        return -1;
    for (size_t t = 0; t < desc->n_transports; t++) {
        if (desc->transports[t].name != NULL && strcmp(desc->transports[t].name, name) == 0)
            return (int)t;
    }
    return -1;
}

/* ---------------- encode ---------------- */

const char *ferry_desc_access_text(unsigned access)
{
    switch (access & FERRY_REG_REMOTE) {
    case FERRY_REG_REMOTE_READ: return "r";
    case FERRY_REG_REMOTE_WRITE: return "w";
    case FERRY_REG_REMOTE: return "rw";
    }
    return NULL;
}

static json_t *hex_string(uint64_t value)
{
    char text[24];
    snprintf(text, sizeof(text), "0x%" PRIx64, value);
    return json_string(text);
}

static json_t *decimal_string(uint64_t value)
{
    char text[24];
    snprintf(text, sizeof(text), "%" PRIu64, value);
    return json_string(text);
}

/*
 * json_object_set_new() takes a NULL value (and drops the value on failure),
 * so members can be built inline and every failure lands here: a NULL or
 * non-UTF-8 string, a duplicate key, or no memory.
 */
static int encode_set(json_t *object, const char *key, json_t *value, const char *what)
{
    if (key != NULL && json_object_get(object, key) != NULL) {
        json_decref(value);
        ferry_error("segment descriptor: cannot encode %s: duplicate name \"%.64s\"", what, key);
        return -1;
    }
    if (key == NULL || json_object_set_new(object, key, value) != 0) {
        if (key == NULL)
            json_decref(value);
        ferry_error("segment descriptor: cannot encode %s: missing or not UTF-8 text "
                    "(or out of memory)", what);
        return -1;
    }
    return 0;
}

static json_t *encode_buffer(const ferry_descriptor_t *desc, const ferry_desc_buffer_t *buffer)
{
    json_t *object = json_object(), *keys = json_object();
    if (object == NULL || keys == NULL)
        goto err_free;
    if (encode_set(object, "addr", hex_string(buffer->addr), "buffer addr") != 0 ||
        encode_set(object, "length", decimal_string(buffer->length), "buffer length") != 0 ||
        encode_set(object, "location", json_string(buffer->location ? buffer->location : "cpu"),
                   "buffer location") != 0 ||
        encode_set(object, "access", json_string(ferry_desc_access_text(buffer->access)),
                   "buffer access") != 0)
        goto err_free;
    for (size_t t = 0; buffer->keys != NULL && t < desc->n_transports; t++) {
        if (buffer->keys[t] == NULL)
            continue;
        if (encode_set(keys, desc->transports[t].name, json_string(buffer->keys[t]),
                       "buffer key") != 0)
            goto err_free;
    }
    if (encode_set(object, "keys", keys, "buffer keys") != 0)
        goto err_free_object;
    return object;

err_free:
    json_decref(keys);
err_free_object:
    json_decref(object);
    return NULL;
}

ferry_status_t ferry_descriptor_encode(const ferry_descriptor_t *desc, char **json_p)
{
    if (desc == NULL || json_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    *json_p = NULL;
    if (desc->name == NULL || desc->name[0] == '\0') {
        ferry_error("segment descriptor: cannot encode: empty name");
        return FERRY_ERR_INVALID_PARAM;
    }

    /* every member goes through encode_set(), which logs; a failure here is a
     * bad field (or, rarely, memory), reported as the caller's bad argument */
    ferry_status_t status = FERRY_ERR_INVALID_PARAM;
    json_t *root = json_object(), *transports = json_object(), *buffers = json_array();
    if (encode_set(root, "version", json_integer(FERRY_DESCRIPTOR_VERSION), "version") != 0 ||
        encode_set(root, "name", json_string(desc->name), "name") != 0 ||
        encode_set(root, "generation", hex_string(desc->generation), "generation") != 0 ||
        encode_set(root, "host", json_string(desc->host_id ? desc->host_id : ""), "host") != 0 ||
        encode_set(root, "rpc", json_string(desc->rpc ? desc->rpc : ""), "rpc") != 0)
        goto out;
    for (size_t t = 0; t < desc->n_transports; t++) {
        const ferry_desc_transport_t *transport = &desc->transports[t];
        if (encode_set(transports, transport->name,
                       json_string(transport->endpoint ? transport->endpoint : ""),
                       "transport") != 0)
            goto out;
    }
    for (size_t i = 0; i < desc->n_buffers; i++) {
        /* a buffer peers may not touch is none of their business */
        if (ferry_desc_access_text(desc->buffers[i].access) == NULL)
            continue;
        json_t *buffer = encode_buffer(desc, &desc->buffers[i]);
        if (buffer == NULL || json_array_append_new(buffers, buffer) != 0)
            goto out;
    }
    int failed = encode_set(root, "transports", json_incref(transports), "transports");
    failed |= encode_set(root, "buffers", json_incref(buffers), "buffers");
    failed |= encode_set(root, "files", json_array(), "files");
    if (failed)
        goto out;

    *json_p = json_dumps(root, JSON_COMPACT);
    if (*json_p == NULL) {
        ferry_error("segment descriptor: cannot encode: out of memory");
        status = FERRY_ERR_NO_MEMORY;
    } else {
        status = FERRY_OK;
    }
out:
    json_decref(root);
    json_decref(transports);
    json_decref(buffers);
    return status;
}

/* ---------------- decode ---------------- */

/* Log a decode problem as "<prefix>.<key>: <problem>" and return FERRY_ERR_DECODE. */
ferry_status_t ferry_desc_decode_bad(const char *prefix, const char *key, const char *fmt, ...)
{
    char problem[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof(problem), fmt, ap);
    va_end(ap);
    const char *dot = (prefix[0] != '\0' && key[0] != '\0') ? "." : "";
    ferry_error("segment descriptor: %s%s%.64s: %s", prefix, dot, key, problem);
    return FERRY_ERR_DECODE;
}

/* A required, bounded string member; the text stays owned by the JSON tree. */
static ferry_status_t get_string(const json_t *object, const char *prefix, const char *key,
                                 const char **text_p)
{
    const json_t *value = json_object_get(object, key);
    if (value == NULL)
        return ferry_desc_decode_bad(prefix, key, "missing");
    if (!json_is_string(value))
        return ferry_desc_decode_bad(prefix, key, "must be a string");
    if (json_string_length(value) > DESC_MAX_STRING)
        return ferry_desc_decode_bad(prefix, key, "longer than %zu bytes", DESC_MAX_STRING);
    *text_p = json_string_value(value);
    return FERRY_OK;
}

static ferry_status_t dup_string(const char *text, char **copy_p)
{
    *copy_p = strdup(text);
    if (*copy_p != NULL)
        return FERRY_OK;
    ferry_error("segment descriptor: out of memory");
    return FERRY_ERR_NO_MEMORY;
}

static ferry_status_t get_string_copy(const json_t *object, const char *prefix, const char *key,
                                      char **copy_p)
{
    const char *text;
    ferry_status_t status = get_string(object, prefix, key, &text);
    return status == FERRY_OK ? dup_string(text, copy_p) : status;
}

/* The same, into the descriptor's pool (a buffer's strings). */
static ferry_status_t get_string_pooled(const json_t *object, const char *prefix,
                                        const char *key, ferry_desc_pool_t *pool, char **copy_p)
{
    const char *text;
    ferry_status_t status = get_string(object, prefix, key, &text);
    if (status != FERRY_OK)
        return status;
    *copy_p = ferry_desc_pool_strndup(pool, text, strlen(text));
    if (*copy_p != NULL)
        return FERRY_OK;
    ferry_error("segment descriptor: out of memory");
    return FERRY_ERR_NO_MEMORY;
}

/*
 * A 64-bit value as a string: "0x" + hex digits, or decimal digits.  The
 * digits are checked before strtoull() so that its leniency (leading blanks,
 * signs, a second "0x") never applies; the whole string must be consumed.
 */
static ferry_status_t get_u64(const json_t *object, const char *prefix, const char *key,
                              int hex, uint64_t *value_p)
{
    const char *text;
    ferry_status_t status = get_string(object, prefix, key, &text);
    if (status != FERRY_OK)
        return status;

    const char *form = hex ? "a \"0x\"-prefixed hex string" : "a decimal string";
    size_t length = strlen(text);
    const char *digits = text;
    if (hex) {
        if (length < 2 || text[0] != '0' || text[1] != 'x')
            return ferry_desc_decode_bad(prefix, key, "must be %s", form);
        digits += 2;
        length -= 2;
    }
    if (length == 0)
        return ferry_desc_decode_bad(prefix, key, "must be %s (no digits)", form);
    for (size_t i = 0; i < length; i++) {
        char c = digits[i];
        int ok = (c >= '0' && c <= '9') ||
                 (hex && ((c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')));
        if (!ok)
            return ferry_desc_decode_bad(prefix, key, "must be %s", form);
    }
    char *end;
    errno = 0;
    unsigned long long value = strtoull(digits, &end, hex ? 16 : 10);
    if (errno == ERANGE)
        return ferry_desc_decode_bad(prefix, key, "does not fit in 64 bits");
    if (end != digits + length)
        return ferry_desc_decode_bad(prefix, key, "must be %s", form);
    *value_p = (uint64_t)value;
    return FERRY_OK;
}

static ferry_status_t decode_transports(const json_t *root, ferry_descriptor_t *desc)
{
    const json_t *object = json_object_get(root, "transports");
    if (object == NULL)
        return ferry_desc_decode_bad("", "transports", "missing");
    if (!json_is_object(object))
        return ferry_desc_decode_bad("", "transports", "must be an object");
    size_t count = json_object_size(object);
    if (count > DESC_MAX_TRANSPORTS)
        return ferry_desc_decode_bad("", "transports", "more than %zu transports",
                                     DESC_MAX_TRANSPORTS);

    desc->transports = calloc(count ? count : 1, sizeof(*desc->transports));
    if (desc->transports == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    desc->n_transports = count;

    /* jansson keeps insertion order, which is the transports' order */
    size_t t = 0;
    const char *name;
    json_t *value;
    json_object_foreach ((json_t *)object, name, value) {
        if (name[0] == '\0')
            return ferry_desc_decode_bad("transports", "", "empty transport name");
        if (strlen(name) > DESC_MAX_STRING)
            return ferry_desc_decode_bad("transports", "",
                                         "transport name longer than %zu bytes",
                                         DESC_MAX_STRING);
        ferry_status_t status = get_string_copy(object, "transports", name,
                                                &desc->transports[t].endpoint);
        if (status != FERRY_OK)
            return status;
        status = dup_string(name, &desc->transports[t].name);
        if (status != FERRY_OK)
            return status;
        t++;
    }
    return FERRY_OK;
}

static ferry_status_t decode_access(const json_t *object, const char *prefix, unsigned *access_p)
{
    const char *text;
    ferry_status_t status = get_string(object, prefix, "access", &text);
    if (status != FERRY_OK)
        return status;
    if (strcmp(text, "r") == 0)
        *access_p = FERRY_REG_REMOTE_READ;
    else if (strcmp(text, "w") == 0)
        *access_p = FERRY_REG_REMOTE_WRITE;
    else if (strcmp(text, "rw") == 0)
        *access_p = FERRY_REG_REMOTE;
    else
        return ferry_desc_decode_bad(prefix, "access", "must be \"r\", \"w\" or \"rw\"");
    return FERRY_OK;
}

static ferry_status_t decode_keys(const json_t *object, const char *prefix,
                                  const ferry_descriptor_t *desc, ferry_desc_buffer_t *buffer)
{
    const json_t *keys = json_object_get(object, "keys");
    if (keys == NULL)
        return ferry_desc_decode_bad(prefix, "keys", "missing");
    if (!json_is_object(keys))
        return ferry_desc_decode_bad(prefix, "keys", "must be an object");

    buffer->keys = ferry_desc_pool_alloc(desc->pool, desc->n_transports * sizeof(char *));
    if (buffer->keys == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    memset(buffer->keys, 0, desc->n_transports * sizeof(char *));
    char keys_prefix[64];
    snprintf(keys_prefix, sizeof(keys_prefix), "%s.keys", prefix);
    const char *name;
    json_t *value;
    json_object_foreach ((json_t *)keys, name, value) {
        int t = ferry_descriptor_transport_index(desc, name);
        if (t < 0)
            return ferry_desc_decode_bad(keys_prefix, name, "names no transport in \"transports\"");
        ferry_status_t status = get_string_pooled(keys, keys_prefix, name, desc->pool,
                                                  &buffer->keys[t]);
        if (status != FERRY_OK)
            return status;
    }
    return FERRY_OK;
}

static ferry_status_t decode_buffer(const json_t *object, size_t index,
                                    const ferry_descriptor_t *desc, ferry_desc_buffer_t *buffer)
{
    char prefix[48];
    snprintf(prefix, sizeof(prefix), "buffers[%zu]", index);
    if (!json_is_object(object))
        return ferry_desc_decode_bad(prefix, "", "must be an object");

    ferry_status_t status = get_u64(object, prefix, "addr", 1, &buffer->addr);
    if (status != FERRY_OK)
        return status;
    status = get_u64(object, prefix, "length", 0, &buffer->length);
    if (status != FERRY_OK)
        return status;
    if (buffer->length == 0)
        return ferry_desc_decode_bad(prefix, "length", "must not be 0");
    if (buffer->length > UINT64_MAX - buffer->addr)
        return ferry_desc_decode_bad(prefix, "length", "addr + length does not fit in 64 bits");
    status = get_string_pooled(object, prefix, "location", desc->pool, &buffer->location);
    if (status != FERRY_OK)
        return status;
    status = decode_access(object, prefix, &buffer->access);
    if (status != FERRY_OK)
        return status;
    return decode_keys(object, prefix, desc, buffer);
}

static ferry_status_t decode_buffers(const json_t *root, ferry_descriptor_t *desc)
{
    const json_t *array = json_object_get(root, "buffers");
    if (array == NULL)
        return ferry_desc_decode_bad("", "buffers", "missing");
    if (!json_is_array(array))
        return ferry_desc_decode_bad("", "buffers", "must be an array");
    size_t count = json_array_size(array);
    if (count > DESC_MAX_BUFFERS)
        return ferry_desc_decode_bad("", "buffers", "more than %zu buffers", DESC_MAX_BUFFERS);

    desc->buffers = calloc(count ? count : 1, sizeof(*desc->buffers));
    desc->pool = ferry_desc_pool_new(NULL);
    if (desc->buffers == NULL || desc->pool == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    /* the pool holds every string, so unref cleans up a partial decode */
    desc->n_buffers = count;
    for (size_t i = 0; i < count; i++) {
        ferry_status_t status = decode_buffer(json_array_get(array, i), i, desc,
                                              &desc->buffers[i]);
        if (status != FERRY_OK)
            return status;
    }
    return FERRY_OK;
}

static ferry_status_t decode_root(const json_t *root, ferry_descriptor_t *desc)
{
    if (!json_is_object(root))
        return ferry_desc_decode_bad("", "document", "not a JSON object");

    const json_t *version = json_object_get(root, "version");
    if (version == NULL)
        return ferry_desc_decode_bad("", "version", "missing");
    if (!json_is_integer(version))
        return ferry_desc_decode_bad("", "version", "must be an integer");
    if (json_integer_value(version) != FERRY_DESCRIPTOR_VERSION)
        return ferry_desc_decode_bad("", "version",
                                     "%" JSON_INTEGER_FORMAT " is not supported (expected %d)",
                          json_integer_value(version), FERRY_DESCRIPTOR_VERSION);

    ferry_status_t status = get_string_copy(root, "", "name", &desc->name);
    if (status != FERRY_OK)
        return status;
    if (desc->name[0] == '\0')
        return ferry_desc_decode_bad("", "name", "must not be empty");
    status = get_u64(root, "", "generation", 1, &desc->generation);
    if (status != FERRY_OK)
        return status;
    status = get_string_copy(root, "", "host", &desc->host_id);
    if (status != FERRY_OK)
        return status;
    status = get_string_copy(root, "", "rpc", &desc->rpc);
    if (status != FERRY_OK)
        return status;
    status = decode_transports(root, desc);
    if (status != FERRY_OK)
        return status;
    status = decode_buffers(root, desc);
    if (status != FERRY_OK)
        return status;

    const json_t *files = json_object_get(root, "files");
    if (files != NULL && !json_is_array(files))
        return ferry_desc_decode_bad("", "files", "must be an array");
    return FERRY_OK;
}

ferry_desc_form_t ferry_descriptor_text_form(const char *text, size_t length)
{
    size_t magic = strlen(FERRY_DESC_COMPACT_MAGIC);
    return text != NULL && length >= magic && memcmp(text, FERRY_DESC_COMPACT_MAGIC, magic) == 0
               ? FERRY_DESC_FORM_COMPACT
               : FERRY_DESC_FORM_JSON;
}

static ferry_status_t decode_json(const char *json, size_t length, ferry_descriptor_t *desc)
{
    /* json_loadb() reads exactly `length` bytes: no NUL terminator needed, and
     * a NUL inside is a syntax error.  Duplicate keys would make "which value
     * counts" ambiguous, so they are refused. */
    json_error_t error;
    json_t *root = json_loadb(json, length, JSON_REJECT_DUPLICATES, &error);
    if (root == NULL) {
        if (json_error_code(&error) == json_error_out_of_memory) {
            ferry_error("segment descriptor: out of memory");
            return FERRY_ERR_NO_MEMORY;
        }
        ferry_error("segment descriptor: not valid JSON (line %d, column %d): %s", error.line,
                    error.column, error.text);
        return FERRY_ERR_DECODE;
    }
    ferry_status_t status = decode_root(root, desc);
    json_decref(root);
    return status;
}

ferry_status_t ferry_descriptor_decode(const char *text, size_t length,
                                       ferry_descriptor_t **desc_p)
{
    if (text == NULL || desc_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    *desc_p = NULL;
    if (length > DESC_MAX_JSON)
        return ferry_desc_decode_bad("", "document", "%zu bytes is more than %zu", length,
                                     DESC_MAX_JSON);

    ferry_descriptor_t *desc = ferry_descriptor_new();
    if (desc == NULL) {
        ferry_error("segment descriptor: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    ferry_status_t status = ferry_descriptor_text_form(text, length) == FERRY_DESC_FORM_COMPACT
                                ? ferry_descriptor_compact_decode(text, length, desc)
                                : decode_json(text, length, desc);
    return ferry_descriptor_complete(desc, status, desc_p);
}

ferry_status_t ferry_descriptor_complete(ferry_descriptor_t *desc, ferry_status_t status,
                                         ferry_descriptor_t **desc_p)
{
    if (status == FERRY_OK)
        status = ferry_descriptor_finish(desc);
    if (status != FERRY_OK) {
        ferry_descriptor_unref(desc);
        return status;
    }
    *desc_p = desc;
    return FERRY_OK;
}

ferry_status_t ferry_descriptor_encode_as(const ferry_descriptor_t *desc, ferry_desc_form_t form,
                                          char **text_p, size_t *length_p)
{
    if (form == FERRY_DESC_FORM_COMPACT)
        return ferry_descriptor_compact_encode(desc, text_p, length_p);
    ferry_status_t status = ferry_descriptor_encode(desc, text_p);
    if (status == FERRY_OK && length_p != NULL)
        *length_p = strlen(*text_p);
    return status;
}

/* UTF-8 as RFC 3629 has it (no surrogates, nothing past U+10FFFF, shortest
 * form only), and no NUL: what a JSON string can hold, so that either form
 * can carry any descriptor the other holds. */
int ferry_desc_text_valid(const char *text, size_t length)
{
    const unsigned char *s = (const unsigned char *)text, *end = s + length;
    while (s < end) {
        unsigned c = *s;
        if (c >= 0x01 && c < 0x80) {
            s++;
            continue;
        }
        size_t need;
        unsigned min, code;
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1, min = 0x80, code = c & 0x1f;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2, min = 0x800, code = c & 0x0f;
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3, min = 0x10000, code = c & 0x07;
        } else {
            return 0; /* NUL, a continuation byte, or an invalid lead */
        }
        if ((size_t)(end - s) <= need)
            return 0;
        for (size_t i = 1; i <= need; i++) {
            if ((s[i] & 0xc0) != 0x80)
                return 0;
            code = code << 6 | (s[i] & 0x3f);
        }
        if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff))
            return 0;
        s += need + 1;
    }
    return 1;
}
