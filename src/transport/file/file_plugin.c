/*
 * The file transport plugin: storage buffers that the initiator reaches
 * itself (the same file on this host, or the same NVMe(-oF) namespace by its
 * WWID), read and written with io_uring where liburing was found and the
 * kernel allows it, else with a pool of pread/pwrite threads.  Built into
 * libferry.  Its priority puts it first: no other transport reaches a
 * storage buffer (engine_register.c registers storage with it alone).
 */
#include <config.h>

#include "file.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const ferry_setting_t ferry_file_settings_table[] = {
    {"ENGINE", "auto", "I/O engine: auto (io_uring, else threads), uring or threads (forced)",
     offsetof(ferry_file_settings_t, engine), FERRY_SETTING_STRING},
    {"THREADS", "4", "pread/pwrite threads of the threads engine",
     offsetof(ferry_file_settings_t, threads), FERRY_SETTING_UINT},
    {"QUEUE_DEPTH", "128", "io_uring submission queue entries (I/Os in flight at most)",
     offsetof(ferry_file_settings_t, queue_depth), FERRY_SETTING_UINT},
    {"LIVENESS_MS", "20", "a same-host owner is looked up in /proc when the last look is this old",
     offsetof(ferry_file_settings_t, liveness_ms), FERRY_SETTING_TIME_MS},
    {"SYSFS_ROOT", "/sys", "where block devices' WWIDs are read (tests: a fake tree)",
     offsetof(ferry_file_settings_t, sysfs_root), FERRY_SETTING_STRING},
    {"DEV_ROOT", "/dev", "where a block device found by WWID in SYSFS_ROOT/block is opened",
     offsetof(ferry_file_settings_t, dev_root), FERRY_SETTING_STRING},
    {"WWID_MAP", "", "WWID=PATH[;WWID=PATH...]: namespaces attached here under other names",
     offsetof(ferry_file_settings_t, wwid_map), FERRY_SETTING_STRING},
    {"SPIN_US", "50",
     "microseconds without a new op after which the idle thread of the "
     "threads engine that looks for work sleeps (0: sleeps at once)",
     offsetof(ferry_file_settings_t, spin_us), FERRY_SETTING_UINT},
};
const size_t ferry_file_settings_count =
    sizeof(ferry_file_settings_table) / sizeof(ferry_file_settings_table[0]);

static void file_destroy(void *ctx)
{
    ferry_file_t *file = ctx;
    if (file == NULL)
        return;
    /* device slices first: their ends kick the I/O engine (file_xfer.c) */
    ferry_file_gpu_stop(file);
    if (file->io_engine != NULL)
        file->io->stop(file->io_engine);
    ferry_file_targets_free(file);
    ferry_file_ops_free(file);
    pthread_mutex_destroy(&file->op_lock);
    pthread_mutex_destroy(&file->lock);
    ferry_settings_release(ferry_file_settings_table, ferry_file_settings_count,
                           &file->settings);
    free(file->address);
    free(file);
}

/* The engine the setting asks for; with "auto", io_uring unless the
 * kernel refuses it (one log line) or liburing was not found. */
static ferry_status_t start_engine(ferry_file_t *file)
{
    const char *want = file->settings.engine;
    if (strcmp(want, "threads") == 0) {
        file->io = &ferry_file_pool_ops;
        return file->io->create(file, &file->io_engine);
    }
    if (strcmp(want, "uring") != 0 && strcmp(want, "auto") != 0) {
        ferry_error("FERRY_FILE_ENGINE=%s: not auto, uring or threads", want);
        return FERRY_ERR_INVALID_PARAM;
    }
    ferry_status_t status = FERRY_ERR_UNSUPPORTED;
    if (ferry_file_uring_ops != NULL) {
        file->io = ferry_file_uring_ops;
        status = file->io->create(file, &file->io_engine);
    }
    if (status == FERRY_OK)
        return FERRY_OK;
    if (strcmp(want, "uring") == 0) {
        ferry_error("file transport: FERRY_FILE_ENGINE=uring, but io_uring is %s",
                    ferry_file_uring_ops ? "refused by the kernel" : "not built (no liburing)");
        return FERRY_ERR_UNSUPPORTED;
    }
    if (ferry_file_uring_ops != NULL)
        ferry_info("file transport: io_uring unavailable; pread/pwrite threads instead");
    file->io = &ferry_file_pool_ops;
    file->io_engine = NULL;
    return file->io->create(file, &file->io_engine);
}

static ferry_status_t file_create(const ferry_transport_services_t *svc, void **ctx_p)
{
    if (svc == NULL || svc->slice_done == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_file_t *file = calloc(1, sizeof(*file));
    if (file == NULL)
        return FERRY_ERR_NO_MEMORY;
    memcpy(&file->svc, svc, FERRY_MIN(svc->size, sizeof(file->svc)));
    file->svc.size = sizeof(file->svc);
    pthread_mutex_init(&file->lock, NULL);
    pthread_mutex_init(&file->op_lock, NULL);
    ferry_status_t status = ferry_settings_read("FILE", ferry_file_settings_table,
                                                ferry_file_settings_count, &file->settings);
    char identity[192];
    ferry_process_identity(identity, sizeof(identity));
    file->address = ferry_strdup_printf(FERRY_FILE_ENDPOINT_PREFIX "%s:", identity);
    if (status == FERRY_OK && file->address == NULL)
        status = FERRY_ERR_NO_MEMORY;
    if (status == FERRY_OK && (file->settings.threads == 0 || file->settings.queue_depth == 0)) {
        ferry_error("FERRY_FILE_THREADS and FERRY_FILE_QUEUE_DEPTH must not be 0");
        status = FERRY_ERR_INVALID_PARAM;
    }
    if (status == FERRY_OK)
        status = start_engine(file);
    if (status != FERRY_OK) {
        file_destroy(file);
        return status;
    }
    *ctx_p = file;
    return FERRY_OK;
}

static ferry_status_t file_address(void *ctx, char **endpoint_p)
{
    *endpoint_p = strdup(((ferry_file_t *)ctx)->address);
    return *endpoint_p ? FERRY_OK : FERRY_ERR_NO_MEMORY;
}

/* Memory is not ours: storage buffers come with their key from the engine
 * (FERRY_TRANSPORT_STORAGE), never through here. */
static ferry_status_t file_mem_register(void *ctx, void *addr, size_t length,
                                        const char *location, char **key_p, void **memh_p)
{
    *key_p = NULL;
    *memh_p = NULL;
    return FERRY_ERR_UNSUPPORTED;
}

static void file_mem_deregister(void *ctx, void *memh)
{
}

static int file_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key)
{
    if (peer == NULL || remote_key == NULL)
        return FERRY_REACH_NO;
    ferry_file_target_t *target = ferry_file_target_get(ctx, peer, remote_key);
    int reachable = target != NULL && target->reachable;
    if (target != NULL)
        ferry_file_target_put(target);
    return reachable ? FERRY_REACH_YES : FERRY_REACH_NO;
}

static void file_peer_forget(void *ctx, const ferry_peer_t *peer)
{
    ferry_file_targets_forget(ctx, peer->name, peer->generation);
}

static unsigned file_progress(void *ctx)
{
    ferry_file_t *file = ctx;
    return file->io->progress != NULL ? file->io->progress(file->io_engine) : 0;
}

/* README.md, "Waiting in the ring": the uring engine's; the threads
 * engine has none (its waiters do queued ops themselves in progress). */
static ferry_status_t file_wait(void *ctx, const ferry_wait_t *w)
{
    ferry_file_t *file = ctx;
    if (file->io->wait == NULL)
        return w->sleep(w->arg, w->deadline);
    return file->io->wait(file->io_engine, w);
}

static size_t file_slice_size(void *ctx)
{
    return 0; /* one I/O per request: the kernel takes any size */
}

/* Device memory (every accelerator's kind the engine asks about) comes
 * unstaged: file_gpu.c moves it by cuFile or the engine's pinned staging. */
static int file_local_memory(void *ctx, const char *location)
{
    (void)ctx;
    (void)location;
    return 1;
}

static void file_info(FILE *out)
{
    char cufile[320];
    ferry_cufile_describe(cufile, sizeof(cufile));
    fprintf(out, "file: storage buffers by the initiator's own I/O, built in; io_uring: %s\n",
#ifdef HAVE_LIBURING
            "yes (liburing)"
#else
            "no (built without liburing: pread/pwrite threads)"
#endif
    );
    fprintf(out, "  GPU memory to and from storage (FERRY_STORAGE_GPU): pinned staging, or %s; "
                 "the cuFile path has never run on real hardware\n",
            cufile);
}

static const ferry_transport_ops_t file_ops = {
    .size = sizeof(ferry_transport_ops_t),
    .create = file_create,
    .destroy = file_destroy,
    .address = file_address,
    .mem_register = file_mem_register,
    .mem_deregister = file_mem_deregister,
    .reaches = file_reaches,
    .submit = ferry_file_submit,
    .peer_forget = file_peer_forget,
    .slice_size = file_slice_size,
    .progress = file_progress,
    .peer_changed = file_peer_forget,
    .local_memory = file_local_memory,
    .wait = file_wait,
};

static const ferry_plugin_t file_plugin = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .kind = FERRY_PLUGIN_TRANSPORT,
    .name = "file",
    .description = "storage buffers (files, block devices) by the initiator's own I/O "
                   "(io_uring or pread/pwrite threads)",
    .priority = 100,
    .flags = FERRY_TRANSPORT_ONE_SIDED | FERRY_TRANSPORT_STORAGE,
    .settings = ferry_file_settings_table,
    .settings_count = sizeof(ferry_file_settings_table) / sizeof(ferry_file_settings_table[0]),
    .settings_component = "FILE",
    .ops = &file_ops,
    .info = file_info,
};

const ferry_plugin_t *ferry_file_plugin(void)
{
    return &file_plugin;
}
