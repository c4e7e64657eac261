/*
 * The etcd store's reading of etcd's JSON gateway.  Each input is used as:
 *   - the body of a call's answer (ferry_etcd_reply_parse, as ferry_etcd_call
 *     uses it, with HTTP 200 or an error status), then, when accepted,
 *     as a range reply (ferry_etcd_range_value, what a fetch returns) and for
 *     the lease fields the keeper reads;
 *   - the bytes of a watch stream (etcd_watch.c's curl callback, on_data,
 *     and what it does with each line: event keys, the sorted view of the
 *     prefix, change reports).  The callback is static, so this file
 *     includes etcd_watch.c and drives it on a store that has no connection.
 *
 * Checked: an accepted reply is an object; a value decodes from base64 to
 * bytes that encode back to the same text; error messages stay terminated;
 * the watch's view stays sorted with unique names and reports only names.
 */
#include "fuzz_common.h"

#include "../../src/metadata/etcd/etcd_watch.c"

/* keys.c's background worker takes this from libferry; no worker runs here. */
void ferry_deadline_after_ms(struct timespec *deadline_p, int clock, unsigned timeout_ms)
{
    (void)deadline_p;
    (void)clock;
    (void)timeout_ms;
    FUZZ_CHECK(!"a worker thread in the harness");
}

static etcd_store_t store;
static size_t changes;

static void segment_changed(void *engine, const char *name)
{
    (void)engine;
    FUZZ_CHECK(name != NULL && name[0] != '\0');
    changes++;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    FUZZ_CHECK(ferry_md_keys_init(&store.keys, "ferry/segments/", "") == FERRY_OK);
    pthread_mutex_init(&store.own_lock, NULL);
    pthread_mutex_init(&store.auth_lock, NULL);
    store.own_name = strdup("own");
    store.uri = strdup("etcd://fuzz");
    store.svc.segment_changed = segment_changed;
    return 0;
}

static void check_value(const json_t *reply)
{
    char *value;
    size_t length;
    ferry_status_t status = ferry_etcd_range_value(reply, &value, &length);
    FUZZ_CHECK(status == FERRY_OK || status == FERRY_ERR_SEGMENT_NOT_FOUND ||
               status == FERRY_ERR_DECODE);
    if (status != FERRY_OK)
        return;
    FUZZ_CHECK(value[length] == '\0');
    json_t *text = ferry_etcd_b64(value, length);
    FUZZ_CHECK(text != NULL);
    char *again;
    size_t again_length;
    FUZZ_CHECK(ferry_etcd_unb64(json_string_value(text), &again, &again_length) == FERRY_OK);
    FUZZ_CHECK(again_length == length && memcmp(again, value, length) == 0);
    free(again);
    json_decref(text);
    free(value);
}

static void check_reply(long http, const char *body, size_t length)
{
    json_t *reply = NULL;
    etcd_error_t error;
    memset(&error, 0, sizeof(error));
    ferry_status_t status = ferry_etcd_reply_parse(http, body, length, &reply, &error);
    if (status != FERRY_OK) {
        FUZZ_CHECK(status == FERRY_ERR_DECODE || status == FERRY_ERR_METADATA);
        FUZZ_CHECK(reply == NULL);
        FUZZ_CHECK(strnlen(error.message, sizeof(error.message)) < sizeof(error.message));
        return;
    }
    FUZZ_CHECK(http == 200 && json_is_object(reply));
    check_value(reply);
    /* the lease keeper's and the watch's integers */
    (void)ferry_etcd_int(reply, "ID");
    (void)ferry_etcd_int(reply, "TTL");
    (void)ferry_etcd_int(json_object_get(reply, "header"), "revision");
    json_decref(reply);
}

static void check_watch(const uint8_t *data, size_t size)
{
    /* the stream starts after a sync, which leaves an allocated view */
    store.seen = calloc(1, sizeof(*store.seen));
    FUZZ_CHECK(store.seen != NULL);
    store.seen_capacity = 1;
    store.synced = 1;
    stream_t stream = {.store = &store};
    size_t taken = on_data((char *)data, 1, size, &stream);
    if (taken == size)
        on_data((char *)"\n", 1, 1, &stream); /* the stream ended: the last line */
    for (size_t i = 0; i < store.n_seen; i++) {
        FUZZ_CHECK(store.seen[i].name != NULL && store.seen[i].mod_revision >= 0);
        FUZZ_CHECK(i == 0 || strcmp(store.seen[i - 1].name, store.seen[i].name) < 0);
    }
    free(stream.line);
    seen_free(store.seen, store.n_seen);
    store.seen = NULL;
    store.n_seen = store.seen_capacity = 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an answer (HTTP 200), or a refusal (401) when the body ends in a
     * blank, which JSON ignores: a captured reply is a seed as it is */
    char *body = fuzz_text(data, size);
    check_reply(size > 0 && data[size - 1] == ' ' ? 401 : 200, body, size);
    free(body);
    check_watch(data, size);
    return 0;
}
