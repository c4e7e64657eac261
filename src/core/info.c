/* What ferry_info prints: version, plugins, settings, devices, counters. */
#include <config.h>

#include "core.h"
#include "../rpc/rpc.h"

#include <stdlib.h>
#include <string.h>

extern const ferry_settings_table_t ferry_engine_settings_table;

const char *ferry_version_string(void)
{
    return PACKAGE_VERSION;
}

static void print_counters(FILE *out)
{
    fprintf(out, "# counters (this process)\n");
    for (int i = 0; i < FERRY_RPC_COUNT_MAX; i++)
        fprintf(out, "%s %llu\n", ferry_rpc_counter_name((ferry_rpc_count_t)i),
                (unsigned long long)ferry_rpc_counter_get((ferry_rpc_count_t)i));
}

void ferry_info_print(FILE *out, unsigned what)
{
    if (what & FERRY_INFO_COUNTERS)
        print_counters(out);
    /* Counters alone: a benchmark asks between phases, and must not load
     * every module to do it. */
    if ((what & ~(unsigned)FERRY_INFO_COUNTERS) == 0)
        return;
    ferry_plugin_list_t all;
    const char *module_dir = getenv("FERRY_MODULE_DIR");
    ferry_plugin_list_all(module_dir, &all);
    if (what & FERRY_INFO_VERSION)
        fprintf(out, "# Ferry version %s, plugin ABI %d\n", PACKAGE_VERSION,
                FERRY_PLUGIN_ABI_VERSION);
    if (what & FERRY_INFO_PLUGINS) {
        fprintf(out, "# module path: %s\n",
                module_dir && *module_dir ? module_dir : ferry_plugin_default_dir());
        for (size_t i = 0; i < all.count; i++) {
            const ferry_plugin_t *plugin = all.plugins[i];
            int builtin = ferry_plugin_is_builtin(plugin);
            fprintf(out, "%-9s %-8s %-8s %s\n",
                    plugin->kind == FERRY_PLUGIN_TRANSPORT ? "transport" : "metadata",
                    plugin->name, builtin ? "built-in" : "module", plugin->description);
            if (plugin->info)
                plugin->info(out);
        }
    }
    if (what & FERRY_INFO_DEVICES) {
        fprintf(out, "# devices (accelerator modules)\n");
        ferry_accel_print(out, module_dir);
    }
    if (what & FERRY_INFO_SETTINGS) {
        ferry_settings_print(out, &ferry_engine_settings_table);
        for (size_t i = 0; i < all.count; i++) {
            const ferry_plugin_t *plugin = all.plugins[i];
            if (plugin->settings_count == 0)
                continue;
            char title[128];
            snprintf(title, sizeof(title), "%s %s", plugin->name,
                     plugin->kind == FERRY_PLUGIN_TRANSPORT ? "transport" : "metadata store");
            ferry_settings_table_t table = {.component = plugin->settings_component,
                                            .title = title,
                                            .settings = plugin->settings,
                                            .count = plugin->settings_count};
            ferry_settings_print(out, &table);
        }
    }
    ferry_plugin_list_release(&all);
}
