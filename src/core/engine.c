/*
 * The engine: settings, RPC listener, transports, metadata store, lifetime.
 * Registration lives in engine_register.c, RPC handling in engine_rpc.c.
 */
#include "core.h"
#include "../rpc/rpc.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SETTING(name_, default_, doc_, field_, type_)                                          \
    {.name = name_, .default_value = default_, .doc = doc_,                                    \
     .offset = offsetof(ferry_engine_settings_t, field_), .type = type_}

static const ferry_setting_t engine_settings[] = {
    SETTING("SEGMENT_NAME", "", "segment name peers open; empty: the metadata store's default "
            "(p2p: the RPC host:port; pmix: rank:N)", segment_name, FERRY_SETTING_STRING),
    SETTING("METADATA", "", "metadata store URI: p2p (no server), http://host:port/metadata, "
            "etcd://host:port, redis://host:port, pmix; empty: pmix in a job started by a PMIx "
            "launcher when the pmix module is installed, else p2p", metadata,
            FERRY_SETTING_STRING),
    SETTING("RPC_ADDRESS", "", "RPC listen address host[:port]; empty: this host's address, any "
            "port", rpc_address, FERRY_SETTING_STRING),
    SETTING("TRANSPORTS", "", "transports to enable, in order of preference (\"tcp,ucx\") or "
            "excluded (\"^ucx\"); empty: every one found", transports, FERRY_SETTING_STRING),
    SETTING("MODULE_DIR", "", "colon-separated directories of loadable plugins; empty: the "
            "install directory", module_dir, FERRY_SETTING_STRING),
    SETTING("HOST_ID", "", "host identity compared to pick same-host transports; empty: the "
            "kernel boot id", host_id, FERRY_SETTING_STRING),
    SETTING("RPC_TIMEOUT", "2000ms", "bound on each control-plane RPC step (connect, send, "
            "reply)", rpc_timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("RPC_MAX_FRAME", "64m", "largest RPC frame accepted", rpc_max_frame,
            FERRY_SETTING_SIZE),
    SETTING("RPC_IDLE_TIMEOUT", "20s", "the RPC listener closes a connection that sends no "
            "request this long (0: never)", rpc_idle_timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("RPC_MAX_CONNS", "256", "connections the RPC listener keeps open; past it a new one "
            "evicts the one idle longest, or is closed when none is idle", rpc_max_conns,
            FERRY_SETTING_UINT),
    SETTING("RPC_MAX_CONNS_PER_SOURCE", "64", "connections the RPC listener keeps from one "
            "address; past it a new one evicts that address's connection idle longest",
            rpc_max_conns_per_source, FERRY_SETTING_UINT),
    SETTING("INVALIDATE_TIMEOUT", "1000ms", "how long unregister waits for its subscribers to "
            "acknowledge an invalidation (all are told at once; one that does not answer in "
            "time is dropped from the list)", invalidate_timeout_ms, FERRY_SETTING_TIME_MS),
    SETTING("SUBSCRIBERS_MAX", "65536", "peers an engine tells of its unregisters (those that "
            "fetched its descriptor or connected); at the bound a new one is refused (its fetch "
            "fails) until an unanswered invalidation drops some", subscribers_max,
            FERRY_SETTING_UINT),
    SETTING("CONFIRM_DESCRIPTORS", "yes", "one-sided transports (shm, cxl, ucx) use a descriptor "
            "from a shared metadata store only once its owner served the same over RPC, which "
            "also subscribes this engine to the owner's invalidations; no: trust the store (then "
            "a forged store entry steers one-sided copies, and a write after the owner's "
            "unregister can land)", confirm_descriptors, FERRY_SETTING_BOOL),
    SETTING("DESCRIPTOR_FORMAT", "auto", "form of the descriptors this engine publishes: "
            "compact (fast to read; engines of this version on), json (every reader, older "
            "engines and other tools too), auto: compact in etcd, redis and pmix, json over "
            "http (Mooncake's server shows it), p2p as each reader asks; readers take either",
            descriptor_format, FERRY_SETTING_STRING),
    SETTING("WAIT_SPIN", "50", "microseconds ferry_batch_wait drives the transports' progress on "
            "the calling thread before it sleeps (0: sleep at once)", wait_spin_us,
            FERRY_SETTING_UINT),
    SETTING("COPY_NT_MIN", "256k", "same-host writes (ucx into attached memory, cxl) of at least "
            "this many bytes use non-temporal stores (0: never); one value per process",
            copy_nt_min, FERRY_SETTING_SIZE),
    SETTING("COPY_THREADS", "auto", "helper threads that take a share of same-host copies of at "
            "least COPY_PARALLEL_MIN bytes (ucx attached memory, cxl): auto (1 where the process "
            "may run on 2 or more CPUs, 0 in a rank bound to one core) or 0..16; one value per "
            "process", copy_threads, FERRY_SETTING_STRING),
    SETTING("COPY_PARALLEL_MIN", "1m", "a same-host copy run (one submit's copies) of at least "
            "this many bytes is shared with the copy helpers", copy_parallel_min,
            FERRY_SETTING_SIZE),
    SETTING("STAGE_CHUNK", "1m", "device memory moved by a transport that takes host memory "
            "only (tcp, shm, cxl, a UCX without GPU support) goes through host buffers of this "
            "size (requests are cut into slices of at most this)", stage_chunk,
            FERRY_SETTING_SIZE),
    SETTING("STAGE_PINNED_MAX", "256m", "page-locked bytes the staging buffers may take in all "
            "(made as needed, kept until the engine goes); past it they are pageable (slower "
            "copies)", stage_pinned_max, FERRY_SETTING_SIZE),
    SETTING("STATS", "yes", "count finished requests, bytes, failures and latency per transport "
            "and per peer (ferry_stats_snapshot); no: count nothing", stats,
            FERRY_SETTING_BOOL),
    SETTING("STORAGE_GPU", "auto", "device memory to and from storage buffers (own, and same-host "
            "peers' by the file transport): cufile (GPUDirect Storage, cuda memory only), staging "
            "(pread/pwrite through the pinned STAGE_CHUNK buffers, pipelined with the device "
            "copies), auto: cufile where it runs native (nvidia-fs), else staging",
            storage_gpu, FERRY_SETTING_STRING),
};

const ferry_settings_table_t ferry_engine_settings_table = {
    .component = NULL,
    .title = "engine (FERRY_LOG_LEVEL=error|warn|info|debug|trace sets logging, default warn)",
    .settings = engine_settings,
    .count = FERRY_ARRAY_SIZE(engine_settings),
};

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

ferry_engine_t *ferry_engine_lookup(ferry_engine_h handle)
{
    return ferry_handle_lookup((uint64_t)(uintptr_t)handle, FERRY_HANDLE_ENGINE, NULL);
}

static ferry_status_t apply_config(ferry_engine_settings_t *settings, const ferry_config_t *cfg)
{
    if (cfg == NULL)
        return FERRY_OK;
    struct {
        uint64_t bit;
        const char *value;
        char **field;
    } fields[] = {
        {FERRY_CONFIG_FIELD_NAME, cfg->name, &settings->segment_name},
        {FERRY_CONFIG_FIELD_METADATA, cfg->metadata, &settings->metadata},
        {FERRY_CONFIG_FIELD_RPC_ADDRESS, cfg->rpc_address, &settings->rpc_address},
        {FERRY_CONFIG_FIELD_TRANSPORTS, cfg->transports, &settings->transports},
        {FERRY_CONFIG_FIELD_MODULE_DIR, cfg->module_dir, &settings->module_dir},
        {FERRY_CONFIG_FIELD_HOST_ID, cfg->host_id, &settings->host_id},
    };
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(fields); i++) {
        if (!(cfg->field_mask & fields[i].bit))
            continue;
        char *copy = strdup(fields[i].value ? fields[i].value : "");
        if (copy == NULL)
            return FERRY_ERR_NO_MEMORY;
        free(*fields[i].field);
        *fields[i].field = copy;
    }
    return FERRY_OK;
}

static void read_host_id(ferry_engine_t *engine)
{
    if (engine->settings.host_id[0] != '\0') {
        snprintf(engine->host_id, sizeof(engine->host_id), "%s", engine->settings.host_id);
        return;
    }
    if (!ferry_boot_id(engine->host_id, sizeof(engine->host_id))) {
        gethostname(engine->host_id, sizeof(engine->host_id) - 1);
        engine->host_id[strcspn(engine->host_id, "\n")] = '\0';
    }
}

static ferry_status_t start_rpc(ferry_engine_t *engine)
{
    char host[256] = "";
    int port = 0;
    const char *address = engine->settings.rpc_address;
    if (*address != '\0' && ferry_net_split(address, host, sizeof(host), &port, 0) != FERRY_OK) {
        ferry_error("FERRY_RPC_ADDRESS=\"%s\" is not host[:port]", address);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (host[0] == '\0')
        ferry_net_default_host(host, sizeof(host));
    /* A wildcard listen address is no address a peer can dial. */
    if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "::") == 0)
        ferry_net_default_host(engine->advertise_host, sizeof(engine->advertise_host));
    else
        snprintf(engine->advertise_host, sizeof(engine->advertise_host), "%s", host);
    const ferry_engine_settings_t *s = &engine->settings;
    ferry_rpc_server_limits_t limits = {.max_frame = s->rpc_max_frame,
                                        .timeout_ms = s->rpc_timeout_ms,
                                        .idle_timeout_ms = s->rpc_idle_timeout_ms,
                                        .max_conns = s->rpc_max_conns,
                                        .max_conns_per_source = s->rpc_max_conns_per_source};
    if (limits.max_conns == 0 || limits.max_conns > 65536) {
        ferry_error("FERRY_RPC_MAX_CONNS=%u is not within 1..65536", limits.max_conns);
        return FERRY_ERR_INVALID_PARAM;
    }
    ferry_status_t status = ferry_rpc_server_start(host, port, &limits, ferry_engine_rpc_handle,
                                                   engine, &engine->rpc_server, &port);
    if (status != FERRY_OK)
        return status;
    const char *fmt = strchr(engine->advertise_host, ':') ? "[%s]:%d" : "%s:%d";
    snprintf(engine->rpc_endpoint, sizeof(engine->rpc_endpoint), fmt, engine->advertise_host,
             port);
    return FERRY_OK;
}

/* "etcd://h:p" -> "etcd"; "p2p" -> "p2p". */
static void metadata_scheme(const char *uri, char *scheme, size_t len)
{
    size_t n = strcspn(uri, ":");
    if (n >= len)
        n = len - 1;
    memcpy(scheme, uri, n);
    scheme[n] = '\0';
}

/* No store configured: the launcher's PMIx store inside a PMIx-launched job
 * (mpirun and srun --mpi=pmix export PMIX_NAMESPACE and PMIX_RANK), else p2p. */
static const char *default_metadata(ferry_engine_t *engine)
{
    if (getenv("PMIX_NAMESPACE") != NULL && getenv("PMIX_RANK") != NULL &&
        ferry_plugin_available(engine->settings.module_dir, FERRY_PLUGIN_METADATA, "pmix"))
        return "pmix";
    return "p2p";
}

static ferry_status_t start_metadata(ferry_engine_t *engine)
{
    char scheme[32];
    const char *uri = engine->settings.metadata[0] ? engine->settings.metadata
                                                   : default_metadata(engine);
    metadata_scheme(uri, scheme, sizeof(scheme));
    ferry_status_t status = ferry_plugin_find(engine->settings.module_dir, FERRY_PLUGIN_METADATA,
                                              scheme, &engine->metadata_plugin);
    if (status != FERRY_OK)
        return status;
    engine->metadata = engine->metadata_plugin->ops;
    engine->metadata_services = (ferry_metadata_services_t){
        .size = sizeof(ferry_metadata_services_t),
        .engine = engine,
        .rpc_endpoint = engine->rpc_endpoint,
        .rpc_fetch = ferry_engine_rpc_fetch,
        .segment_changed = ferry_segment_cache_changed,
    };
    const char *format = engine->settings.descriptor_format;
    if (strcmp(format, "auto") == 0 || format[0] == '\0') {
        engine->publish_form = engine->metadata_plugin->flags & FERRY_METADATA_COMPACT
                                   ? FERRY_DESC_FORM_COMPACT
                                   : FERRY_DESC_FORM_JSON;
    } else if (strcmp(format, "compact") == 0 || strcmp(format, "json") == 0) {
        engine->publish_form = format[0] == 'c' ? FERRY_DESC_FORM_COMPACT : FERRY_DESC_FORM_JSON;
    } else {
        ferry_error("FERRY_DESCRIPTOR_FORMAT=\"%.64s\": not auto, compact or json", format);
        return FERRY_ERR_INVALID_PARAM;
    }
    /* The store logged why (once); no second line here. */
    status = engine->metadata->create(&engine->metadata_services, uri, &engine->metadata_ctx);
    if (status != FERRY_OK)
        return status;
    if (engine->settings.segment_name[0] != '\0') {
        engine->name = strdup(engine->settings.segment_name);
    } else if (engine->metadata->default_name != NULL) {
        status = engine->metadata->default_name(engine->metadata_ctx, &engine->name);
    } else {
        char host[200];
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        engine->name = ferry_strdup_printf("%s-%d", host, (int)getpid());
    }
    if (status == FERRY_OK && engine->name == NULL)
        status = FERRY_ERR_NO_MEMORY;
    return status;
}

int ferry_engine_transport_index(const ferry_engine_t *engine, const char *name)
{
    for (size_t i = 0; i < engine->n_transports; i++)
        if (strcmp(engine->transports[i].plugin->name, name) == 0)
            return (int)i;
    return -1;
}

/* An opt-in transport that is not configured says FERRY_ERR_UNSUPPORTED:
 * named in FERRY_TRANSPORTS, that is an error; found by a scan (quiet_opt_in),
 * it is skipped without a word. */
static ferry_status_t add_transport(ferry_engine_t *engine, const char *name, int quiet_opt_in)
{
    const ferry_plugin_t *plugin;
    if (ferry_engine_transport_index(engine, name) >= 0)
        return FERRY_OK;
    if (engine->n_transports == FERRY_MAX_TRANSPORTS) {
        ferry_error("more than %d transports requested", FERRY_MAX_TRANSPORTS);
        return FERRY_ERR_TOO_MANY;
    }
    ferry_status_t status = ferry_plugin_find(engine->settings.module_dir,
                                              FERRY_PLUGIN_TRANSPORT, name, &plugin);
    if (status != FERRY_OK)
        return status;
    /* An accelerator module whose library or device is missing: its
     * transport is off (the module said why, once, at info level). */
    const char *unusable = plugin->accel ? ferry_accel_why(plugin->accel) : NULL;
    if (unusable != NULL) {
        if (!quiet_opt_in)
            ferry_error("transport %s cannot start: %s", name, unusable);
        return FERRY_ERR_UNSUPPORTED;
    }
    ferry_transport_instance_t *tp = &engine->transports[engine->n_transports];
    tp->plugin = plugin;
    tp->ops = plugin->ops;
    status = tp->ops->create(&engine->transport_services, &tp->ctx);
    int opt_in = (plugin->flags & FERRY_TRANSPORT_OPT_IN) != 0;
    if (status == FERRY_ERR_UNSUPPORTED && opt_in) {
        if (!quiet_opt_in)
            ferry_error("transport %s is not configured (its FERRY_%s_* settings: ferry_info -c)",
                        name, plugin->settings_component ? plugin->settings_component : "?");
        return status;
    }
    if (status != FERRY_OK) {
        ferry_error("transport %s failed to start: %s", name, ferry_status_string(status));
        return status;
    }
    status = tp->ops->address(tp->ctx, &tp->address);
    if (status != FERRY_OK) {
        tp->ops->destroy(tp->ctx);
        return status;
    }
    tp->slice_size = tp->ops->slice_size ? tp->ops->slice_size(tp->ctx) : 0;
    tp->one_sided = (plugin->flags & FERRY_TRANSPORT_ONE_SIDED) != 0;
    engine->n_transports++;
    return FERRY_OK;
}

static int name_in_list(const char *list, const char *name)
{
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, name, len) == 0)
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* Which of the vendors' device memory the transport takes as a local
 * buffer (the others it gets staged). */
static void ask_local_memory(ferry_engine_t *engine, ferry_transport_instance_t *tp)
{
    tp->local_device = 0;
    if (!FERRY_TRANSPORT_OPS_HAS(tp->ops, local_memory))
        return;
    for (size_t a = 0; a < engine->n_accel; a++)
        if (tp->ops->local_memory(tp->ctx, engine->accel[a]->kind))
            tp->local_device |= 1u << a;
}

/* Highest priority first, so selection takes the first transport that reaches. */
static int by_priority(const void *a, const void *b)
{
    const ferry_transport_instance_t *x = a, *y = b;
    return y->plugin->priority - x->plugin->priority;
}

/* all: every plugin found (used when FERRY_TRANSPORTS names none). */
static ferry_status_t start_transports(ferry_engine_t *engine, const ferry_plugin_list_t *all)
{
    const char *list = engine->settings.transports;
    ferry_status_t status = FERRY_OK;
    if (*list != '\0' && *list != '^') {
        /* An explicit list: every name must load, in the user's order. */
        char *copy = strdup(list), *save = NULL;
        for (char *name = strtok_r(copy, ",", &save); name && status == FERRY_OK;
             name = strtok_r(NULL, ",", &save))
            status = add_transport(engine, name, 0);
        free(copy);
        return status;
    }
    for (size_t i = 0; i < all->count && status == FERRY_OK; i++) {
        const ferry_plugin_t *plugin = all->plugins[i];
        if (plugin->kind != FERRY_PLUGIN_TRANSPORT || (*list && name_in_list(list + 1,
                                                                             plugin->name)))
            continue;
        status = add_transport(engine, plugin->name, 1);
        if (status == FERRY_ERR_UNSUPPORTED &&
            ((plugin->flags & FERRY_TRANSPORT_OPT_IN) || plugin->accel != NULL))
            status = FERRY_OK; /* not configured, or no device: not wanted */
        /* An opt-in transport that fails was asked for: the engine fails. */
        if (status != FERRY_OK && strcmp(plugin->name, "tcp") != 0 &&
            !(plugin->flags & FERRY_TRANSPORT_OPT_IN)) {
            ferry_warn("transport %s is skipped: %s", plugin->name, ferry_status_string(status));
            status = FERRY_OK;
        }
    }
    qsort(engine->transports, engine->n_transports, sizeof(engine->transports[0]), by_priority);
    if (status == FERRY_OK && engine->n_transports == 0) {
        ferry_error("FERRY_TRANSPORTS=\"%s\" leaves no transport", list);
        status = FERRY_ERR_INVALID_PARAM;
    }
    return status;
}

ferry_status_t ferry_engine_create(const ferry_config_t *config, ferry_engine_h *engine_p)
{
    if (engine_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    pthread_once(&log_once, ferry_log_init);
    ferry_engine_t *engine = calloc(1, sizeof(*engine));
    if (engine == NULL)
        return FERRY_ERR_NO_MEMORY;
    ferry_status_t status = ferry_settings_read(NULL, engine_settings,
                                                FERRY_ARRAY_SIZE(engine_settings),
                                                &engine->settings);
    if (status != FERRY_OK) {
        free(engine);
        return status;
    }
    ferry_registry_init(&engine->registry);
    ferry_segment_cache_init(&engine->segments);
    pthread_mutex_init(&engine->register_lock, NULL);
    pthread_mutex_init(&engine->published_lock, NULL);
    pthread_mutex_init(&engine->subscribers_lock, NULL);
    pthread_mutex_init(&engine->notify_lock, NULL);
    pthread_mutex_init(&engine->batches_lock, NULL);
    engine->generation = ferry_random_u64();

    ferry_stats_init(&engine->stats, 0);
    status = ferry_engine_changes_init(engine);
    if (status == FERRY_OK)
        status = apply_config(&engine->settings, config);
    if (status != FERRY_OK)
        goto err_destroy;
    engine->stats.enabled = engine->settings.stats;
    if (engine->stats.enabled)
        ferry_ticks_init(); /* before a submit reads the statistics' clock */
    ferry_copy_set_nt_min(engine->settings.copy_nt_min);
    unsigned copy_threads;
    status = ferry_copy_threads_parse(engine->settings.copy_threads, &copy_threads);
    if (status != FERRY_OK)
        goto err_destroy;
    ferry_copy_helpers_start(copy_threads, engine->settings.copy_parallel_min);
    engine->copy_helpers = 1;
    status = ferry_storage_gpu_check(engine->settings.storage_gpu);
    if (status != FERRY_OK)
        goto err_destroy;
    read_host_id(engine);
    status = start_rpc(engine);
    if (status != FERRY_OK)
        goto err_destroy;
    status = start_metadata(engine);
    if (status != FERRY_OK)
        goto err_destroy;
    engine->transport_services = (ferry_transport_services_t){
        .size = sizeof(ferry_transport_services_t),
        .engine = engine,
        .segment_name = engine->name,
        .generation = engine->generation,
        .rpc_endpoint = engine->rpc_endpoint,
        .advertise_host = engine->advertise_host,
        .access_acquire = ferry_engine_access_acquire,
        .access_release = ferry_engine_access_release,
        .slice_done = ferry_batch_slice_done,
        .slices_done = ferry_batch_slices_done,
        .peer_seen = ferry_engine_peer_seen,
        .notify_deliver = ferry_engine_notify_deliver,
        .access_is_device = ferry_engine_access_is_device,
        .stage_in = ferry_engine_stage_in,
        .stage_out = ferry_engine_stage_out,
        .storage_file = ferry_engine_storage_file,
    };
    ferry_stage_pool_init(&engine->stage, engine->settings.stage_chunk,
                          engine->settings.stage_pinned_max);
    engine->stage_ready = 1;
    /* One look at the module directory serves the vendors and the
     * transports. */
    ferry_plugin_list_t all;
    ferry_plugin_list_all(engine->settings.module_dir, &all);
    ferry_engine_accel_start(engine, &all);
    status = start_transports(engine, &all);
    ferry_plugin_list_release(&all);
    if (status != FERRY_OK)
        goto err_destroy;
    for (size_t i = 0; i < engine->n_transports; i++)
        ask_local_memory(engine, &engine->transports[i]);
    for (size_t i = 0; i < engine->n_transports; i++)
        if (FERRY_TRANSPORT_OPS_HAS(engine->transports[i].ops, progress))
            engine->progress[engine->n_progress++] = &engine->transports[i];
    engine->handle = ferry_handle_alloc(FERRY_HANDLE_ENGINE, engine, NULL);
    if (engine->handle == 0) {
        status = FERRY_ERR_NO_RESOURCE;
        goto err_destroy;
    }
    pthread_mutex_lock(&engine->register_lock);
    status = ferry_engine_publish_locked(engine);
    pthread_mutex_unlock(&engine->register_lock);
    /* A name the store refuses (the store said why) never becomes valid;
     * an unreachable store may come back. */
    if (status == FERRY_ERR_INVALID_PARAM)
        goto err_destroy;
    if (status != FERRY_OK)
        ferry_warn("segment %s is not published yet: %s (registrations will retry)",
                   engine->name, ferry_status_string(status));
    atomic_store_explicit(&engine->serving, 1, memory_order_release);
    ferry_info("engine %s up: rpc %s, generation 0x%016llx, %zu transport(s)", engine->name,
               engine->rpc_endpoint, (unsigned long long)engine->generation,
               engine->n_transports);
    *engine_p = (ferry_engine_h)(uintptr_t)engine->handle;
    return FERRY_OK;

err_destroy:
    ferry_engine_free(engine);
    return status;
}

/*
 * Teardown, each step stopping what the next one frees under it:
 *  1. the handle: API calls no longer find the engine;
 *  2. the RPC server: peers no longer reach it;
 *  3. the transports stop: listeners closed, what they serve for peers
 *     ended (registry holds released), requests in flight FAILED, their
 *     threads joined, so nothing calls the engine's services any more;
 *  4. what the transports keep for each batch goes back to them;
 *  5. registrations: each drained (nothing holds it after 3; a transport
 *     without a stop op is waited for here), deregistered and freed;
 *  6. the transports are destroyed, then the batches (nothing completes);
 *  7. the copy helpers, the metadata store (its watch may still call us
 *     until destroyed), the segments, the rest; the statistics last of
 *     what batches and segments point into.
 */
void ferry_engine_free(ferry_engine_t *engine)
{
    if (engine->handle)
        ferry_handle_free(engine->handle);
    if (engine->rpc_server)
        ferry_rpc_server_stop(engine->rpc_server);
    for (size_t i = 0; i < engine->n_transports; i++)
        if (FERRY_TRANSPORT_OPS_HAS(engine->transports[i].ops, stop))
            engine->transports[i].ops->stop(engine->transports[i].ctx);
    ferry_batch_release_peer_caches(engine);
    ferry_engine_deregister_all(engine);
    for (size_t i = 0; i < engine->n_transports; i++) {
        engine->transports[i].ops->destroy(engine->transports[i].ctx);
        free(engine->transports[i].address);
    }
    ferry_batch_free_all(engine);
    if (engine->stage_ready) /* no transport or batch stages any more */
        ferry_stage_pool_fini(&engine->stage);
    if (engine->copy_helpers) /* no transport copies any more */
        ferry_copy_helpers_stop();
    /* The store's watch may still call segment_changed until it is destroyed. */
    if (engine->metadata_ctx) {
        if (engine->name)
            engine->metadata->remove(engine->metadata_ctx, engine->name);
        engine->metadata->destroy(engine->metadata_ctx);
    }
    ferry_segment_cache_fini(engine, &engine->segments);
    ferry_registry_fini(&engine->registry);
    for (ferry_subscriber_t *s = engine->subscribers, *next; s; s = next) {
        next = s->next;
        free(s->rpc);
        free(s);
    }
    for (ferry_notify_item_t *n = engine->notify_head, *next; n; n = next) {
        next = n->next;
        free(n);
    }
    ferry_engine_changes_fini(engine);
    ferry_stats_fini(&engine->stats); /* no batch, no segment counts any more */
    ferry_settings_release(engine_settings, FERRY_ARRAY_SIZE(engine_settings),
                           &engine->settings);
    free(engine->name);
    free(engine);
}

void ferry_engine_destroy(ferry_engine_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL) {
        ferry_warn("ferry_engine_destroy: invalid engine handle %p", (void *)handle);
        return;
    }
    ferry_engine_free(engine);
}

unsigned ferry_engine_progress(ferry_engine_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    unsigned events = 0;
    for (size_t i = 0; engine != NULL && i < engine->n_progress; i++)
        events += engine->progress[i]->ops->progress(engine->progress[i]->ctx);
    return events;
}

void ferry_engine_progress_leave(ferry_engine_t *engine)
{
    for (size_t i = 0; i < engine->n_progress; i++)
        if (FERRY_TRANSPORT_OPS_HAS(engine->progress[i]->ops, progress_leave))
            engine->progress[i]->ops->progress_leave(engine->progress[i]->ctx);
}

const char *ferry_engine_segment_name(ferry_engine_h handle)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    return engine ? engine->name : NULL;
}
