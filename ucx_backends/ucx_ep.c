/*
 * ucx endpoints: one per peer incarnation (endpoint string, generation),
 * created lazily with peer error handling, failed by UCX's error callback
 * or by our own deadline, closed (forcibly, which cancels what is in
 * flight) by the worker's progress thread or by peer_forget.
 */
#include "ucx.h"

#include <stdlib.h>
#include <string.h>

/* ---------------- the table (ucx->lock) ---------------- */

static ferry_ucx_ep_t **table_slot(ferry_ucx_t *ucx, const char *endpoint, uint64_t generation)
{
    uint64_t hash = ferry_ucx_hash(endpoint, generation);
    ferry_ucx_ep_t **pp = &ucx->buckets[hash % FERRY_UCX_EP_BUCKETS];
    while (*pp != NULL &&
           ((*pp)->generation != generation || strcmp((*pp)->endpoint, endpoint) != 0))
        pp = &(*pp)->next;
    return pp;
}

/* The endpoint of that peer incarnation in the table, or NULL; *slot_p (if
 * not NULL) is where it is linked (a hash and a string compare), filled only
 * when the memo of the last lookup does not answer. */
static ferry_ucx_ep_t *table_find(ferry_ucx_t *ucx, const ferry_peer_t *peer,
                                  ferry_ucx_ep_t ***slot_p)
{
    ferry_ucx_ep_t *ep = ucx->memo_ep;
    /* The same string (by address) with the same generation is the same
     * incarnation's endpoint: generations are random per incarnation. */
    if (ep != NULL && ucx->memo_endpoint == peer->endpoint && ep->generation == peer->generation) {
        if (slot_p != NULL)
            *slot_p = NULL;
        return ep;
    }
    ferry_ucx_ep_t **slot = table_slot(ucx, peer->endpoint, peer->generation);
    if (slot_p != NULL)
        *slot_p = slot;
    if (*slot != NULL) {
        ucx->memo_ep = *slot;
        ucx->memo_endpoint = peer->endpoint;
    }
    return *slot;
}

static void memo_drop(ferry_ucx_t *ucx, const ferry_ucx_ep_t *ep)
{
    if (ucx->memo_ep == ep) {
        ucx->memo_ep = NULL;
        ucx->memo_endpoint = NULL;
    }
}

static void table_remove(ferry_ucx_t *ucx, ferry_ucx_ep_t *ep)
{
    memo_drop(ucx, ep);
    ferry_ucx_ep_t **pp = table_slot(ucx, ep->endpoint, ep->generation);
    if (*pp == ep)
        *pp = ep->next;
    ep->next = NULL;
}

static ferry_ucx_ep_t *ep_new(ferry_ucx_t *ucx, const ferry_peer_t *peer)
{
    ferry_ucx_ep_t *ep = calloc(1, sizeof(*ep));
    if (ep == NULL)
        return NULL;
    ep->ucx = ucx;
    ep->endpoint = strdup(peer->endpoint);
    ep->name = strdup(peer->name ? peer->name : "?");
    if (ep->endpoint == NULL || ep->name == NULL) {
        free(ep->endpoint);
        free(ep->name);
        free(ep);
        return NULL;
    }
    ep->generation = peer->generation;
    ep->same_host = peer->same_host;
    ep->state = FERRY_UCX_EP_CONNECTING;
    pthread_mutex_init(&ep->flush_lock, NULL);
    atomic_init(&ep->ep, NULL);
    atomic_init(&ep->refs, 1);
    return ep;
}

/* Returns whether it was on the list (which holds a reference). */
static int worker_list_remove(ferry_ucx_ep_t *ep)
{
    ferry_ucx_worker_t *w = ep->worker;
    if (w == NULL)
        return 0;
    pthread_mutex_lock(&w->lock);
    int was_on = ep->on_worker_list;
    if (was_on) {
        for (ferry_ucx_ep_t **pp = &w->eps; *pp != NULL; pp = &(*pp)->worker_next) {
            if (*pp == ep) {
                *pp = ep->worker_next;
                break;
            }
        }
        ep->on_worker_list = 0;
        if (!ep->am_on_shm)
            atomic_fetch_sub(&w->net_eps, 1);
    }
    pthread_mutex_unlock(&w->lock);
    return was_on;
}

void ferry_ucx_ep_unref(ferry_ucx_ep_t *ep)
{
    if (atomic_fetch_sub(&ep->refs, 1) != 1)
        return;
    /* Nothing is in flight any more: no rkey is in use. */
    ferry_ucx_ep_close(ep);
    ferry_ucx_rkeys_flush(ep);
    free(ep->rkeys);
    pthread_mutex_destroy(&ep->flush_lock);
    free(ep->endpoint);
    free(ep->name);
    free(ep);
}

/* ---------------- closing and failing ---------------- */

static void close_done(void *request, ucs_status_t status, void *user_data)
{
    ferry_ucx_worker_t *w = user_data;
    atomic_fetch_sub(&w->closing, 1);
    ucp_request_free(request);
}

void ferry_ucx_ep_close(ferry_ucx_ep_t *ep)
{
    ferry_lock_acquire(&ep->lock);
    ucp_ep_h handle = ep->closed ? NULL : atomic_load(&ep->ep);
    ep->closed = 1;
    atomic_store(&ep->ep, NULL);
    ferry_lock_release(&ep->lock);
    if (handle == NULL)
        return;
    ferry_ucx_worker_t *w = ep->worker;
    /* FORCE: no flush with a peer that may be dead; UCX completes what is in
     * flight with an error (their callbacks run), so no buffer stays in use. */
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                        UCP_OP_ATTR_FIELD_USER_DATA,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
        .cb.send = close_done,
        .user_data = w,
    };
    atomic_fetch_add(&w->closing, 1);
    ucs_status_ptr_t request = ucp_ep_close_nbx(handle, &param);
    if (!UCS_PTR_IS_PTR(request))
        atomic_fetch_sub(&w->closing, 1);
    ucp_worker_signal(w->worker); /* its thread progresses the close */
    ferry_ucx_eager_fail_ep(ep);
    if (worker_list_remove(ep))
        ferry_ucx_ep_unref(ep); /* the list's; our caller holds another */
}

void ferry_ucx_ep_fail(ferry_ucx_ep_t *ep, ferry_status_t why, const char *what)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&ep->failed, &expected, (int)why))
        return;
    ferry_ucx_t *ucx = ep->ucx;
    if (why != FERRY_ERR_CANCELED)
        ferry_warn("ucx: peer %s (generation %016llx) failed: %s; failing its outstanding "
                   "requests", ep->name, (unsigned long long)ep->generation, what);
    pthread_mutex_lock(&ucx->lock);
    if (ep->state == FERRY_UCX_EP_READY)
        ep->state = FERRY_UCX_EP_FAILED;
    pthread_mutex_unlock(&ucx->lock);
    /* Closing runs UCX calls that must not happen inside a UCX callback: the
     * worker's thread does it. */
    ferry_ucx_worker_t *w = ep->worker;
    pthread_mutex_lock(&w->lock);
    if (!ep->close_queued) {
        ep->close_queued = 1;
        atomic_fetch_add(&ep->refs, 1);
        ep->close_next = w->close_queue;
        w->close_queue = ep;
        atomic_store(&w->close_pending, 1);
    }
    pthread_mutex_unlock(&w->lock);
    ucp_worker_signal(w->worker);
}

static void error_callback(void *arg, ucp_ep_h handle, ucs_status_t status)
{
    ferry_ucx_ep_fail(arg, FERRY_ERR_PEER_FAILED, ucs_status_string(status));
}

/* Double the late list (few: the caller's stack array, not freed). */
static int grow_late(ferry_ucx_ep_t ***late_p, ferry_ucx_ep_t **few, size_t *cap_p)
{
    ferry_ucx_ep_t **grown = malloc(2 * *cap_p * sizeof(*grown));
    if (grown == NULL)
        return 0;
    memcpy(grown, *late_p, *cap_p * sizeof(*grown));
    if (*late_p != few)
        free(*late_p);
    *late_p = grown;
    *cap_p *= 2;
    return 1;
}

void ferry_ucx_worker_housekeeping(ferry_ucx_worker_t *w, int sweep)
{
    /* Every late endpoint is looked at, however many: a fixed array would
     * leave those past its end unchecked at every sweep (never timing out). */
    ferry_ucx_ep_t *close = NULL, *flush, *few[64], **late = few;
    size_t n_late = 0, late_cap = FERRY_UCX_ARRAY_SIZE(few);
    unsigned timeout = w->ucx->settings.timeout_ms;
    uint64_t now = ferry_ucx_time_ms();
    pthread_mutex_lock(&w->lock);
    close = w->close_queue;
    w->close_queue = NULL;
    flush = w->flush_queue;
    w->flush_queue = NULL;
    for (ferry_ucx_ep_t *ep = flush; ep != NULL; ep = ep->flush_queue_next)
        ep->flush_queued = 0;
    atomic_store(&w->close_pending, 0);
    if (sweep && atomic_load(&w->busy) > 0) {
        for (ferry_ucx_ep_t *ep = w->eps; ep != NULL; ep = ep->worker_next) {
            if (atomic_load(&ep->outstanding) == 0 || atomic_load(&ep->failed) != 0)
                continue;
            if ((timeout != 0 &&
                 ferry_ucx_since(atomic_load(&ep->last_activity_ms), now) >= timeout) ||
                ep->pid > 0) {
                if (n_late == late_cap && !grow_late(&late, few, &late_cap))
                    break; /* out of memory: the rest wait for the next sweep */
                atomic_fetch_add(&ep->refs, 1);
                late[n_late++] = ep;
            }
        }
    }
    pthread_mutex_unlock(&w->lock);
    while (flush != NULL) {
        ferry_ucx_ep_t *next = flush->flush_queue_next;
        ferry_ucx_flush_waiting(flush);
        ferry_ucx_ep_unref(flush);
        flush = next;
    }
    for (size_t i = 0; i < n_late; i++) {
        /* A same-host peer is looked at every tick; the rest only time out. */
        if (ferry_ucx_ep_check_alive(late[i]) && timeout != 0 &&
            ferry_ucx_since(atomic_load(&late[i]->last_activity_ms), now) >= timeout) {
            char what[96];
            snprintf(what, sizeof(what), "no request completed for %u ms (FERRY_UCX_TIMEOUT)",
                     timeout);
            ferry_ucx_ep_fail(late[i], FERRY_ERR_PEER_FAILED, what);
        }
        ferry_ucx_ep_unref(late[i]);
    }
    if (late != few)
        free(late);
    if (n_late) {
        pthread_mutex_lock(&w->lock);
        ferry_ucx_ep_t *more = w->close_queue;
        w->close_queue = NULL;
        atomic_store(&w->close_pending, 0);
        pthread_mutex_unlock(&w->lock);
        while (more != NULL) {
            ferry_ucx_ep_t *next = more->close_next;
            more->close_next = close;
            close = more;
            more = next;
        }
    }
    while (close != NULL) {
        ferry_ucx_ep_t *next = close->close_next;
        ferry_ucx_ep_close(close);
        ferry_ucx_ep_unref(close);
        close = next;
    }
}

/* ---------------- connecting ---------------- */

static int is_shm_transport(const char *tl)
{
    static const char *const shm[] = {"posix", "sysv", "xpmem", "knem", "cma", "self",
                                      "cuda_ipc", "rocm_ipc"};
    for (size_t i = 0; i < FERRY_UCX_ARRAY_SIZE(shm); i++)
        if (strcmp(tl, shm[i]) == 0)
            return 1;
    return 0;
}

/* Is purpose one of the comma-separated list's? */
static int has_purpose(const char *list, const char *purpose)
{
    size_t n = strlen(purpose);
    for (const char *p = list; *p != '\0'; p += strcspn(p, ","), p += *p == ',')
        if (strncmp(p, purpose, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return 1;
    return 0;
}

/* Fill ep->lanes ("sysv/memory(am) cma/memory(rma_bw)") from UCX's own
 * description of the endpoint, and from it ep->am_on_shm (the lane that
 * carries active messages, and with them small puts, flushes and
 * notifies, is a shared-memory one) and ep->am_ordered (one lane carries
 * them all, short and fragmented: they arrive in posting order).  Where
 * UCX describes nothing, neither holds. */
static void describe_lanes(ferry_ucx_ep_t *ep)
{
    char *text = NULL;
    size_t size = 0, used = 0;
    unsigned am_lanes = 0;
    ep->lanes[0] = '\0';
    ep->am_on_shm = ep->am_ordered = 0;
    FILE *stream = open_memstream(&text, &size);
    if (stream == NULL)
        return;
    ucp_ep_print_info(ep->ep, stream);
    fclose(stream);
    /* "#  lane[0]:  3:sysv/memory.0 md[2]  -> md[2]/sysv/sysdev[255] am am_bw#0 keepalive" */
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line != NULL;
         line = strtok_r(NULL, "\n", &save)) {
        char *p = strstr(line, "lane[");
        if (p == NULL || (p = strchr(p, ':')) == NULL)
            continue;
        p += 1 + strspn(p + 1, " ");
        p += strspn(p, "0123456789");
        if (*p == ':')
            p++;
        char tl[32] = "", dev[64] = "";
        size_t n = strcspn(p, "/ ");
        snprintf(tl, sizeof(tl), "%.*s", (int)FERRY_UCX_MIN(n, sizeof(tl) - 1), p);
        if (p[n] == '/') {
            size_t m = strcspn(p + n + 1, ". ");
            snprintf(dev, sizeof(dev), "%.*s", (int)FERRY_UCX_MIN(m, sizeof(dev) - 1),
                     p + n + 1);
        }
        char purposes[96] = "";
        const char *arrow = strstr(p, "->");
        if (arrow != NULL) {
            arrow += 2 + strspn(arrow + 2, " ");
            arrow += strcspn(arrow, " "); /* the remote md/tl */
            size_t k = 0;
            for (const char *q = arrow; *q && k + 1 < sizeof(purposes); q++) {
                if (*q == ' ') {
                    if (k > 0 && purposes[k - 1] != ',' && q[1] != '\0')
                        purposes[k++] = ',';
                } else if (*q == '#') {
                    q += strspn(q + 1, "0123456789"); /* "am_bw#0" -> "am_bw" */
                } else {
                    purposes[k++] = *q;
                }
            }
            purposes[k] = '\0';
        }
        if (has_purpose(purposes, "am") && is_shm_transport(tl))
            ep->am_on_shm = 1;
        am_lanes += has_purpose(purposes, "am") || has_purpose(purposes, "am_bw");
        int w = snprintf(ep->lanes + used, sizeof(ep->lanes) - used, "%s%s/%s(%s)",
                         used ? " " : "", tl, dev, purposes);
        if (w < 0 || (size_t)w >= sizeof(ep->lanes) - used)
            break;
        used += (size_t)w;
    }
    free(text);
    ep->am_ordered = am_lanes == 1;
}

/* "ucx1:<boot id>:<pid ns>:<pid>:<start>:<addresses>" */
static ferry_status_t parse_endpoint(ferry_ucx_ep_t *ep)
{
    size_t prefix = strlen(FERRY_UCX_ENDPOINT_PREFIX);
    const char *addresses = NULL;
    if (strncmp(ep->endpoint, FERRY_UCX_ENDPOINT_PREFIX, prefix) == 0)
        addresses = ferry_process_identity_parse(ep->endpoint + prefix, &ep->pid,
                                                 &ep->start_time);
    if (addresses == NULL || *addresses == '\0') {
        ferry_error("ucx: the endpoint of %s is not \"" FERRY_UCX_ENDPOINT_PREFIX
                    "<boot id>:<pid ns>:<pid>:<start>:<addresses>\"", ep->name);
        return FERRY_ERR_DECODE;
    }
    ep->addresses = addresses;
    return FERRY_OK;
}

int ferry_ucx_ep_check_alive(ferry_ucx_ep_t *ep)
{
    if (ep->pid <= 0)
        return 1;
    if (ferry_process_alive(ep->pid, ep->start_time))
        return 1;
    ferry_ucx_ep_fail(ep, FERRY_ERR_PEER_FAILED, "its process is gone");
    return 0;
}

/* Worker i of ours talks to worker (i mod count) of the peer. */
static ferry_status_t pick_remote_address(ferry_ucx_ep_t *ep, void **address_p)
{
    size_t count = 1;
    for (const char *p = ep->addresses; *p; p++)
        count += *p == ',';
    size_t want = ep->worker->index % count;
    const char *p = ep->addresses;
    for (size_t i = 0; i < want; i++)
        p = strchr(p, ',') + 1;
    size_t length;
    *address_p = ferry_ucx_base64_decode(p, strcspn(p, ","), &length);
    if (*address_p == NULL) {
        ferry_error("ucx: the endpoint of %s is no base64 worker address", ep->name);
        return FERRY_ERR_DECODE;
    }
    return FERRY_OK;
}

static ferry_status_t ep_connect(ferry_ucx_t *ucx, ferry_ucx_ep_t *ep)
{
    ep->worker = &ucx->workers[ferry_ucx_hash(ep->endpoint, ep->generation) % ucx->n_workers];
    ferry_status_t result = parse_endpoint(ep);
    if (result != FERRY_OK)
        return result;
    /* A same-host peer known to be gone is not connected to: after a death
     * every retry would otherwise build (and leave behind) an endpoint into
     * a dead process's FIFO. */
    if (ep->pid > 0 && !ferry_process_alive(ep->pid, ep->start_time)) {
        ferry_debug("ucx: peer %s (pid %ld) is gone; not connecting", ep->name, ep->pid);
        return FERRY_ERR_PEER_FAILED;
    }
    void *address;
    result = pick_remote_address(ep, &address);
    if (result != FERRY_OK)
        return result;
    ucp_ep_params_t params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = address,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = error_callback, .arg = ep},
    };
    ucp_ep_h handle;
    ucs_status_t status = ucp_ep_create(ep->worker->worker, &params, &handle);
    free(address);
    if (status == UCS_OK)
        atomic_store(&ep->ep, handle);
    if (status != UCS_OK) {
        ferry_warn("ucx: no endpoint to %s: %s", ep->name, ucs_status_string(status));
        return status == UCS_ERR_UNREACHABLE ? FERRY_ERR_UNSUPPORTED : ferry_ucx_status(status);
    }
    describe_lanes(ep);
    /* "cma/memory(rma_bw)", "rc_mlx5/mlx5_0:1(rma,amo)": some lane does RMA */
    ep->rma_emulated = strstr(ep->lanes, "rma") == NULL;
    if (ep->same_host && !ep->am_on_shm && ucx->shm_policy != FERRY_UCX_SHM_IGNORE) {
        if (ucx->shm_policy == FERRY_UCX_SHM_REQUIRE) {
            ferry_warn("ucx: endpoint to same-host peer %s uses no shared memory (lanes: %s); "
                       "FERRY_UCX_SAME_HOST_SHM=require: ucx does not serve it", ep->name,
                       ep->lanes);
            ferry_ucx_ep_close(ep);
            return FERRY_ERR_UNSUPPORTED;
        }
        ferry_warn("ucx: endpoint to same-host peer %s uses no shared memory (lanes: %s); "
                   "check UCX_TLS and UCX_POSIX/SYSV_ERROR_HANDLING", ep->name, ep->lanes);
    } else {
        ferry_info("ucx: endpoint to %s (generation %016llx) on worker %u: %s", ep->name,
                   (unsigned long long)ep->generation, ep->worker->index, ep->lanes);
    }
    atomic_store(&ep->last_activity_ms, ferry_ucx_time_ms());
    atomic_fetch_add(&ep->refs, 1); /* the worker list's, dropped by ferry_ucx_ep_close */
    pthread_mutex_lock(&ep->worker->lock);
    ep->worker_next = ep->worker->eps;
    ep->worker->eps = ep;
    ep->on_worker_list = 1;
    if (!ep->am_on_shm)
        atomic_fetch_add(&ep->worker->net_eps, 1);
    pthread_mutex_unlock(&ep->worker->lock);
    ferry_ucx_send_hello(ep);
    return FERRY_OK;
}

int ferry_ucx_ep_liveness_due(ferry_ucx_ep_t *ep)
{
    return ep->pid > 0 && /* only then the clock */
           ferry_ucx_since(atomic_load(&ep->checked_ms), ferry_ucx_time_ms()) >=
               FERRY_UCX_LIVENESS_MS;
}

ferry_status_t ferry_ucx_ep_liveness_look(ferry_ucx_ep_t *ep)
{
    atomic_store(&ep->checked_ms, ferry_ucx_time_ms());
    return ferry_ucx_ep_check_alive(ep) ? FERRY_OK : FERRY_ERR_PEER_FAILED;
}

ferry_ucx_ep_t *ferry_ucx_ep_lock_cached(const ferry_peer_t *peer)
{
    ferry_ucx_peer_cache_t *cache = ferry_ucx_peer_cache_of(peer);
    if (cache == NULL)
        return NULL;
    ferry_ucx_ep_t *ep = cache->ep;
    ferry_lock_acquire(&ep->lock);
    /* Failing, forgetting and closing all set these; the liveness look and
     * saying "failed" once are ferry_ucx_ep_get's. */
    if (ep->closed || atomic_load(&ep->failed) != 0 || ferry_ucx_ep_liveness_due(ep)) {
        ferry_lock_release(&ep->lock);
        return NULL;
    }
    return ep;
}

void ferry_ucx_ep_cache(const ferry_peer_t *peer, ferry_ucx_ep_t *ep)
{
    if (peer->cache == NULL)
        return;
    ferry_ucx_peer_cache_t *cache = *peer->cache;
    if (cache == NULL && (cache = *peer->cache = calloc(1, sizeof(*cache))) == NULL)
        return; /* the next submit looks it up again */
    if (cache->ep != ep) {
        atomic_fetch_add(&ep->refs, 1);
        if (cache->ep != NULL)
            ferry_ucx_ep_unref(cache->ep);
        cache->ep = ep;
        cache->key_serial = 0;
    }
    cache->endpoint = peer->endpoint;
}

ferry_status_t ferry_ucx_rkey_find(const ferry_peer_t *peer, ferry_ucx_ep_t *ep, const char *key,
                                   ferry_ucx_rkey_t **entry_p)
{
    /* No look at the key's text: hashing and comparing a packed key took
     * 140 instructions of a 1,300-instruction 8 B write. */
    ferry_ucx_peer_cache_t *cache = peer->cache ? *peer->cache : NULL;
    if (cache != NULL && ferry_ucx_peer_cache_holds_key(cache, peer, ep, key)) {
        *entry_p = cache->key_entry;
        return FERRY_OK;
    }
    ferry_status_t status = ferry_ucx_rkey_get(ep, key, entry_p);
    if (status == FERRY_OK && cache != NULL && cache->ep == ep) {
        cache->key_serial = peer->descriptor_serial;
        cache->key = key;
        cache->key_entry = *entry_p;
        cache->key_flushes = ep->rkeys_flushes;
        cache->direct_length = 0;
    }
    return status;
}

void ferry_ucx_peer_cache_release(void *ctx, void *cached)
{
    (void)ctx;
    ferry_ucx_peer_cache_t *cache = cached;
    if (cache->ep != NULL)
        ferry_ucx_ep_unref(cache->ep);
    free(cache);
}

ferry_status_t ferry_ucx_ep_get(ferry_ucx_t *ucx, const ferry_peer_t *peer,
                                ferry_ucx_ep_t **ep_p)
{
    if (peer == NULL || peer->endpoint == NULL || *peer->endpoint == '\0')
        return FERRY_ERR_INVALID_PARAM;
    pthread_mutex_lock(&ucx->lock);
    ferry_ucx_ep_t **slot;
    ferry_ucx_ep_t *ep = table_find(ucx, peer, &slot);
    uint64_t now = ferry_ucx_time_ms();
    if (ep != NULL && ep->state == FERRY_UCX_EP_READY && ferry_ucx_ep_liveness_due(ep)) {
        /* The peer may have died since we last looked: a request into a dead
         * process's FIFO would only fail at the deadline, and a write into
         * its attached memory would even "succeed". */
        atomic_store(&ep->checked_ms, now);
        atomic_fetch_add(&ep->refs, 1);
        pthread_mutex_unlock(&ucx->lock);
        ferry_ucx_ep_check_alive(ep); /* marks it FAILED if not */
        ferry_ucx_ep_unref(ep);
        pthread_mutex_lock(&ucx->lock);
        ep = table_find(ucx, peer, &slot);
    }
    if (ep != NULL && ep->state == FERRY_UCX_EP_FAILED) {
        /* Say so once, so the engine forgets, refreshes and retries; that
         * retry (or the next submit) connects afresh. */
        if (slot == NULL)
            slot = table_slot(ucx, peer->endpoint, peer->generation);
        memo_drop(ucx, ep);
        *slot = ep->next;
        ep->next = NULL;
        ep->state = FERRY_UCX_EP_GONE;
        pthread_mutex_unlock(&ucx->lock);
        ferry_ucx_ep_unref(ep); /* the table's; the close is queued */
        return FERRY_ERR_PEER_FAILED;
    }
    if (ep != NULL) {
        atomic_fetch_add(&ep->refs, 1);
        while (ep->state == FERRY_UCX_EP_CONNECTING)
            pthread_cond_wait(&ucx->settled, &ucx->lock);
        ferry_status_t status = ep->state == FERRY_UCX_EP_READY         ? FERRY_OK
                                : ep->state == FERRY_UCX_EP_FAILED       ? FERRY_ERR_PEER_FAILED
                                : ep->state == FERRY_UCX_EP_UNREACHABLE ? FERRY_ERR_UNSUPPORTED
                                                                         : ep->connect_status;
        pthread_mutex_unlock(&ucx->lock);
        if (status != FERRY_OK) {
            ferry_ucx_ep_unref(ep);
            return status;
        }
        *ep_p = ep;
        return FERRY_OK;
    }
    ep = ep_new(ucx, peer);
    if (ep == NULL) {
        pthread_mutex_unlock(&ucx->lock);
        return FERRY_ERR_NO_MEMORY;
    }
    atomic_store(&ep->refs, 2); /* the table's and ours */
    *slot = ep;
    pthread_mutex_unlock(&ucx->lock);

    ferry_status_t status = ep_connect(ucx, ep);
    pthread_mutex_lock(&ucx->lock);
    if (status == FERRY_OK) {
        ep->state = atomic_load(&ep->failed) ? FERRY_UCX_EP_FAILED : FERRY_UCX_EP_READY;
    } else if (status == FERRY_ERR_UNSUPPORTED) {
        ep->state = FERRY_UCX_EP_UNREACHABLE; /* stays, so reaches() answers at once */
    } else {
        table_remove(ucx, ep);
        ep->state = FERRY_UCX_EP_GONE;
        ep->connect_status = status;
    }
    pthread_cond_broadcast(&ucx->settled);
    pthread_mutex_unlock(&ucx->lock);
    if (status != FERRY_OK) {
        if (ep->state == FERRY_UCX_EP_GONE)
            ferry_ucx_ep_unref(ep); /* the table's */
        ferry_ucx_ep_unref(ep);
        return status;
    }
    *ep_p = ep;
    return FERRY_OK;
}

/*
 * Registered user memory of a same-host peer is reached through UCX's RMA
 * emulation over the shared-memory FIFOs: slow next to plain stores, and
 * fragile, since a peer killed while writing into our FIFO leaves an entry
 * that is never completed and UCX 1.13 then reads nothing behind it (every
 * other peer of that worker stalls).  Such a buffer is a fallback; memory
 * from ferry_alloc (attached, written with plain stores) is not.
 */
static int reach_buffer(ferry_ucx_t *ucx, ferry_ucx_ep_t *ep, const char *remote_key)
{
    if (!ep->same_host || !ep->am_on_shm || ucx->settings.same_host_emulated)
        return FERRY_REACH_YES;
    ferry_lock_acquire(&ep->lock);
    ferry_ucx_rkey_t *entry = NULL;
    ferry_status_t status = ep->closed ? FERRY_ERR_PEER_FAILED
                                       : ferry_ucx_rkey_get(ep, remote_key, &entry);
    int direct = status == FERRY_OK && entry->direct;
    ferry_lock_release(&ep->lock);
    /* A key that does not unpack: let submit report it. */
    return status != FERRY_OK || direct ? FERRY_REACH_YES : FERRY_REACH_FALLBACK;
}

int ferry_ucx_reaches(void *ctx, const ferry_peer_t *peer, const char *remote_key)
{
    ferry_ucx_t *ucx = ctx;
    if (peer == NULL || peer->endpoint == NULL || *peer->endpoint == '\0' ||
        remote_key == NULL || *remote_key == '\0')
        return FERRY_REACH_NO;
    /* A known endpoint answers without consuming a FAILED state, which the
     * next submit must report. */
    pthread_mutex_lock(&ucx->lock);
    ferry_ucx_ep_t *ep = *table_slot(ucx, peer->endpoint, peer->generation);
    int known = ep != NULL && ep->state != FERRY_UCX_EP_CONNECTING;
    int ready = ep != NULL && ep->state == FERRY_UCX_EP_READY;
    int reaches = ep == NULL || ep->state != FERRY_UCX_EP_UNREACHABLE;
    if (ready)
        atomic_fetch_add(&ep->refs, 1);
    pthread_mutex_unlock(&ucx->lock);
    if (ready) {
        int reach = reach_buffer(ucx, ep, remote_key);
        ferry_ucx_ep_unref(ep);
        return reach;
    }
    if (known)
        return reaches ? FERRY_REACH_YES : FERRY_REACH_NO;
    /* Unknown: connecting tells whether UCX has a lane to that peer at all
     * (no common transport, or FERRY_UCX_SAME_HOST_SHM=require), so another
     * transport can serve it instead. */
    ferry_status_t status = ferry_ucx_ep_get(ucx, peer, &ep);
    if (status != FERRY_OK)
        return status == FERRY_ERR_UNSUPPORTED ? FERRY_REACH_NO : FERRY_REACH_YES;
    int reach = reach_buffer(ucx, ep, remote_key);
    ferry_ucx_ep_unref(ep);
    return reach;
}

/* ---------------- forgetting ---------------- */

void ferry_ucx_peer_changed(void *ctx, const ferry_peer_t *peer)
{
    ferry_ucx_t *ucx = ctx;
    if (peer == NULL || peer->endpoint == NULL)
        return;
    pthread_mutex_lock(&ucx->lock);
    ferry_ucx_ep_t *ep = *table_slot(ucx, peer->endpoint, peer->generation);
    if (ep != NULL)
        atomic_store(&ep->keys_stale, 1);
    pthread_mutex_unlock(&ucx->lock);
}

void ferry_ucx_peer_forget(void *ctx, const ferry_peer_t *peer)
{
    ferry_ucx_t *ucx = ctx;
    if (peer == NULL || peer->endpoint == NULL)
        return;
    pthread_mutex_lock(&ucx->lock);
    ferry_ucx_ep_t *ep;
    for (;;) {
        ep = *table_slot(ucx, peer->endpoint, peer->generation);
        if (ep == NULL || ep->state != FERRY_UCX_EP_CONNECTING)
            break;
        pthread_cond_wait(&ucx->settled, &ucx->lock);
    }
    if (ep != NULL) {
        table_remove(ucx, ep);
        ep->state = FERRY_UCX_EP_GONE;
    }
    pthread_mutex_unlock(&ucx->lock);
    if (ep == NULL)
        return;
    ferry_debug("ucx: forgetting %s (generation %016llx)", ep->name,
                (unsigned long long)ep->generation);
    int expected = 0;
    atomic_compare_exchange_strong(&ep->failed, &expected, (int)FERRY_ERR_CANCELED);
    ferry_ucx_ep_close(ep); /* in-flight requests finish now, CANCELED */
    ferry_ucx_ep_unref(ep); /* the table's; rkeys go with the last reference */
}

void ferry_ucx_eps_destroy(ferry_ucx_t *ucx)
{
    ferry_ucx_ep_t *all = NULL;
    pthread_mutex_lock(&ucx->lock);
    for (size_t b = 0; b < FERRY_UCX_EP_BUCKETS; b++) {
        while (ucx->buckets[b] != NULL) {
            ferry_ucx_ep_t *ep = ucx->buckets[b];
            if (ep->state == FERRY_UCX_EP_CONNECTING) {
                pthread_cond_wait(&ucx->settled, &ucx->lock); /* a submit still connecting */
                continue;
            }
            memo_drop(ucx, ep);
            ucx->buckets[b] = ep->next;
            ep->state = FERRY_UCX_EP_GONE;
            ep->next = all;
            all = ep;
        }
    }
    pthread_mutex_unlock(&ucx->lock);
    while (all != NULL) {
        ferry_ucx_ep_t *next = all->next;
        int expected = 0;
        atomic_compare_exchange_strong(&all->failed, &expected, (int)FERRY_ERR_CANCELED);
        ferry_ucx_ep_close(all);
        ferry_ucx_ep_unref(all);
        all = next;
    }
    /* Endpoints failed but not yet closed by the (stopped) threads. */
    for (unsigned i = 0; i < ucx->n_workers; i++)
        ferry_ucx_worker_housekeeping(&ucx->workers[i], 0);
}
