/*
 * The segment descriptor codec: what a peer publishes must come back exactly,
 * and whatever arrives from the network (malformed, truncated, hostile) must be
 * refused with FERRY_ERR_DECODE and one log line naming the problem, never a
 * crash.
 */
#include <criterion/criterion.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_rng.h"
#include "../src/core/core.h"

#define VALID_DOC                                                                            \
    "{\"version\":1,\"name\":\"seg\",\"generation\":\"0x1234abcd\",\"host\":\"host-a\","    \
    "\"rpc\":\"10.0.0.1:7000\",\"transports\":{\"tcp\":\"10.0.0.1:4567\",\"ucx\":\"AAEC\"}," \
    "\"buffers\":[{\"addr\":\"0x1000\",\"length\":\"4096\",\"location\":\"cpu\","           \
    "\"access\":\"rw\",\"keys\":{\"tcp\":\"\",\"ucx\":\"k1\"}},"                              \
    "{\"addr\":\"0x2000\",\"length\":\"4096\",\"location\":\"cuda:0\",\"access\":\"r\","    \
    "\"keys\":{\"ucx\":\"k2\"}}],\"files\":[]}"

static ferry_status_t decode_text(const char *text, ferry_descriptor_t **desc_p)
{
    return ferry_descriptor_decode(text, strlen(text), desc_p);
}

static char *xstrdup(const char *text)
{
    char *copy = strdup(text);
    cr_assert_not_null(copy);
    return copy;
}

static void add_transports(ferry_descriptor_t *desc, const char *const *names,
                           const char *const *endpoints, size_t count)
{
    desc->transports = calloc(count, sizeof(*desc->transports));
    cr_assert_not_null(desc->transports);
    desc->n_transports = count;
    for (size_t t = 0; t < count; t++) {
        desc->transports[t].name = xstrdup(names[t]);
        desc->transports[t].endpoint = xstrdup(endpoints[t]);
    }
}

/* Descriptor with adjacent buffers, one far away and one ending at 2^64 - 1. */
static ferry_descriptor_t *make_find_desc(void)
{
    static const uint64_t addrs[] = {0x2000, 0x1000, 0x10000, UINT64_MAX - 0xffff};
    static const uint64_t lengths[] = {0x1000, 0x1000, 0x100, 0xffff};
    ferry_descriptor_t *desc = ferry_descriptor_new();
    cr_assert_not_null(desc);
    desc->name = xstrdup("find");
    desc->buffers = calloc(4, sizeof(*desc->buffers));
    desc->n_buffers = 4;
    for (size_t i = 0; i < 4; i++) {
        desc->buffers[i].addr = addrs[i];
        desc->buffers[i].length = lengths[i];
        desc->buffers[i].location = xstrdup("cpu");
        desc->buffers[i].access = FERRY_REG_REMOTE;
    }
    cr_assert_eq(ferry_descriptor_finish(desc), FERRY_OK);
    return desc;
}

/* ---------------- round trip ---------------- */

Test(descriptor, round_trip_several_transports_and_buffers)
{
    static const char *const names[] = {"tcp", "ucx", "local"};
    static const char *const endpoints[] = {"127.0.0.1:4567", "AAECAwQFBgcICQ==", ""};

    /* every byte a packed binary key could hold in a C string, plus UTF-8 */
    char packed[300];
    size_t n = 0;
    for (int c = 1; c < 128; c++)
        packed[n++] = (char)c;
    strcpy(packed + n, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"\\/");

    ferry_descriptor_t *desc = ferry_descriptor_new();
    cr_assert_not_null(desc);
    cr_assert_eq(desc->refs, 1);
    desc->name = xstrdup("segment \"one\"");
    desc->generation = 0xfedcba9876543210ull;
    desc->host_id = xstrdup("host-a");
    desc->rpc = xstrdup("10.0.0.1:7000");
    add_transports(desc, names, endpoints, 3);

    /* built out of order: finish() must sort; the last one ends as high as allowed */
    static const uint64_t addrs[] = {0x7f0000002000, 0x7f0000001000, 0x10, UINT64_MAX - 10};
    static const uint64_t lengths[] = {8192, 4096, 1, 10};
    static const unsigned access[] = {FERRY_REG_REMOTE_READ, FERRY_REG_REMOTE,
                                      FERRY_REG_REMOTE_WRITE, FERRY_REG_REMOTE};
    desc->buffers = calloc(4, sizeof(*desc->buffers));
    desc->n_buffers = 4;
    for (size_t i = 0; i < 4; i++) {
        ferry_desc_buffer_t *buffer = &desc->buffers[i];
        buffer->addr = addrs[i];
        buffer->length = lengths[i];
        buffer->location = xstrdup(i == 0 ? "cuda:1" : "cpu");
        buffer->access = access[i];
        buffer->keys = calloc(3, sizeof(char *));
        buffer->keys[0] = xstrdup("");
        if (i != 2)
            buffer->keys[1] = xstrdup(i == 1 ? packed : "ucx-key");
        /* keys[2] stays NULL: "local" needs no key */
    }
    cr_assert_eq(ferry_descriptor_finish(desc), FERRY_OK);
    cr_assert_eq(desc->buffers[0].addr, 0x10);
    cr_assert_eq(desc->buffers[1].addr, 0x7f0000001000);

    char *json = NULL;
    cr_assert_eq(ferry_descriptor_encode(desc, &json), FERRY_OK);
    cr_assert_not_null(json);
    cr_assert_null(strchr(json, '\n'), "encode must be compact: %s", json);

    ferry_descriptor_t *back = NULL;
    cr_assert_eq(decode_text(json, &back), FERRY_OK, "%s", json);
    cr_assert_eq(back->refs, 1);
    cr_assert_str_eq(back->name, desc->name);
    cr_assert_eq(back->generation, desc->generation);
    cr_assert_str_eq(back->host_id, "host-a");
    cr_assert_str_eq(back->rpc, "10.0.0.1:7000");
    cr_assert_eq(back->n_transports, 3);
    for (size_t t = 0; t < 3; t++) {
        cr_assert_str_eq(back->transports[t].name, names[t], "transport order kept");
        cr_assert_str_eq(back->transports[t].endpoint, endpoints[t]);
    }
    cr_assert_eq(back->n_buffers, 4);
    for (size_t i = 0; i < 4; i++) {
        const ferry_desc_buffer_t *a = &desc->buffers[i], *b = &back->buffers[i];
        cr_assert_eq(b->addr, a->addr);
        cr_assert_eq(b->length, a->length);
        cr_assert_str_eq(b->location, a->location);
        cr_assert_eq(b->access, a->access);
        for (size_t t = 0; t < 3; t++) {
            if (a->keys[t] == NULL)
                cr_assert_null(b->keys[t], "buffer %zu transport %zu", i, t);
            else
                cr_assert_str_eq(b->keys[t], a->keys[t], "buffer %zu transport %zu", i, t);
        }
    }
    cr_assert_str_eq(back->buffers[1].keys[1], packed, "sorted: 0x10, then the packed-key buffer");

    char *again = NULL;
    cr_assert_eq(ferry_descriptor_encode(back, &again), FERRY_OK);
    cr_assert_str_eq(again, json, "encode(decode(x)) must be x");

    free(again);
    free(json);
    ferry_descriptor_unref(back);
    ferry_descriptor_unref(desc);
}

Test(descriptor, canonical_document_round_trips_byte_for_byte)
{
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(decode_text(VALID_DOC, &desc), FERRY_OK);
    cr_assert_eq(ferry_descriptor_transport_index(desc, "tcp"), 0);
    cr_assert_eq(ferry_descriptor_transport_index(desc, "ucx"), 1);
    cr_assert_eq(ferry_descriptor_transport_index(desc, "shm"), -1);
    cr_assert_eq(ferry_descriptor_transport_index(desc, NULL), -1);
    cr_assert_null(desc->buffers[1].keys[0]);
    cr_assert_eq(desc->buffers[1].access, FERRY_REG_REMOTE_READ);

    char *json = NULL;
    cr_assert_eq(ferry_descriptor_encode(desc, &json), FERRY_OK);
    cr_assert_str_eq(json, VALID_DOC);
    free(json);
    ferry_descriptor_unref(desc);
}

Test(descriptor, decode_sorts_buffers_and_ignores_unknown_fields)
{
    const char *text =
        "{\"version\":1,\"name\":\"s\",\"generation\":\"0xABCDEF\",\"host\":\"\",\"rpc\":\"\","
        "\"future\":{\"x\":[1,2.5,null]},\"transports\":{},"
        "\"buffers\":[{\"addr\":\"0x3000\",\"length\":\"0010\",\"location\":\"\","
        "\"access\":\"w\",\"keys\":{},\"hint\":7},"
        "{\"addr\":\"0x00001000\",\"length\":\"1\",\"location\":\"cpu\",\"access\":\"rw\","
        "\"keys\":{}}]}";
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(decode_text(text, &desc), FERRY_OK);
    cr_assert_eq(desc->generation, 0xabcdef);
    cr_assert_eq(desc->n_transports, 0);
    cr_assert_eq(desc->n_buffers, 2);
    cr_assert_eq(desc->buffers[0].addr, 0x1000);
    cr_assert_eq(desc->buffers[1].addr, 0x3000);
    cr_assert_eq(desc->buffers[1].length, 10);
    ferry_descriptor_unref(desc);
}

Test(descriptor, refcount_keeps_descriptor_alive)
{
    ferry_descriptor_t *desc = ferry_descriptor_new();
    cr_assert_not_null(desc);
    cr_assert_eq(desc->n_buffers, 0);
    cr_assert_null(desc->name);
    cr_assert_eq(ferry_descriptor_ref(desc), desc);
    cr_assert_eq(desc->refs, 2);
    ferry_descriptor_unref(desc);
    cr_assert_eq(desc->refs, 1);
    desc->name = xstrdup("still here");
    ferry_descriptor_unref(desc);
    ferry_descriptor_unref(NULL);
    cr_assert_null(ferry_descriptor_ref(NULL));
}

Test(descriptor, encode_rejects_what_decode_would_refuse)
{
    static const char *const names[] = {"tcp", "tcp"};
    static const char *const endpoints[] = {"a", "b"};
    char *json = (char *)"untouched";

    ferry_descriptor_t *desc = ferry_descriptor_new();
    cr_assert_eq(ferry_descriptor_encode(desc, &json), FERRY_ERR_INVALID_PARAM, "no name");
    cr_assert_null(json);
    desc->name = xstrdup("dup");
    add_transports(desc, names, endpoints, 2);
    cr_assert_eq(ferry_descriptor_encode(desc, &json), FERRY_ERR_INVALID_PARAM,
                 "duplicate transport names");
    ferry_descriptor_unref(desc);

    desc = ferry_descriptor_new();
    desc->name = xstrdup("bad\xff utf8");
    cr_assert_eq(ferry_descriptor_encode(desc, &json), FERRY_ERR_INVALID_PARAM);
    ferry_descriptor_unref(desc);

    cr_assert_eq(ferry_descriptor_encode(NULL, &json), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_descriptor_decode(NULL, 0, &desc), FERRY_ERR_INVALID_PARAM);
    cr_assert_eq(ferry_descriptor_decode("{}", 2, NULL), FERRY_ERR_INVALID_PARAM);
}

Test(descriptor, encode_leaves_out_buffers_without_remote_access)
{
    ferry_descriptor_t *desc = make_find_desc();
    desc->buffers[1].access = 0;
    char *json = NULL;
    cr_assert_eq(ferry_descriptor_encode(desc, &json), FERRY_OK);
    ferry_descriptor_t *back = NULL;
    cr_assert_eq(decode_text(json, &back), FERRY_OK);
    cr_assert_eq(back->n_buffers, 3);
    cr_assert_null(ferry_descriptor_find(back, desc->buffers[1].addr, 1));
    free(json);
    ferry_descriptor_unref(back);
    ferry_descriptor_unref(desc);
}

/* ---------------- malformed documents ---------------- */

typedef struct bad_case {
    const char *what;
    const char *json;
    const char *log; /* the log line must contain this */
} bad_case_t;

/* VALID_DOC pieces, so each case changes one thing */
#define HEAD                                                                                 \
    "{\"version\":1,\"name\":\"seg\",\"generation\":\"0x1\",\"host\":\"h\",\"rpc\":\"r:1\","
#define TRANSPORTS "\"transports\":{\"tcp\":\"e\"},"
#define BUF(addr, len) "{\"addr\":\"" addr "\",\"length\":\"" len "\",\"location\":\"cpu\"," \
                       "\"access\":\"rw\",\"keys\":{\"tcp\":\"\"}}"
#define DOC_BUFS(bufs) HEAD TRANSPORTS "\"buffers\":[" bufs "]}"
#define DOC_TOP(before_buffers) HEAD before_buffers "\"buffers\":[]}"
#define DOC_BUF_FIELDS(fields) DOC_BUFS("{" fields "}")
#define AL "\"addr\":\"0x1000\",\"length\":\"16\","
#define LOC "\"location\":\"cpu\","
#define ACC "\"access\":\"rw\","
#define KEYS "\"keys\":{}"

static const bad_case_t bad_cases[] = {
    {"array document", "[]", "not a JSON object"},
    {"scalar document", "42", "not valid JSON"},
    {"empty document", "", "not valid JSON"},
    {"trailing garbage", DOC_BUFS("") "x", "not valid JSON"},
    {"duplicate member", "{\"version\":1,\"version\":1}", "duplicate"},
    {"NUL in a string", "{\"version\":1,\"name\":\"a\\u0000b\"}", "not valid JSON"},

    {"version missing", "{\"name\":\"seg\"}", "version: missing"},
    {"version 2", "{\"version\":2}", "version: 2 is not supported"},
    {"version 0", "{\"version\":0}", "version: 0 is not supported"},
    {"version string", "{\"version\":\"1\"}", "version: must be an integer"},
    {"version real", "{\"version\":1.0}", "version: must be an integer"},
    {"version huge", "{\"version\":99999999999999999999999}", "not valid JSON"},

    {"name missing", "{\"version\":1}", "name: missing"},
    {"name number", "{\"version\":1,\"name\":5}", "name: must be a string"},
    {"name null", "{\"version\":1,\"name\":null}", "name: must be a string"},
    {"name empty", "{\"version\":1,\"name\":\"\"}", "name: must not be empty"},

    {"generation missing", "{\"version\":1,\"name\":\"s\"}", "generation: missing"},
    {"generation number", "{\"version\":1,\"name\":\"s\",\"generation\":5}",
     "generation: must be a string"},
    {"generation decimal", "{\"version\":1,\"name\":\"s\",\"generation\":\"1234\"}",
     "generation: must be a \"0x\""},
    {"generation empty", "{\"version\":1,\"name\":\"s\",\"generation\":\"\"}",
     "generation: must be a \"0x\""},
    {"generation no digits", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x\"}",
     "generation: must be a \"0x\"-prefixed hex string (no digits)"},
    {"generation negative", "{\"version\":1,\"name\":\"s\",\"generation\":\"-0x1\"}",
     "generation: must be"},
    {"generation sign after 0x", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x-1\"}",
     "generation: must be"},
    {"generation double 0x", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x0x1\"}",
     "generation: must be"},
    {"generation upper X", "{\"version\":1,\"name\":\"s\",\"generation\":\"0X1\"}",
     "generation: must be"},
    {"generation bad digit", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1g\"}",
     "generation: must be"},
    {"generation leading blank", "{\"version\":1,\"name\":\"s\",\"generation\":\" 0x1\"}",
     "generation: must be"},
    {"generation trailing blank", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1 \"}",
     "generation: must be"},
    {"generation overflow",
     "{\"version\":1,\"name\":\"s\",\"generation\":\"0x10000000000000000\"}",
     "generation: does not fit in 64 bits"},

    {"host missing", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\"}", "host: missing"},
    {"host array", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":[]}",
     "host: must be a string"},
    {"rpc missing", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"h\"}",
     "rpc: missing"},
    {"rpc bool", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"h\","
                 "\"rpc\":true}", "rpc: must be a string"},

    {"transports missing", HEAD "\"buffers\":[]}", "transports: missing"},
    {"transports array", DOC_TOP("\"transports\":[],"), "transports: must be an object"},
    {"transport endpoint number", DOC_TOP("\"transports\":{\"tcp\":1},"),
     "transports.tcp: must be a string"},
    {"transport empty name", DOC_TOP("\"transports\":{\"\":\"e\"},"), "empty transport name"},
    {"transport duplicate", DOC_TOP("\"transports\":{\"tcp\":\"a\",\"tcp\":\"b\"},"),
     "duplicate"},

    {"buffers missing", HEAD TRANSPORTS "\"files\":[]}", "buffers: missing"},
    {"buffers object", HEAD TRANSPORTS "\"buffers\":{}}", "buffers: must be an array"},
    {"buffer not object", DOC_BUFS("[]"), "buffers[0]: must be an object"},
    {"files object", HEAD TRANSPORTS "\"buffers\":[],\"files\":{}}", "files: must be an array"},

    {"addr missing", DOC_BUF_FIELDS("\"length\":\"1\"," LOC ACC KEYS), "buffers[0].addr: missing"},
    {"addr number", DOC_BUF_FIELDS("\"addr\":4096,\"length\":\"1\"," LOC ACC KEYS),
     "buffers[0].addr: must be a string"},
    {"addr decimal", DOC_BUFS(BUF("4096", "1")), "buffers[0].addr: must be a \"0x\""},
    {"addr empty", DOC_BUFS(BUF("", "1")), "buffers[0].addr: must be"},
    {"addr overflow", DOC_BUFS(BUF("0x1ffffffffffffffff", "1")),
     "buffers[0].addr: does not fit in 64 bits"},
    {"length missing", DOC_BUF_FIELDS("\"addr\":\"0x1\"," LOC ACC KEYS),
     "buffers[0].length: missing"},
    {"length number", DOC_BUF_FIELDS("\"addr\":\"0x1\",\"length\":4096," LOC ACC KEYS),
     "buffers[0].length: must be a string"},
    {"length hex", DOC_BUFS(BUF("0x1000", "0x10")), "buffers[0].length: must be a decimal"},
    {"length empty", DOC_BUFS(BUF("0x1000", "")), "buffers[0].length: must be a decimal"},
    {"length negative", DOC_BUFS(BUF("0x1000", "-1")), "buffers[0].length: must be a decimal"},
    {"length plus", DOC_BUFS(BUF("0x1000", "+1")), "buffers[0].length: must be a decimal"},
    {"length blank", DOC_BUFS(BUF("0x1000", " 1")), "buffers[0].length: must be a decimal"},
    {"length zero", DOC_BUFS(BUF("0x1000", "0")), "buffers[0].length: must not be 0"},
    {"length overflow", DOC_BUFS(BUF("0x1000", "18446744073709551616")),
     "buffers[0].length: does not fit in 64 bits"},
    {"addr + length overflow", DOC_BUFS(BUF("0xffffffffffffff00", "256")),
     "buffers[0].length: addr + length does not fit"},
    {"location missing", DOC_BUF_FIELDS(AL ACC KEYS), "buffers[0].location: missing"},
    {"location number", DOC_BUF_FIELDS(AL "\"location\":0," ACC KEYS),
     "buffers[0].location: must be a string"},
    {"access missing", DOC_BUF_FIELDS(AL LOC KEYS), "buffers[0].access: missing"},
    {"access empty", DOC_BUF_FIELDS(AL LOC "\"access\":\"\"," KEYS),
     "buffers[0].access: must be \"r\", \"w\" or \"rw\""},
    {"access wr", DOC_BUF_FIELDS(AL LOC "\"access\":\"wr\"," KEYS), "buffers[0].access: must"},
    {"access rwx", DOC_BUF_FIELDS(AL LOC "\"access\":\"rwx\"," KEYS), "buffers[0].access: must"},
    {"access number", DOC_BUF_FIELDS(AL LOC "\"access\":3," KEYS),
     "buffers[0].access: must be a string"},
    {"keys missing", DOC_BUF_FIELDS(AL LOC "\"access\":\"r\""), "buffers[0].keys: missing"},
    {"keys array", DOC_BUF_FIELDS(AL LOC ACC "\"keys\":[]"), "buffers[0].keys: must be an object"},
    {"key number", DOC_BUF_FIELDS(AL LOC ACC "\"keys\":{\"tcp\":1}"),
     "buffers[0].keys.tcp: must be a string"},
    {"key unknown transport", DOC_BUF_FIELDS(AL LOC ACC "\"keys\":{\"ucx\":\"k\"}"),
     "buffers[0].keys.ucx: names no transport"},

    {"duplicate buffers", DOC_BUFS(BUF("0x1000", "16") "," BUF("0x1000", "16")),
     "duplicate buffer at 0x1000"},
    {"overlapping buffers", DOC_BUFS(BUF("0x1000", "16") "," BUF("0x100f", "16")),
     "overlaps"},
    {"contained buffer", DOC_BUFS(BUF("0x1000", "4096") "," BUF("0x1800", "16")), "overlaps"},
    {"second buffer bad", DOC_BUFS(BUF("0x1000", "16") "," BUF("0x2000", "0")),
     "buffers[1].length: must not be 0"},
};

/* Decode with fd 2 captured; returns what was logged (malloc-ed). */
static char *decode_logged(const char *json, size_t length, ferry_status_t *status_p)
{
    FILE *capture = tmpfile();
    cr_assert_not_null(capture);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(capture), STDERR_FILENO);

    ferry_descriptor_t *desc = NULL;
    *status_p = ferry_descriptor_decode(json, length, &desc);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    if (*status_p == FERRY_OK)
        ferry_descriptor_unref(desc);
    else
        cr_assert_null(desc);

    long size = ftell(capture);
    cr_assert_geq(size, 0);
    char *log = calloc(1, (size_t)size + 1);
    rewind(capture);
    cr_assert_eq(fread(log, 1, (size_t)size, capture), (size_t)size);
    fclose(capture);
    return log;
}

static void expect_refused(const char *what, const char *json, size_t length, const char *log)
{
    ferry_status_t status;
    char *logged = decode_logged(json, length, &status);
    cr_expect_eq(status, FERRY_ERR_DECODE, "%s: got %d (%s)", what, status,
                 ferry_status_string(status));
    const char *newline = strchr(logged, '\n');
    cr_expect(newline != NULL && newline[1] == '\0', "%s: want exactly one log line, got: %s",
              what, logged);
    cr_expect_not_null(strstr(logged, log), "%s: log should mention \"%s\", got: %s", what, log,
                       logged);
    free(logged);
}

Test(descriptor, malformed_documents_are_refused_and_logged_once)
{
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(bad_cases); i++)
        expect_refused(bad_cases[i].what, bad_cases[i].json, strlen(bad_cases[i].json),
                       bad_cases[i].log);
}

Test(descriptor, the_pieces_of_the_malformed_table_are_valid)
{
    /* so that each bad case fails for its own reason, not a typo in the scaffold */
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(decode_text(DOC_BUFS(BUF("0x1000", "16") "," BUF("0x1010", "16")), &desc),
                 FERRY_OK);
    cr_assert_eq(desc->n_buffers, 2);
    ferry_descriptor_unref(desc);
    cr_assert_eq(decode_text(DOC_BUF_FIELDS(AL LOC ACC KEYS), &desc), FERRY_OK);
    ferry_descriptor_unref(desc);
    cr_assert_eq(decode_text(DOC_TOP(TRANSPORTS), &desc), FERRY_OK);
    ferry_descriptor_unref(desc);
    cr_assert_eq(decode_text(DOC_BUFS(BUF("0xffffffffffffff00", "255")), &desc), FERRY_OK,
                 "a buffer may end at 2^64 - 1");
    ferry_descriptor_unref(desc);
    cr_assert_eq(decode_text(DOC_BUFS(BUF("0xFFFFFFFFFFFFFFFF", "18446744073709551615")
                                      "," BUF("0x0", "1")), &desc), FERRY_ERR_DECODE);
}

/* A document whose `field` string is one byte over the limit. */
static char *long_string_doc(const char *prefix, const char *suffix)
{
    size_t fill = ((size_t)64 << 10) + 1;
    size_t total = strlen(prefix) + fill + strlen(suffix) + 1;
    char *doc = malloc(total);
    cr_assert_not_null(doc);
    strcpy(doc, prefix);
    memset(doc + strlen(prefix), 'a', fill);
    strcpy(doc + strlen(prefix) + fill, suffix);
    return doc;
}

Test(descriptor, strings_over_64k_are_refused)
{
    static const struct {
        const char *what, *prefix, *suffix, *log;
    } cases[] = {
        {"name", "{\"version\":1,\"name\":\"", "\"}", "name: longer than 65536 bytes"},
        {"host", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"", "\"}",
         "host: longer than"},
        {"rpc", "{\"version\":1,\"name\":\"s\",\"generation\":\"0x1\",\"host\":\"\",\"rpc\":\"",
         "\"}", "rpc: longer than"},
        {"endpoint", HEAD "\"transports\":{\"tcp\":\"", "\"},\"buffers\":[]}",
         "transports.tcp: longer than"},
        {"transport name", HEAD "\"transports\":{\"", "\":\"e\"},\"buffers\":[]}",
         "transport name longer than"},
        {"location", HEAD TRANSPORTS "\"buffers\":[{" AL "\"location\":\"",
         "\"," ACC KEYS "}]}", "buffers[0].location: longer than"},
        {"key", HEAD TRANSPORTS "\"buffers\":[{" AL LOC ACC "\"keys\":{\"tcp\":\"", "\"}}]}",
         "buffers[0].keys.tcp: longer than"},
    };
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(cases); i++) {
        char *doc = long_string_doc(cases[i].prefix, cases[i].suffix);
        expect_refused(cases[i].what, doc, strlen(doc), cases[i].log);
        free(doc);
    }
}

Test(descriptor, string_at_64k_is_accepted)
{
    size_t fill = (size_t)64 << 10;
    const char *prefix = "{\"version\":1,\"name\":\"";
    const char *suffix = "\",\"generation\":\"0x1\",\"host\":\"\",\"rpc\":\"\",\"transports\":{},"
                         "\"buffers\":[]}";
    char *doc = malloc(strlen(prefix) + fill + strlen(suffix) + 1);
    strcpy(doc, prefix);
    memset(doc + strlen(prefix), 'n', fill);
    strcpy(doc + strlen(prefix) + fill, suffix);
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(decode_text(doc, &desc), FERRY_OK);
    cr_assert_eq(strlen(desc->name), fill);
    ferry_descriptor_unref(desc);
    free(doc);
}

Test(descriptor, too_many_transports_refused)
{
    char doc[4096];
    int n = snprintf(doc, sizeof(doc), "%s\"transports\":{", HEAD);
    for (int t = 0; t < 65; t++)
        n += snprintf(doc + n, sizeof(doc) - (size_t)n, "%s\"t%d\":\"e\"", t ? "," : "", t);
    snprintf(doc + n, sizeof(doc) - (size_t)n, "},\"buffers\":[]}");
    expect_refused("65 transports", doc, strlen(doc), "transports: more than 64 transports");

    /* 64 is the limit, not past it */
    char *cut = strstr(doc, ",\"t64\"");
    cr_assert_not_null(cut);
    strcpy(cut, "},\"buffers\":[]}");
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(decode_text(doc, &desc), FERRY_OK);
    cr_assert_eq(desc->n_transports, 64);
    cr_assert_eq(ferry_descriptor_transport_index(desc, "t63"), 63);
    ferry_descriptor_unref(desc);
}

Test(descriptor, too_many_buffers_refused)
{
    /* the count is checked before any element, so cheap elements suffice */
    size_t count = 1000001;
    const char *head = HEAD TRANSPORTS "\"buffers\":[";
    size_t length = strlen(head) + 2 * count + 2;
    char *doc = malloc(length + 1);
    cr_assert_not_null(doc);
    strcpy(doc, head);
    char *p = doc + strlen(head);
    for (size_t i = 0; i < count; i++) {
        *p++ = '0';
        *p++ = i + 1 < count ? ',' : ']';
    }
    strcpy(p, "}");
    expect_refused("1000001 buffers", doc, strlen(doc), "buffers: more than 1000000 buffers");
    free(doc);
}

Test(descriptor, documents_over_64m_refused)
{
    size_t limit = (size_t)64 << 20;
    const char *valid = VALID_DOC;
    char *doc = malloc(limit + 1);
    cr_assert_not_null(doc);
    /* valid JSON padded with blanks: only the size is wrong */
    memset(doc, ' ', limit + 1);
    memcpy(doc, valid, strlen(valid));
    expect_refused("64 MiB + 1", doc, limit + 1, "more than 67108864");

    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(ferry_descriptor_decode(doc, limit, &desc), FERRY_OK, "exactly 64 MiB is fine");
    ferry_descriptor_unref(desc);
    free(doc);
}

/* ---------------- truncated, unterminated, garbage ---------------- */

Test(descriptor, every_truncation_is_refused)
{
    const char *valid = VALID_DOC;
    size_t length = strlen(valid);
    ferry_log_level_current = -1; /* a thousand expected errors are noise */
    for (size_t cut = 0; cut < length; cut++) {
        /* a heap copy of exactly `cut` bytes: a read past it is an ASan error */
        char *copy = malloc(cut ? cut : 1);
        memcpy(copy, valid, cut);
        ferry_descriptor_t *desc = NULL;
        cr_expect_eq(ferry_descriptor_decode(copy, cut, &desc), FERRY_ERR_DECODE,
                     "prefix of %zu bytes", cut);
        cr_expect_null(desc);
        free(copy);
    }
}

Test(descriptor, input_need_not_be_nul_terminated)
{
    const char *valid = VALID_DOC;
    size_t length = strlen(valid);
    char *exact = malloc(length);
    memcpy(exact, valid, length);
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(ferry_descriptor_decode(exact, length, &desc), FERRY_OK);
    cr_assert_eq(desc->n_buffers, 2);
    ferry_descriptor_unref(desc);
    free(exact);

    /* bytes after `length` are not part of the document */
    char *followed = malloc(length + 8);
    memcpy(followed, valid, length);
    memcpy(followed + length, "garbage!", 8);
    cr_assert_eq(ferry_descriptor_decode(followed, length, &desc), FERRY_OK);
    ferry_descriptor_unref(desc);

    /* and a NUL inside the length is not the end of it */
    followed[length / 2] = '\0';
    expect_refused("embedded NUL", followed, length, "not valid JSON");
    free(followed);
}

Test(descriptor, deep_nesting_is_refused_without_recursing_away)
{
    size_t depth = 200000;
    char *doc = malloc(depth + 16);
    cr_assert_not_null(doc);
    strcpy(doc, "{\"version\":");
    memset(doc + strlen(doc), '[', depth);
    expect_refused("deep nesting", doc, strlen("{\"version\":") + depth, "not valid JSON");
    free(doc);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void)
{
    return test_rng_next(&rng_state);
}

/* Whatever decodes must satisfy what the rest of the engine relies on. */
static void check_decoded(const ferry_descriptor_t *desc)
{
    cr_assert_neq(desc->name[0], '\0');
    for (size_t i = 0; i < desc->n_buffers; i++) {
        const ferry_desc_buffer_t *b = &desc->buffers[i];
        cr_assert_neq(b->length, 0);
        cr_assert_leq(b->length, UINT64_MAX - b->addr);
        cr_assert_neq(b->access & FERRY_REG_REMOTE, 0);
        if (i > 0)
            cr_assert_leq(desc->buffers[i - 1].addr + desc->buffers[i - 1].length, b->addr);
        cr_assert_eq(ferry_descriptor_find(desc, b->addr + b->length - 1, 1), b);
    }
    char *json = NULL;
    cr_assert_eq(ferry_descriptor_encode(desc, &json), FERRY_OK);
    ferry_descriptor_t *again = NULL;
    cr_assert_eq(decode_text(json, &again), FERRY_OK, "%s", json);
    char *json2 = NULL;
    cr_assert_eq(ferry_descriptor_encode(again, &json2), FERRY_OK);
    cr_assert_str_eq(json2, json);
    free(json2);
    free(json);
    ferry_descriptor_unref(again);
}

Test(descriptor, random_mutations_never_crash)
{
    static const char interesting[] = "{}[]\",:0x-1\\ \x00\xff\x80\xc3tfn9";
    const char *valid = VALID_DOC;
    size_t valid_length = strlen(valid);
    size_t ok = 0, refused = 0;
    ferry_log_level_current = -1;

    for (int round = 0; round < 4000; round++) {
        size_t capacity = valid_length + 64;
        char *doc = malloc(capacity);
        size_t length;
        if (round % 10 == 9) {
            /* pure garbage */
            length = rng() % capacity;
            for (size_t i = 0; i < length; i++)
                doc[i] = (char)rng();
        } else {
            memcpy(doc, valid, valid_length);
            length = valid_length;
            int edits = 1 + (int)(rng() % 4);
            for (int e = 0; e < edits && length > 0; e++) {
                size_t at = rng() % length;
                char c = rng() % 2 ? (char)rng()
                                   : interesting[rng() % (sizeof(interesting) - 1)];
                switch (rng() % 4) {
                case 0: doc[at] = c; break;                   /* replace */
                case 1:                                       /* delete */
                    memmove(doc + at, doc + at + 1, length - at - 1);
                    length--;
                    break;
                case 2:                                       /* insert */
                    if (length < capacity) {
                        memmove(doc + at + 1, doc + at, length - at);
                        doc[at] = c;
                        length++;
                    }
                    break;
                default: doc[at] = (char)(doc[at] ^ (1 << (rng() % 8))); break; /* bit flip */
                }
            }
        }
        char *exact = malloc(length ? length : 1); /* exact size so ASan sees over-reads */
        memcpy(exact, doc, length);
        free(doc);

        ferry_descriptor_t *desc = NULL;
        ferry_status_t status = ferry_descriptor_decode(exact, length, &desc);
        cr_assert(status == FERRY_OK || status == FERRY_ERR_DECODE,
                  "round %d: status %d for %.*s", round, status, (int)length, exact);
        if (status == FERRY_OK) {
            check_decoded(desc);
            ferry_descriptor_unref(desc);
            ok++;
        } else {
            cr_assert_null(desc);
            refused++;
        }
        free(exact);
    }
    cr_log_info("random mutations: %zu decoded, %zu refused", ok, refused);
    cr_expect_gt(ok, 0, "some mutations (e.g. inside strings) must still decode");
    cr_expect_gt(refused, 0);
}

/* ---------------- finish and find ---------------- */

Test(descriptor, finish_refuses_overlap_and_duplicates)
{
    static const struct {
        uint64_t addr[2], length[2]; /* two buffers */
        ferry_status_t status;
    } cases[] = {
        {{0x2000, 0x1000}, {0x1000, 0x1000}, FERRY_OK},           /* adjacent */
        {{0x1000, 0x1000}, {0x1000, 0x1000}, FERRY_ERR_DECODE},   /* duplicate */
        {{0x1000, 0x1000}, {0x1000, 0x10}, FERRY_ERR_DECODE},     /* same start */
        {{0x1fff, 0x1000}, {0x10, 0x1000}, FERRY_ERR_DECODE},     /* one byte */
        {{0x1000, 0x2000}, {0x10, 0x10}, FERRY_OK},               /* gap */
        {{0x1000, 0x2000}, {0x10, 0}, FERRY_ERR_DECODE},          /* empty */
        {{UINT64_MAX, 0x0}, {1, 1}, FERRY_ERR_DECODE},            /* past 2^64 - 1 */
    };
    ferry_log_level_current = -1;
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(cases); i++) {
        ferry_descriptor_t *desc = ferry_descriptor_new();
        desc->buffers = calloc(2, sizeof(*desc->buffers));
        desc->n_buffers = 2;
        for (size_t b = 0; b < 2; b++) {
            desc->buffers[b].addr = cases[i].addr[b];
            desc->buffers[b].length = cases[i].length[b];
            desc->buffers[b].access = FERRY_REG_REMOTE;
        }
        cr_expect_eq(ferry_descriptor_finish(desc), cases[i].status, "case %zu", i);
        if (cases[i].status == FERRY_OK)
            cr_expect_lt(desc->buffers[0].addr, desc->buffers[1].addr, "sorted, case %zu", i);
        ferry_descriptor_unref(desc);
    }
}

Test(descriptor, find_at_boundaries)
{
    ferry_descriptor_t *desc = make_find_desc();
    const ferry_desc_buffer_t *first = &desc->buffers[0], *second = &desc->buffers[1];
    const ferry_desc_buffer_t *far = &desc->buffers[2], *top = &desc->buffers[3];
    cr_assert_eq(first->addr, 0x1000);
    cr_assert_eq(second->addr, 0x2000);

    cr_expect_eq(ferry_descriptor_find(desc, 0x1000, 1), first, "first byte");
    cr_expect_eq(ferry_descriptor_find(desc, 0x1fff, 1), first, "last byte");
    cr_expect_eq(ferry_descriptor_find(desc, 0x1000, 0x1000), first, "whole buffer");
    cr_expect_eq(ferry_descriptor_find(desc, 0x2000, 1), second, "first byte of the next");
    cr_expect_eq(ferry_descriptor_find(desc, 0x2fff, 1), second, "last byte");
    cr_expect_null(ferry_descriptor_find(desc, 0x3000, 1), "one past the end");
    cr_expect_null(ferry_descriptor_find(desc, 0x2001, 0x1000), "runs one past the end");
    cr_expect_null(ferry_descriptor_find(desc, 0x1fff, 2), "spans two adjacent buffers");
    cr_expect_null(ferry_descriptor_find(desc, 0x1000, 0x2000), "covers two adjacent buffers");
    cr_expect_null(ferry_descriptor_find(desc, 0xfff, 1), "just before the first");
    cr_expect_null(ferry_descriptor_find(desc, 0, 1), "address 0");
    cr_expect_null(ferry_descriptor_find(desc, 0x1000, 0), "length 0 never matches");
    cr_expect_null(ferry_descriptor_find(desc, 0x1800, UINT64_MAX), "length overflows");
    cr_expect_null(ferry_descriptor_find(desc, 0x5000, 1), "in a gap");

    cr_expect_eq(ferry_descriptor_find(desc, 0x100ff, 1), far);
    cr_expect_null(ferry_descriptor_find(desc, 0x10100, 1));

    cr_expect_eq(ferry_descriptor_find(desc, UINT64_MAX - 1, 1), top, "last byte of memory");
    cr_expect_eq(ferry_descriptor_find(desc, UINT64_MAX - 0xffff, 0xffff), top);
    cr_expect_null(ferry_descriptor_find(desc, UINT64_MAX - 1, 2), "wraps past 2^64 - 1");
    cr_expect_null(ferry_descriptor_find(desc, UINT64_MAX, 1));
    cr_expect_null(ferry_descriptor_find(desc, UINT64_MAX, UINT64_MAX));

    cr_expect_null(ferry_descriptor_find(NULL, 0x1000, 1));
    ferry_descriptor_t *empty = ferry_descriptor_new();
    cr_expect_null(ferry_descriptor_find(empty, 0x1000, 1));
    ferry_descriptor_unref(empty);
    ferry_descriptor_unref(desc);
}

Test(descriptor, find_agrees_with_a_linear_scan)
{
    /* many buffers with gaps: the binary search must match a plain scan */
    ferry_descriptor_t *desc = ferry_descriptor_new();
    size_t count = 257;
    desc->buffers = calloc(count, sizeof(*desc->buffers));
    desc->n_buffers = count;
    for (size_t i = 0; i < count; i++) {
        desc->buffers[count - 1 - i].addr = 0x10000 + i * 0x100 + (i % 3 == 0 ? 0 : 0x10);
        desc->buffers[count - 1 - i].length = i % 3 == 0 ? 0x100 : 0x80;
        desc->buffers[count - 1 - i].access = FERRY_REG_REMOTE;
    }
    cr_assert_eq(ferry_descriptor_finish(desc), FERRY_OK);
    for (uint64_t addr = 0xff00; addr < 0x10000 + count * 0x100 + 0x100; addr += 7) {
        for (uint64_t length = 1; length < 0x120; length += 0x3f) {
            const ferry_desc_buffer_t *want = NULL;
            for (size_t i = 0; i < count; i++) {
                const ferry_desc_buffer_t *b = &desc->buffers[i];
                if (addr >= b->addr && addr + length <= b->addr + b->length)
                    want = b;
            }
            cr_assert_eq(ferry_descriptor_find(desc, addr, length), want,
                         "addr 0x%" PRIx64 " length %" PRIu64, addr, length);
        }
    }
    ferry_descriptor_unref(desc);
}
