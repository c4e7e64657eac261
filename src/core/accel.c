/*
 * Accelerators: the vendor tables of the modules found (ferry_plugin_t.accel),
 * each initialized once per process (a GPU library's state is the
 * process's), and what the engine asks of them: which vendor a location
 * names, what kind of memory a pointer is, whether a registration's
 * location agrees with its pointer.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One vendor per accelerator module, in the order found.  lock guards the
 * table; an entry, once added, never changes but for its first init. */
typedef struct accel_vendor {
    const ferry_accel_ops_t *ops;
    ferry_status_t state; /* init's answer */
    char why[200];        /* its reason when not FERRY_OK */
} accel_vendor_t;

static pthread_mutex_t vendors_lock = PTHREAD_MUTEX_INITIALIZER;
static accel_vendor_t vendors[FERRY_ACCEL_VENDORS_MAX];
static size_t n_vendors;

/* The vendor entry of ops, added and initialized on first sight. */
static const accel_vendor_t *vendor_entry(const ferry_accel_ops_t *ops)
{
    pthread_mutex_lock(&vendors_lock);
    accel_vendor_t *v = NULL;
    for (size_t i = 0; i < n_vendors && v == NULL; i++)
        if (vendors[i].ops == ops)
            v = &vendors[i];
    if (v == NULL && n_vendors < FERRY_ACCEL_VENDORS_MAX) {
        v = &vendors[n_vendors++];
        v->ops = ops;
        /* Under the lock: a second engine created meanwhile waits for this
         * answer instead of initializing the library twice. */
        v->state = FERRY_ACCEL_OPS_HAS(ops, copy) ? ops->init(v->why, sizeof(v->why))
                                                   : FERRY_ERR_UNSUPPORTED;
        if (!FERRY_ACCEL_OPS_HAS(ops, copy))
            snprintf(v->why, sizeof(v->why), "%s: module older than this libferry", ops->kind);
        if (v->state != FERRY_OK && v->why[0] == '\0')
            snprintf(v->why, sizeof(v->why), "%s: %s", ops->kind,
                     ferry_status_string(v->state));
        if (v->state != FERRY_OK) /* once per process: its transport stays off */
            ferry_info("accelerator module %s_ipc is not used: %s", ops->kind, v->why);
    }
    pthread_mutex_unlock(&vendors_lock);
    return v;
}

const char *ferry_accel_why(const ferry_accel_ops_t *ops)
{
    const accel_vendor_t *v = vendor_entry(ops);
    return v == NULL ? "too many accelerator modules" : v->state == FERRY_OK ? NULL : v->why;
}

/* The usable vendors among the plugins of list (an unusable one said why
 * when first seen). */
static size_t usable_in(const ferry_plugin_list_t *list, const ferry_accel_ops_t **usable,
                        size_t max)
{
    size_t n = 0;
    for (size_t i = 0; i < list->count; i++) {
        const ferry_plugin_t *plugin = list->plugins[i];
        if (plugin->kind != FERRY_PLUGIN_TRANSPORT || plugin->accel == NULL)
            continue;
        const accel_vendor_t *v = vendor_entry(plugin->accel);
        if (v != NULL && v->state == FERRY_OK && n < max)
            usable[n++] = v->ops;
    }
    return n;
}

size_t ferry_accel_vendors(const char *module_dir, const ferry_accel_ops_t **usable, size_t max)
{
    ferry_plugin_list_t list;
    ferry_plugin_list_all(module_dir, &list);
    size_t n = usable_in(&list, usable, max);
    ferry_plugin_list_release(&list);
    return n;
}

const ferry_accel_ops_t *ferry_accel_find(const char *module_dir, const char *kind)
{
    const ferry_accel_ops_t *usable[FERRY_ACCEL_VENDORS_MAX];
    size_t n = ferry_accel_vendors(module_dir, usable, FERRY_ACCEL_VENDORS_MAX);
    for (size_t i = 0; i < n; i++)
        if (strcmp(usable[i]->kind, kind) == 0)
            return usable[i];
    return NULL;
}

void ferry_accel_print(FILE *out, const char *module_dir)
{
    const ferry_accel_ops_t *usable[FERRY_ACCEL_VENDORS_MAX];
    ferry_accel_vendors(module_dir, usable, FERRY_ACCEL_VENDORS_MAX);
    pthread_mutex_lock(&vendors_lock);
    size_t count = n_vendors;
    pthread_mutex_unlock(&vendors_lock);
    if (count == 0)
        fprintf(out, "  (no accelerator module found)\n");
    for (size_t i = 0; i < count; i++) {
        const accel_vendor_t *v = &vendors[i]; /* entries never change once added */
        const ferry_accel_ops_t *ops = v->ops;
        if (v->state != FERRY_OK) {
            fprintf(out, "  %-8s not usable: %s%s%s\n", ops->kind, v->why,
                    ops->hardware_note ? "; " : "", ops->hardware_note ? ops->hardware_note : "");
            continue;
        }
        int count_devices = ops->device_count();
        fprintf(out, "  %-8s usable, %d device(s)%s%s\n", ops->kind, count_devices,
                ops->hardware_note ? "; " : "", ops->hardware_note ? ops->hardware_note : "");
        for (int d = 0; d < count_devices; d++) {
            char uuid[FERRY_ACCEL_UUID_MAX] = "?", text[256] = "";
            ops->device_uuid(d, uuid, sizeof(uuid));
            ops->device_describe(d, text, sizeof(text));
            fprintf(out, "    %s:%d  %s  %s\n", ops->kind, d, uuid, text);
        }
    }
}

void ferry_engine_accel_start(ferry_engine_t *engine, const ferry_plugin_list_t *all)
{
    engine->n_accel = usable_in(all, engine->accel, FERRY_ACCEL_VENDORS_MAX);
}

const ferry_accel_ops_t *ferry_engine_accel_of(const ferry_engine_t *engine,
                                               const char *location)
{
    for (size_t i = 0; i < engine->n_accel; i++)
        if (ferry_location_is_kind(location, engine->accel[i]->kind))
            return engine->accel[i];
    return NULL;
}

const ferry_accel_ops_t *ferry_engine_accel_query(const ferry_engine_t *engine, const void *addr,
                                                  ferry_accel_range_t *range_p)
{
    for (size_t i = 0; i < engine->n_accel; i++)
        if (engine->accel[i]->pointer_query(addr, range_p) == FERRY_OK)
            return engine->accel[i];
    return NULL;
}

/* Whether the location names device memory of some accelerator (a module
 * found, usable or not, or one of the kinds Ferry has modules for): why
 * says why none serves it. */
static int accelerator_kind(const char *location, char *why, size_t why_length)
{
    static const char *const known[] = {"cuda", "hip", "rocm"};
    int device = 0;
    snprintf(why, why_length, "the module is not installed (ferry_info lists devices)");
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(known); i++)
        device |= ferry_location_is_kind(location, known[i]);
    pthread_mutex_lock(&vendors_lock);
    for (size_t i = 0; i < n_vendors; i++) {
        if (ferry_location_is_kind(location, vendors[i].ops->kind)) {
            device = 1;
            snprintf(why, why_length, "%s", vendors[i].why);
        }
    }
    pthread_mutex_unlock(&vendors_lock);
    return device;
}

/* The device ordinal of "kind:N", -1 when the qualifier is no number. */
static int location_device(const char *location)
{
    const char *colon = strchr(location, ':');
    if (colon == NULL)
        return 0; /* "cuda" alone: the first device */
    char *end;
    long device = strtol(colon + 1, &end, 10);
    return *end == '\0' && device >= 0 && device < 1 << 20 ? (int)device : -1;
}

ferry_status_t ferry_engine_location_resolve(const ferry_engine_t *engine, const void *addr,
                                             size_t length, const char *asked, char *resolved,
                                             size_t resolved_length,
                                             const ferry_accel_ops_t **vendor_p)
{
    ferry_accel_range_t range;
    const ferry_accel_ops_t *found = ferry_engine_accel_query(engine, addr, &range);
    const ferry_accel_ops_t *named = ferry_engine_accel_of(engine, asked);
    *vendor_p = NULL;
    if (strcmp(asked, "*") == 0) {
        if (found == NULL) {
            snprintf(resolved, resolved_length, "cpu");
            return FERRY_OK;
        }
        named = found;
        snprintf(resolved, resolved_length, "%s:%d", found->kind, range.device);
    } else {
        snprintf(resolved, resolved_length, "%s", asked);
    }
    if (named == NULL && found == NULL) {
        char why[200];
        if (!accelerator_kind(asked, why, sizeof(why)))
            return FERRY_OK; /* host memory (or a kind no accelerator has) */
        ferry_error("register [%p, +%zu) at %s: no usable accelerator module for it: %s", addr,
                    length, asked, why);
        return FERRY_ERR_UNSUPPORTED;
    }
    if (named == NULL) {
        ferry_error("register [%p, +%zu) at %s: the pointer is %s:%d device memory (location "
                    "\"*\" detects it)", addr, length, asked, found->kind, range.device);
        return FERRY_ERR_INVALID_PARAM;
    }
    if (found != named) {
        ferry_error("register [%p, +%zu) at %s: the pointer is not %s device memory%s%s", addr,
                    length, asked, named->kind, found ? ", it is " : "", found ? found->kind : "");
        return FERRY_ERR_INVALID_PARAM;
    }
    if (strcmp(asked, "*") != 0 && location_device(asked) != range.device) {
        ferry_error("register [%p, +%zu) at %s: the pointer is on %s:%d", addr, length, asked,
                    found->kind, range.device);
        return FERRY_ERR_INVALID_PARAM;
    }
    uintptr_t start = (uintptr_t)addr;
    if (start < range.base || length > range.length || start - range.base > range.length - length) {
        ferry_error("register [%p, +%zu) at %s: runs past its device allocation [%p, +%zu)",
                    addr, length, resolved, (void *)range.base, range.length);
        return FERRY_ERR_OUT_OF_RANGE;
    }
    *vendor_p = found;
    return FERRY_OK;
}

ferry_status_t ferry_engine_device_alloc(const ferry_engine_t *engine, const char *location,
                                         size_t length, void **addr_p,
                                         const ferry_accel_ops_t **vendor_p)
{
    const ferry_accel_ops_t *vendor = ferry_engine_accel_of(engine, location);
    *vendor_p = vendor;
    if (vendor == NULL)
        return FERRY_ERR_UNSUPPORTED;
    int device = location_device(location);
    if (device < 0 || device >= vendor->device_count()) {
        ferry_error("allocate %zu bytes at %s: no such device (%d %s device(s))", length,
                    location, vendor->device_count(), vendor->kind);
        return FERRY_ERR_INVALID_PARAM;
    }
    ferry_status_t status = vendor->mem_alloc(device, length, addr_p);
    if (status != FERRY_OK)
        ferry_error("allocate %zu bytes at %s: %s", length, location,
                    ferry_status_string(status));
    return status;
}
