/*
 * Targets: a remote storage range, opened here.  A key is looked up by its
 * text (a descriptor fetched again carries the same text, so the files stay
 * open across refreshes); the first sight opens the file and decides
 * whether it is the owner's:
 * - a regular file or a block device without WWID: only on the owner's
 *   host (peer->same_host), at the key's path, with the key's st_dev and
 *   st_ino (a block device: its st_rdev) -- a path that names another file
 *   here is refused, not written;
 * - a namespace with a WWID: on any host, the block device that has that
 *   WWID here (FERRY_FILE_WWID_MAP first, then SYSFS_ROOT/block/NAME/wwid).
 * An unreachable key is kept too, so that it is logged once.
 */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static size_t slot_of(const char *text)
{
    uint64_t hash = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        hash = (hash ^ *p) * 1099511628211ull;
    return (size_t)(hash % FERRY_FILE_TABLE_SIZE);
}

/* Whether the opened file is the one the key names. */
static int same_file(const ferry_storage_key_t *key, int fd, const char *path)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return 0;
    if (key->kind == FERRY_STORAGE_KIND_BLOCK) {
        if (!S_ISBLK(st.st_mode))
            return 0;
        /* found by WWID: another host's numbers mean nothing here */
        return key->wwid[0] != '\0' || (uint64_t)st.st_rdev == key->dev;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_dev != key->dev ||
        (uint64_t)st.st_ino != key->ino) {
        ferry_warn("file: %s here is not the owner's file (device or inode differ)", path);
        return 0;
    }
    return 1;
}

/* Open the key's storage: fd (and fd_direct where the file system takes
 * O_DIRECT); reachable stays 0 when it is not the owner's. */
static void target_open(ferry_file_t *file, const ferry_peer_t *peer, ferry_file_target_t *t)
{
    char path[FERRY_STORAGE_PATH_MAX + 1];
    const ferry_storage_key_t *key = &t->key;
    if (key->wwid[0] != '\0') {
        if (!ferry_storage_wwid_find(file->settings.sysfs_root, file->settings.dev_root,
                                     file->settings.wwid_map, key->wwid, path, sizeof(path))) {
            ferry_info("file: segment %s: no namespace with WWID %s on this host", peer->name,
                       key->wwid);
            return;
        }
    } else if (!peer->same_host) {
        return; /* its own path on another host: a different file */
    } else {
        snprintf(path, sizeof(path), "%s", key->path);
    }
    int mode = O_RDWR;
    t->fd = open(path, O_RDWR | O_CLOEXEC);
    if (t->fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
        mode = O_RDONLY;
        t->fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (t->fd < 0) {
        ferry_warn("file: segment %s: cannot open %s: %s", peer->name, path, strerror(errno));
        return;
    }
    if (!same_file(key, t->fd, path)) {
        close(t->fd);
        t->fd = -1;
        return;
    }
    t->writable = mode == O_RDWR;
    if (!(key->options & FERRY_STORAGE_BUFFERED)) {
        t->fd_direct = open(path, mode | O_DIRECT | O_CLOEXEC);
        if (t->fd_direct < 0)
            ferry_debug("file: %s: no O_DIRECT (%s): page-cache I/O", path, strerror(errno));
    }
    t->reachable = 1;
}

static ferry_file_target_t *target_new(ferry_file_t *file, const ferry_peer_t *peer,
                                       const char *key_text)
{
    ferry_file_target_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->fd = t->fd_direct = -1;
    t->key_text = strdup(key_text);
    t->owner = strdup(peer->name);
    if (t->key_text == NULL || t->owner == NULL) {
        free(t->key_text);
        free(t->owner);
        free(t);
        return NULL;
    }
    t->generation = peer->generation;
    atomic_init(&t->refs, 1);
    const char *why;
    if (ferry_storage_key_parse(key_text, &t->key, &why) != FERRY_OK) {
        /* the decoders refuse such keys: only a hand-made descriptor */
        ferry_warn("file: segment %s: storage key refused: %s", peer->name, why);
        return t;
    }
    const char *endpoint = peer->endpoint ? peer->endpoint : "";
    size_t prefix = strlen(FERRY_FILE_ENDPOINT_PREFIX);
    if (peer->same_host && strncmp(endpoint, FERRY_FILE_ENDPOINT_PREFIX, prefix) == 0)
        ferry_process_identity_parse(endpoint + prefix, &t->pid, &t->start_time);
    atomic_init(&t->checked_ms, now_ms());
    target_open(file, peer, t);
    return t;
}

ferry_file_target_t *ferry_file_target_get(ferry_file_t *file, const ferry_peer_t *peer,
                                           const char *key_text)
{
    size_t slot = slot_of(key_text);
    pthread_mutex_lock(&file->lock);
    ferry_file_target_t *t = file->table[slot];
    while (t != NULL && (strcmp(t->key_text, key_text) != 0 ||
                         t->generation != peer->generation))
        t = t->next;
    if (t != NULL)
        atomic_fetch_add(&t->refs, 1);
    pthread_mutex_unlock(&file->lock);
    if (t != NULL)
        return t;
    /* opened outside the lock (a WWID scan, an open on a slow device) */
    ferry_file_target_t *made = target_new(file, peer, key_text);
    if (made == NULL)
        return NULL;
    pthread_mutex_lock(&file->lock);
    t = file->table[slot];
    while (t != NULL && (strcmp(t->key_text, key_text) != 0 ||
                         t->generation != peer->generation))
        t = t->next;
    if (t == NULL) {
        /* the first insert wins; a racing one is dropped */
        made->next = file->table[slot];
        file->table[slot] = made;
        t = made;
        made = NULL;
    }
    atomic_fetch_add(&t->refs, 1);
    pthread_mutex_unlock(&file->lock);
    if (made != NULL)
        ferry_file_target_put(made);
    return t;
}

void ferry_file_target_put(ferry_file_target_t *t)
{
    if (atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    if (t->fd >= 0)
        close(t->fd);
    if (t->fd_direct >= 0)
        close(t->fd_direct);
    free(t->key_text);
    free(t->owner);
    free(t);
}

int ferry_file_target_owner_alive(ferry_file_t *file, ferry_file_target_t *t)
{
    if (atomic_load_explicit(&t->owner_gone, memory_order_relaxed))
        return 0;
    if (t->pid == 0)
        return 1; /* another kernel: the engine's failure detection tells */
    uint64_t now = now_ms(), checked = atomic_load_explicit(&t->checked_ms,
                                                            memory_order_relaxed);
    if (now - checked < file->settings.liveness_ms)
        return 1;
    atomic_store_explicit(&t->checked_ms, now, memory_order_relaxed);
    if (ferry_process_alive(t->pid, t->start_time))
        return 1;
    if (!atomic_exchange(&t->owner_gone, 1))
        ferry_warn("file: the owner of segment %s (pid %ld) is gone; failing its requests",
                   t->owner, t->pid);
    return 0;
}

void ferry_file_targets_forget(ferry_file_t *file, const char *owner, uint64_t generation)
{
    ferry_file_target_t *gone = NULL;
    pthread_mutex_lock(&file->lock);
    for (size_t slot = 0; slot < FERRY_FILE_TABLE_SIZE; slot++) {
        for (ferry_file_target_t **p = &file->table[slot]; *p != NULL;) {
            ferry_file_target_t *t = *p;
            if (strcmp(t->owner, owner) == 0 && (generation == 0 || t->generation == generation)) {
                *p = t->next;
                t->next = gone;
                gone = t;
            } else {
                p = &t->next;
            }
        }
    }
    pthread_mutex_unlock(&file->lock);
    for (ferry_file_target_t *next; gone != NULL; gone = next) {
        next = gone->next;
        ferry_file_target_put(gone);
    }
}

void ferry_file_targets_free(ferry_file_t *file)
{
    for (size_t slot = 0; slot < FERRY_FILE_TABLE_SIZE; slot++) {
        for (ferry_file_target_t *t = file->table[slot], *next; t != NULL; t = next) {
            next = t->next;
            ferry_file_target_put(t);
        }
        file->table[slot] = NULL;
    }
}
