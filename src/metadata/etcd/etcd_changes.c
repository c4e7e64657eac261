/*
 * The etcd store's change records (md_records.h): under a segment's key K,
 *
 *   K/changes/<16 hex digits: revision>   one record per revision
 *   K/changes/head                        "<hex generation> <hex newest>"
 *
 * all on the engine's lease, so they go with it.  A write is one
 * transaction: the records not written yet, the head, the descriptor when
 * it is a checkpoint (and, now and then, a delete of the records the
 * owner's log no longer reaches); so a reader never sees a head without the
 * records below it.  A restart is a
 * delete of K/changes/ before it.  A reader at revision v asks for one
 * range, K/changes/<v> to the end of K/changes/: the records above v and
 * the head ("head" sorts after every hex digit).
 *
 * The watch ignores these keys: a '/' after the segment's escaped name
 * makes them no segment key of the layout.
 */
#include "etcd.h"
#include "../md_records.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHANGES "/changes/"
#define FETCH_MAX FERRY_MD_RECORDS_FETCH_MAX

static char *record_key(const char *key, uint64_t revision)
{
    char suffix[sizeof(CHANGES) + 16];
    snprintf(suffix, sizeof(suffix), CHANGES "%016" PRIx64, revision);
    return ferry_md_strcat3(key, suffix, "");
}

static json_t *kv(const char *key, size_t key_length)
{
    return ferry_etcd_b64(key, key_length);
}

/* {"request_put": {...}} on our lease. */
static json_t *op_put(const char *key, const char *value, const char *lease)
{
    return json_pack("{s:{s:o, s:o, s:s}}", "request_put", "key", kv(key, strlen(key)), "value",
                     ferry_etcd_b64(value, strlen(value)), "lease", lease);
}

/* Delete [from, to); to NULL: every key under from. */
static json_t *delete_range(const char *from, const char *to)
{
    size_t end_length = 0;
    char *end = to ? strdup(to) : ferry_etcd_prefix_end(from, strlen(from), &end_length);
    if (end == NULL)
        return NULL;
    if (to)
        end_length = strlen(to);
    json_t *request = json_pack("{s:o, s:o}", "key", kv(from, strlen(from)), "range_end",
                                kv(end, end_length));
    free(end);
    return request;
}

ferry_status_t ferry_etcd_put_with_changes(etcd_store_t *store, const char *key,
                                           const char *descriptor,
                                           const ferry_md_records_batch_t *batch,
                                           etcd_error_t *error)
{
    char lease[32], head[FERRY_MD_HEAD_MAX];
    snprintf(lease, sizeof(lease), "%lld", (long long)store->lease);
    char *changes = ferry_md_strcat3(key, CHANGES, ""), *head_key = ferry_md_strcat3(key,
                                                                           CHANGES "head", "");
    json_t *reply = NULL, *ops = json_array();
    ferry_status_t status = changes && head_key && ops ? FERRY_OK : FERRY_ERR_NO_MEMORY;
    if (status == FERRY_OK && batch->restart) {
        status = ferry_etcd_call(store, "/v3/kv/deleterange", delete_range(changes, NULL),
                                 &reply, error);
        json_decref(reply);
        reply = NULL;
    }
    for (size_t i = 0; status == FERRY_OK && i < batch->n_records; i++) {
        char *record = record_key(key, batch->records[i].revision);
        if (record == NULL ||
            json_array_append_new(ops, op_put(record, batch->records[i].text, lease)) != 0)
            status = FERRY_ERR_NO_MEMORY;
        free(record);
    }
    ferry_md_head_format(head, batch->generation, batch->newest);
    if (status == FERRY_OK && (json_array_append_new(ops, op_put(head_key, head, lease)) != 0 ||
                               (descriptor != NULL &&
                                json_array_append_new(ops, op_put(key, descriptor, lease)) != 0)))
        status = FERRY_ERR_NO_MEMORY;
    if (status == FERRY_OK && batch->prune_below != 0) {
        /* below every record this transaction writes: no key twice */
        char *from = record_key(key, 0), *to = record_key(key, batch->prune_below);
        json_t *prune = from && to ? delete_range(from, to) : NULL;
        if (prune == NULL ||
            json_array_append_new(ops, json_pack("{s:o}", "request_delete_range", prune)) != 0)
            status = FERRY_ERR_NO_MEMORY;
        free(from);
        free(to);
    }
    if (status == FERRY_OK) {
        status = ferry_etcd_call(store, "/v3/kv/txn", json_pack("{s:O}", "success", ops),
                                 &reply, error);
        json_decref(reply);
    } else if (status == FERRY_ERR_NO_MEMORY && error->message[0] == '\0') {
        snprintf(error->message, sizeof(error->message), "out of memory");
    }
    json_decref(ops);
    free(changes);
    free(head_key);
    return status;
}

/* The revision a record key names, or 0 for the head / anything else. */
static uint64_t key_revision(const char *key, size_t length, size_t changes_length)
{
    if (length != changes_length + 16)
        return 0;
    uint64_t revision = 0;
    for (size_t i = changes_length; i < length; i++) {
        char c = key[i];
        int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (digit < 0)
            return 0;
        revision = revision << 4 | (uint64_t)digit;
    }
    return revision;
}

static ferry_status_t read_kvs(const json_t *kvs, const char *changes, uint64_t since,
                               uint64_t *generation_p, uint64_t *newest_p, char **records,
                               size_t *count_p)
{
    size_t changes_length = strlen(changes), index;
    int have_head = 0;
    const json_t *entry;
    json_array_foreach(kvs, index, entry) {
        char *key, *value;
        size_t key_length, value_length;
        const json_t *k = json_object_get(entry, "key"), *v = json_object_get(entry, "value");
        if (!json_is_string(k) || (v != NULL && !json_is_string(v)))
            return FERRY_ERR_DECODE;
        if (ferry_etcd_unb64(json_string_value(k), &key, &key_length) != FERRY_OK)
            return FERRY_ERR_DECODE;
        ferry_status_t status = ferry_etcd_unb64(v ? json_string_value(v) : "", &value,
                                                 &value_length);
        uint64_t revision = key_revision(key, key_length, changes_length);
        int is_head = key_length == changes_length + 4 &&
                      memcmp(key + changes_length, "head", 4) == 0;
        free(key);
        if (status != FERRY_OK)
            return FERRY_ERR_DECODE;
        if (is_head) {
            have_head = ferry_md_head_parse(value, value_length, generation_p, newest_p);
            free(value);
        } else if (revision > since && *count_p < FETCH_MAX) {
            records[(*count_p)++] = value; /* ascending: etcd returns keys in order */
        } else {
            free(value);
        }
    }
    return have_head ? FERRY_OK : FERRY_ERR_SEGMENT_NOT_FOUND;
}

ferry_status_t ferry_etcd_fetch_changes(void *ctx, const char *name, uint64_t since,
                                        uint64_t *generation_p, uint64_t *newest_p,
                                        char ***records_p, size_t *count_p)
{
    etcd_store_t *store = ctx;
    char *key;
    *records_p = NULL;
    *count_p = 0;
    ferry_status_t status = ferry_md_key(&store->keys, name, &key);
    if (status != FERRY_OK)
        return status;
    char *changes = ferry_md_strcat3(key, CHANGES, ""), *from = record_key(key, since);
    char **records = calloc(FETCH_MAX, sizeof(*records));
    size_t end_length = 0;
    char *end = changes ? ferry_etcd_prefix_end(changes, strlen(changes), &end_length) : NULL;
    etcd_error_t error = {0};
    json_t *reply = NULL;
    if (changes == NULL || from == NULL || records == NULL || end == NULL) {
        status = FERRY_ERR_NO_MEMORY;
    } else {
        status = ferry_etcd_call(store, "/v3/kv/range",
                                 json_pack("{s:o, s:o}", "key", kv(from, strlen(from)),
                                           "range_end", kv(end, end_length)),
                                 &reply, &error);
        if (status != FERRY_OK)
            ferry_error("etcd %s: cannot fetch the changes of segment \"%s\": %s", store->uri,
                        name, error.message);
    }
    if (status == FERRY_OK) {
        const json_t *kvs = json_object_get(reply, "kvs");
        status = kvs == NULL ? FERRY_ERR_SEGMENT_NOT_FOUND
                             : read_kvs(kvs, changes, since, generation_p, newest_p, records,
                                        count_p);
        if (status == FERRY_ERR_DECODE)
            ferry_error("etcd %s: segment \"%s\": a change record is not base64", store->uri,
                        name);
    }
    json_decref(reply);
    if (status == FERRY_OK) {
        *records_p = records;
    } else {
        for (size_t i = 0; i < *count_p; i++)
            free(records[i]);
        free(records);
        *count_p = 0;
    }
    free(end);
    free(from);
    free(changes);
    free(key);
    return status;
}

void ferry_etcd_delete_changes(etcd_store_t *store, const char *key)
{
    char *changes = ferry_md_strcat3(key, CHANGES, "");
    json_t *request = changes ? delete_range(changes, NULL) : NULL, *reply = NULL;
    etcd_error_t error;
    if (request != NULL &&
        ferry_etcd_call(store, "/v3/kv/deleterange", request, &reply, &error) == FERRY_OK)
        json_decref(reply);
    free(changes);
}
