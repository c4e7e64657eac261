/* ferry_info's devices section: every accelerator module found, whether it
 * can be used here and why not, and what it sees. */
#include "core.h"

#include <string.h>

/* A vendor's devices, one line each: ordinal, UUID, the vendor's own
 * description (name, memory, handle types). */
static void print_devices(FILE *out, const ferry_accel_ops_t *accel)
{
    int count = FERRY_ACCEL_OPS_HAS(accel, device_count) ? accel->device_count() : 0;
    for (int device = 0; device < count; device++) {
        char uuid[FERRY_ACCEL_UUID_MAX] = "?", text[256] = "";
        if (!FERRY_ACCEL_OPS_HAS(accel, device_uuid) ||
            accel->device_uuid(device, uuid, sizeof(uuid)) != FERRY_OK)
            snprintf(uuid, sizeof(uuid), "(no UUID)");
        if (FERRY_ACCEL_OPS_HAS(accel, device_describe))
            accel->device_describe(device, text, sizeof(text));
        fprintf(out, "  %s:%d  %s  %s\n", accel->kind, device, uuid, text);
    }
}

void ferry_accel_print(FILE *out, const char *module_dir)
{
    ferry_plugin_list_t all;
    ferry_plugin_list_all(module_dir, &all);
    size_t found = 0;
    fprintf(out, "# devices\n");
    for (size_t i = 0; i < all.count; i++) {
        const ferry_accel_ops_t *accel = all.plugins[i]->accel;
        if (all.plugins[i]->kind != FERRY_PLUGIN_TRANSPORT || accel == NULL ||
            !FERRY_ACCEL_OPS_HAS(accel, init))
            continue;
        found++;
        /* init answers once per process: asking again is free and changes
         * nothing for an engine that runs later. */
        char why[256] = "";
        ferry_status_t status = accel->init(why, sizeof(why));
        int count = status == FERRY_OK && FERRY_ACCEL_OPS_HAS(accel, device_count)
                        ? accel->device_count() : 0;
        fprintf(out, "%-8s module %s: ", accel->kind, all.plugins[i]->name);
        if (status != FERRY_OK)
            fprintf(out, "not usable: %s\n", why[0] ? why : ferry_status_string(status));
        else if (count <= 0)
            fprintf(out, "not usable: no device\n");
        else
            fprintf(out, "usable, %d device%s\n", count, count == 1 ? "" : "s");
        if (accel->hardware_note != NULL)
            fprintf(out, "  note: %s\n", accel->hardware_note);
        if (count > 0)
            print_devices(out, accel);
    }
    if (found == 0)
        fprintf(out, "no accelerator module (ferry_cuda_ipc, ferry_hip_ipc) in %s\n",
                module_dir && *module_dir ? module_dir : ferry_plugin_default_dir());
    ferry_plugin_list_release(&all);
}
