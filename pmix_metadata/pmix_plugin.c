/*
 * pmix metadata store: descriptors kept in the key-value store of the PMIx
 * launcher that started this process (mpirun, srun --mpi=pmix).
 *
 * Keys are written once.  PMIx 4.2's shared-memory store, as measured here
 * under both launchers, can keep serving the old value of a key that was put
 * again (a shorter value over a longer one, for one), so a process never
 * rewrites a key: its n-th publish or removal puts, with global scope, and
 * commits
 *   ferry.v<n>   its published segments: a name line, then its descriptor:
 *                a line (JSON has no newline) or, for a descriptor with
 *                newlines (the compact form), "=<hex length>:<bytes>\n"
 * A peer finds a rank's newest snapshot by probing ferry.v<n+1>, <n+2>,
 * <n+4>... (then bisecting) from the newest it saw, with PMIx_Get and
 * PMIX_GET_REFRESH_CACHE, so a registration made after startup is seen
 * without a fence.  Only put, commit and get are used: Slurm's PMIx server
 * refuses Publish/Lookup, and PMIx cannot delete a key.
 *
 * Names: "rank:N" is the oldest segment rank N of this job still publishes
 * (the default name of a process's first engine is its own "rank:N").  Any
 * other name is found in the ranks' snapshots; every name of a snapshot
 * read is remembered for the process (hashed), so later opens ask one rank.
 * A rank or name not published yet is waited for, up to FERRY_PMIX_TIMEOUT.
 *
 * PMIx is per process: PMIx_Init and PMIx_Finalize nest (MPI's own included),
 * and the process's published segments are shared by its engines under
 * published_lock.
 */
#include <ferry/plugin.h>

#include <pmix.h>

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KEY_FORMAT "ferry.v%" PRIu64
#define RANK_PREFIX "rank:"
#define NAME_MAX_LEN 1024
#define NAME_BUCKETS 1024 /* names remembered: every engine's of a job, in the worst case */
#define POLL_MIN_MS 10
#define POLL_MAX_MS 200

typedef struct pmix_settings {
    unsigned timeout_ms;
} pmix_settings_t;

static const ferry_setting_t pmix_settings[] = {
    {.name = "PMIX_TIMEOUT", .default_value = "10s",
     .doc = "how long opening a segment waits for a rank or name that is not published yet "
            "(and the bound on each PMIx_Get)",
     .offset = offsetof(pmix_settings_t, timeout_ms), .type = FERRY_SETTING_TIME_MS},
};

typedef struct pmix_store {
    pmix_settings_t settings;
    pmix_proc_t me;
    uint32_t job_size;
    pthread_mutex_t cache_lock; /* newest */
    uint64_t *newest;           /* [job_size]: newest snapshot seen of each rank */
} pmix_store_t;

/* Where names were found, hashed: one job per process (PMIx is per
 * process), so every engine of it shares what any of them read. */
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static struct rank_of {
    char *name;
    pmix_rank_t rank;
    struct rank_of *next;
} *names[NAME_BUCKETS];

/* This process's published segments, oldest first, and its snapshot count. */
static pthread_mutex_t published_lock = PTHREAD_MUTEX_INITIALIZER;
static struct published {
    char *name;
    char *descriptor;
} *published;
static size_t n_published;
static uint64_t snapshots;
static unsigned defaults_given;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* "rank:N" -> N; -1 when name is not of that form. */
static long rank_of_name(const char *name)
{
    if (strncmp(name, RANK_PREFIX, strlen(RANK_PREFIX)) != 0)
        return -1;
    const char *digits = name + strlen(RANK_PREFIX);
    char *end;
    errno = 0;
    long rank = strtol(digits, &end, 10);
    if (end == digits || *end != '\0' || errno || rank < 0 || *digits == '-' || *digits == '+')
        return -1;
    return rank;
}

static ferry_status_t check_name(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len > NAME_MAX_LEN || strchr(name, '\n') != NULL) {
        ferry_error("pmix: segment name \"%.64s\" is empty, holds a newline or is longer than "
                    "%d bytes", name, NAME_MAX_LEN);
        return FERRY_ERR_INVALID_PARAM;
    }
    return FERRY_OK;
}

/* ---- writing: one new key per change ---- */

/* Put and commit the next snapshot of published[]; published_lock held. */
static ferry_status_t put_snapshot_locked(void)
{
    size_t len = 1;
    for (size_t i = 0; i < n_published; i++)
        len += strlen(published[i].name) + strlen(published[i].descriptor) + 2 + 20;
    char *text = malloc(len), *p = text;
    if (text == NULL)
        return FERRY_ERR_NO_MEMORY;
    *p = '\0';
    for (size_t i = 0; i < n_published; i++) {
        const char *descriptor = published[i].descriptor;
        if (strchr(descriptor, '\n') == NULL)
            p += sprintf(p, "%s\n%s\n", published[i].name, descriptor);
        else
            p += sprintf(p, "%s\n=%zx:%s\n", published[i].name, strlen(descriptor), descriptor);
    }
    pmix_key_t key;
    snprintf(key, sizeof(key), KEY_FORMAT, snapshots + 1);
    pmix_value_t value;
    PMIX_VALUE_LOAD(&value, text, PMIX_STRING);
    free(text);
    pmix_status_t rc = PMIx_Put(PMIX_GLOBAL, key, &value);
    PMIX_VALUE_DESTRUCT(&value);
    if (rc == PMIX_SUCCESS)
        rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) {
        ferry_error("pmix: cannot store %s: %s", key, PMIx_Error_string(rc));
        return FERRY_ERR_METADATA;
    }
    snapshots++;
    return FERRY_OK;
}

/* ---- reading ---- */

/*
 * Snapshot n of a rank, fresh from the server.  FERRY_OK with a malloc-ed
 * copy; FERRY_ERR_SEGMENT_NOT_FOUND when the rank has not put it;
 * FERRY_ERR_METADATA when the server failed.
 */
static ferry_status_t get_snapshot(pmix_store_t *store, pmix_rank_t rank, uint64_t n,
                                   char **text_p)
{
    pmix_proc_t proc;
    PMIX_PROC_LOAD(&proc, store->me.nspace, rank);
    pmix_key_t key;
    snprintf(key, sizeof(key), KEY_FORMAT, n);
    pmix_info_t info[2];
    bool refresh = true;
    int timeout_s = (int)((store->settings.timeout_ms + 999) / 1000);
    PMIX_INFO_LOAD(&info[0], PMIX_GET_REFRESH_CACHE, &refresh, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &timeout_s, PMIX_INT);
    pmix_value_t *value = NULL;
    pmix_status_t rc = PMIx_Get(&proc, key, info, timeout_s > 0 ? 2 : 1, &value);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    ferry_status_t status;
    if (rc == PMIX_ERR_NOT_FOUND || rc == PMIX_ERR_PROC_ENTRY_NOT_FOUND) {
        status = FERRY_ERR_SEGMENT_NOT_FOUND;
    } else if (rc != PMIX_SUCCESS) {
        ferry_error("pmix: PMIx_Get(rank %u, %s): %s", (unsigned)rank, key,
                    PMIx_Error_string(rc));
        status = FERRY_ERR_METADATA;
    } else if (value->type != PMIX_STRING) {
        ferry_error("pmix: rank %u's %s is not a string", (unsigned)rank, key);
        status = FERRY_ERR_DECODE;
    } else {
        *text_p = strdup(value->data.string ? value->data.string : "");
        status = *text_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
    }
    if (value != NULL)
        PMIX_VALUE_RELEASE(value);
    return status;
}

/* Look at snapshot n: there, it becomes *text_p and *have_p; not there,
 * *missing_p.  Fails only when the server does. */
static ferry_status_t probe(pmix_store_t *store, pmix_rank_t rank, uint64_t n, char **text_p,
                            uint64_t *have_p, uint64_t *missing_p)
{
    char *text;
    ferry_status_t status = get_snapshot(store, rank, n, &text);
    if (status == FERRY_ERR_SEGMENT_NOT_FOUND) {
        *missing_p = n;
        return FERRY_OK;
    }
    if (status == FERRY_OK) {
        free(*text_p);
        *text_p = text;
        *have_p = n;
    }
    return status;
}

/*
 * The newest snapshot of a rank: gallop from the newest seen, then bisect.
 * FERRY_ERR_SEGMENT_NOT_FOUND: the rank has published nothing yet.
 */
static ferry_status_t newest_snapshot(pmix_store_t *store, pmix_rank_t rank, char **text_p)
{
    pthread_mutex_lock(&store->cache_lock);
    uint64_t have = store->newest[rank];
    pthread_mutex_unlock(&store->cache_lock);
    char *text = NULL;
    uint64_t base = have, missing = 0; /* 0: no missing one known yet */
    ferry_status_t status = FERRY_OK;
    for (uint64_t step = 1; missing == 0 && status == FERRY_OK; step *= 2)
        status = probe(store, rank, base + step, &text, &have, &missing);
    /* have is there (or 0), missing is not: bisect between them. */
    while (status == FERRY_OK && missing - have > 1)
        status = probe(store, rank, have + (missing - have) / 2, &text, &have, &missing);
    if (status != FERRY_OK) {
        free(text);
        return status;
    }
    if (have == 0)
        return FERRY_ERR_SEGMENT_NOT_FOUND;
    if (text == NULL) { /* the newest is the one seen before */
        ferry_status_t status = get_snapshot(store, rank, have, &text);
        if (status != FERRY_OK)
            return status == FERRY_ERR_SEGMENT_NOT_FOUND ? FERRY_ERR_METADATA : status;
    }
    pthread_mutex_lock(&store->cache_lock);
    if (have > store->newest[rank])
        store->newest[rank] = have;
    pthread_mutex_unlock(&store->cache_lock);
    *text_p = text;
    return FERRY_OK;
}

/* One entry of a snapshot: its name and descriptor, pointers into the text. */
typedef struct snapshot_entry {
    const char *name, *descriptor;
    size_t name_length, descriptor_length;
} snapshot_entry_t;

/* The entry at *p, and *p moved past it.  0 at the end or on a malformed
 * entry (*status_p FERRY_ERR_DECODE, logged). */
static int snapshot_next(const char **p, snapshot_entry_t *entry, ferry_status_t *status_p)
{
    if (**p == '\0')
        return 0;
    size_t n = strcspn(*p, "\n");
    const char *descriptor = *p + n + ((*p)[n] == '\n');
    size_t d = strcspn(descriptor, "\n");
    if (descriptor[0] == '=') {
        /* "=<hex length>:<bytes>": bytes that hold newlines */
        char *end;
        unsigned long long length = strtoull(descriptor + 1, &end, 16);
        if (*end != ':' || length > strlen(end + 1)) {
            ferry_error("pmix: a snapshot holds a malformed descriptor");
            *status_p = FERRY_ERR_DECODE;
            return 0;
        }
        descriptor = end + 1;
        d = (size_t)length;
    }
    *entry = (snapshot_entry_t){.name = *p, .name_length = n, .descriptor = descriptor,
                                .descriptor_length = d};
    *p = descriptor + d + (descriptor[d] == '\n');
    return 1;
}

/* The descriptor of name in a snapshot (name NULL: the first), malloc-ed,
 * or NULL (with *status_p set). */
static char *snapshot_find(const char *text, const char *name, ferry_status_t *status_p)
{
    *status_p = FERRY_ERR_SEGMENT_NOT_FOUND;
    snapshot_entry_t entry;
    for (const char *p = text; snapshot_next(&p, &entry, status_p);) {
        if (name == NULL ||
            (strlen(name) == entry.name_length && strncmp(entry.name, name, entry.name_length) == 0)) {
            char *copy = strndup(entry.descriptor, entry.descriptor_length);
            *status_p = copy ? FERRY_OK : FERRY_ERR_NO_MEMORY;
            return copy;
        }
    }
    return NULL;
}

/* ---- name -> rank ---- */

static struct rank_of **cache_bucket(const char *name)
{
    uint32_t hash = 2166136261u; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        hash = (hash ^ *c) * 16777619u;
    return &names[hash % NAME_BUCKETS];
}

static int cache_find(const char *name, pmix_rank_t *rank_p)
{
    int found = 0;
    pthread_mutex_lock(&names_lock);
    for (struct rank_of *r = *cache_bucket(name); r && !found; r = r->next)
        if (strcmp(r->name, name) == 0) {
            *rank_p = r->rank;
            found = 1;
        }
    pthread_mutex_unlock(&names_lock);
    return found;
}

static void cache_set(const char *name, pmix_rank_t rank)
{
    pthread_mutex_lock(&names_lock);
    struct rank_of **link = cache_bucket(name);
    while (*link && strcmp((*link)->name, name) != 0)
        link = &(*link)->next;
    if (*link == NULL && (*link = calloc(1, sizeof(**link))) != NULL &&
        ((*link)->name = strdup(name)) == NULL) {
        free(*link);
        *link = NULL;
    }
    if (*link)
        (*link)->rank = rank;
    pthread_mutex_unlock(&names_lock);
}

/* Where every name of a rank's snapshot is, read on the way while looking
 * for another: a later open of one of them asks that rank alone, so an
 * all-to-all of named engines scans the ranks about once per process, not
 * once per open. */
static void cache_snapshot_names(const char *text, pmix_rank_t rank)
{
    ferry_status_t status;
    snapshot_entry_t entry;
    char name[NAME_MAX_LEN + 1];
    for (const char *p = text; snapshot_next(&p, &entry, &status);)
        if (entry.name_length <= NAME_MAX_LEN) {
            memcpy(name, entry.name, entry.name_length);
            name[entry.name_length] = '\0';
            cache_set(name, rank);
        }
}

/*
 * One attempt at the descriptor of name.  FERRY_ERR_SEGMENT_NOT_FOUND with
 * *gone_p 0: not published yet (worth waiting for); 1: removed, or no such
 * rank.
 */
static ferry_status_t fetch_once(pmix_store_t *store, const char *name, char **descriptor_p,
                                 int *gone_p)
{
    char *text = NULL;
    ferry_status_t status;
    pmix_rank_t rank;
    long by_rank = rank_of_name(name);
    *gone_p = 0;
    if (by_rank >= 0) {
        if ((uint64_t)by_rank >= store->job_size) {
            ferry_info("pmix: segment %s: this job has ranks 0 to %u", name,
                       (unsigned)store->job_size - 1);
            *gone_p = 1;
            return FERRY_ERR_SEGMENT_NOT_FOUND;
        }
        status = newest_snapshot(store, (pmix_rank_t)by_rank, &text);
        if (status != FERRY_OK)
            return status;
        *descriptor_p = snapshot_find(text, NULL, &status);
        *gone_p = status == FERRY_ERR_SEGMENT_NOT_FOUND; /* it removed every segment */
        free(text);
        return status;
    }
    if (cache_find(name, &rank)) {
        status = newest_snapshot(store, rank, &text);
        if (status != FERRY_OK)
            return status;
        *descriptor_p = snapshot_find(text, name, &status);
        *gone_p = status == FERRY_ERR_SEGMENT_NOT_FOUND; /* its owner removed it */
        free(text);
        return status;
    }
    for (rank = 0; rank < store->job_size; rank++) {
        status = newest_snapshot(store, rank, &text);
        if (status == FERRY_ERR_SEGMENT_NOT_FOUND)
            continue; /* that rank has published nothing (yet) */
        if (status != FERRY_OK)
            return status;
        *descriptor_p = snapshot_find(text, name, &status);
        if (status == FERRY_ERR_SEGMENT_NOT_FOUND)
            cache_snapshot_names(text, rank);
        free(text);
        if (status != FERRY_ERR_SEGMENT_NOT_FOUND) {
            if (status == FERRY_OK)
                cache_set(name, rank);
            return status;
        }
    }
    return FERRY_ERR_SEGMENT_NOT_FOUND;
}

/* ---- operations ---- */

static ferry_status_t pmix_fetch(void *ctx, const char *name, char **descriptor_p)
{
    pmix_store_t *store = ctx;
    ferry_status_t status = check_name(name);
    if (status != FERRY_OK)
        return status;
    uint64_t deadline = now_ms() + store->settings.timeout_ms;
    unsigned pause = POLL_MIN_MS;
    for (;;) {
        int gone;
        status = fetch_once(store, name, descriptor_p, &gone);
        if (status != FERRY_ERR_SEGMENT_NOT_FOUND || gone || now_ms() >= deadline) {
            if (status == FERRY_ERR_SEGMENT_NOT_FOUND)
                ferry_info("pmix: no segment \"%s\" in job %s", name, store->me.nspace);
            return status;
        }
        sleep_ms(pause);
        pause = pause * 2 > POLL_MAX_MS ? POLL_MAX_MS : pause * 2;
    }
}

static ferry_status_t pmix_publish(void *ctx, const char *name, const char *descriptor)
{
    pmix_store_t *store = ctx;
    ferry_status_t status = check_name(name);
    if (status != FERRY_OK)
        return status;
    long by_rank = rank_of_name(name);
    if (by_rank >= 0 && (uint64_t)by_rank != store->me.rank) {
        ferry_error("pmix: segment name %s is rank %ld's; this process is rank %u", name,
                    by_rank, (unsigned)store->me.rank);
        return FERRY_ERR_INVALID_PARAM;
    }
    char *copy = strdup(descriptor);
    if (copy == NULL)
        return FERRY_ERR_NO_MEMORY;
    pthread_mutex_lock(&published_lock);
    size_t i = 0;
    while (i < n_published && strcmp(published[i].name, name) != 0)
        i++;
    if (i == n_published) {
        struct published *grown = realloc(published, (n_published + 1) * sizeof(*published));
        char *name_copy = strdup(name);
        if (grown != NULL)
            published = grown;
        if (grown == NULL || name_copy == NULL) {
            pthread_mutex_unlock(&published_lock);
            free(name_copy);
            free(copy);
            return FERRY_ERR_NO_MEMORY;
        }
        published[n_published++] = (struct published){.name = name_copy, .descriptor = NULL};
    }
    free(published[i].descriptor);
    published[i].descriptor = copy;
    ferry_trace("pmix: rank %u publishes %s (%zu bytes), snapshot %" PRIu64,
                (unsigned)store->me.rank, name, strlen(descriptor), snapshots + 1);
    status = put_snapshot_locked();
    pthread_mutex_unlock(&published_lock);
    return status;
}

static ferry_status_t pmix_remove(void *ctx, const char *name)
{
    ferry_status_t status = FERRY_OK;
    pthread_mutex_lock(&published_lock);
    for (size_t i = 0; i < n_published; i++) {
        if (strcmp(published[i].name, name) == 0) {
            free(published[i].name);
            free(published[i].descriptor);
            memmove(&published[i], &published[i + 1], (n_published - i - 1) * sizeof(*published));
            n_published--;
            status = put_snapshot_locked();
            break;
        }
    }
    if (n_published == 0) {
        free(published);
        published = NULL;
    }
    pthread_mutex_unlock(&published_lock);
    return status;
}

static ferry_status_t pmix_default_name(void *ctx, char **name_p)
{
    pmix_store_t *store = ctx;
    char name[64];
    pthread_mutex_lock(&published_lock);
    unsigned k = defaults_given++;
    pthread_mutex_unlock(&published_lock);
    if (k == 0)
        snprintf(name, sizeof(name), RANK_PREFIX "%u", (unsigned)store->me.rank);
    else
        snprintf(name, sizeof(name), RANK_PREFIX "%u.%u", (unsigned)store->me.rank, k);
    *name_p = strdup(name);
    return *name_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

static void store_free(pmix_store_t *store)
{
    free(store->newest);
    pthread_mutex_destroy(&store->cache_lock);
    ferry_settings_release(pmix_settings, ARRAY_SIZE(pmix_settings), &store->settings);
    free(store);
}

static ferry_status_t pmix_create(const ferry_metadata_services_t *svc, const char *uri,
                                  void **ctx_p)
{
    if (strcmp(uri, "pmix") != 0 && strcmp(uri, "pmix://") != 0) {
        ferry_error("metadata URI \"%s\" is not pmix", uri);
        return FERRY_ERR_INVALID_PARAM;
    }
    pmix_store_t *store = calloc(1, sizeof(*store));
    if (store == NULL)
        return FERRY_ERR_NO_MEMORY;
    pthread_mutex_init(&store->cache_lock, NULL);
    ferry_status_t status = ferry_settings_read(NULL, pmix_settings, ARRAY_SIZE(pmix_settings),
                                                &store->settings);
    if (status != FERRY_OK) {
        store_free(store);
        return status;
    }
    pmix_status_t rc = PMIx_Init(&store->me, NULL, 0);
    if (rc != PMIX_SUCCESS) {
        ferry_error("metadata store pmix: this process was not started by a PMIx launcher "
                    "(mpirun, srun --mpi=pmix): PMIx_Init: %s", PMIx_Error_string(rc));
        store_free(store);
        return FERRY_ERR_METADATA;
    }
    pmix_proc_t job;
    PMIX_PROC_LOAD(&job, store->me.nspace, PMIX_RANK_WILDCARD);
    pmix_value_t *value = NULL;
    rc = PMIx_Get(&job, PMIX_JOB_SIZE, NULL, 0, &value);
    if (rc == PMIX_SUCCESS && value->type == PMIX_UINT32)
        store->job_size = value->data.uint32;
    if (value != NULL)
        PMIX_VALUE_RELEASE(value);
    if (rc != PMIX_SUCCESS || store->job_size == 0) {
        ferry_error("metadata store pmix: no job size from the launcher: %s",
                    PMIx_Error_string(rc));
        PMIx_Finalize(NULL, 0);
        store_free(store);
        return FERRY_ERR_METADATA;
    }
    store->newest = calloc(store->job_size, sizeof(*store->newest));
    if (store->newest == NULL) {
        PMIx_Finalize(NULL, 0);
        store_free(store);
        return FERRY_ERR_NO_MEMORY;
    }
    ferry_debug("pmix: job %s, rank %u of %u", store->me.nspace, (unsigned)store->me.rank,
                (unsigned)store->job_size);
    *ctx_p = store;
    return FERRY_OK;
}

static void pmix_destroy(void *ctx)
{
    PMIx_Finalize(NULL, 0);
    store_free(ctx);
}

static void pmix_info(FILE *out)
{
    fprintf(out, "          %s\n", PMIx_Get_version());
}

static const ferry_metadata_ops_t pmix_ops = {
    .size = sizeof(ferry_metadata_ops_t),
    .create = pmix_create,
    .destroy = pmix_destroy,
    .publish = pmix_publish,
    .fetch = pmix_fetch,
    .remove = pmix_remove,
    .default_name = pmix_default_name,
};

static const ferry_plugin_t pmix_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_METADATA,
    .name = "pmix",
    .flags = FERRY_METADATA_COMPACT, /* only Ferry engines read it */
    .description = "the PMIx launcher's key-value store (mpirun, srun --mpi=pmix); segments "
                   "\"rank:N\"",
    .settings = pmix_settings,
    .settings_count = ARRAY_SIZE(pmix_settings),
    .settings_component = NULL,
    .ops = &pmix_ops,
    .info = pmix_info,
};

__attribute__((visibility("default"))) const ferry_plugin_t *ferry_plugin_entry(void)
{
    return &pmix_plugin;
}
