/*
 * Plugins: built-in ones (tcp, shm, cxl, p2p) and loadable modules named
 * ferry_<name>.so in the module path (FERRY_MODULE_DIR, a colon-separated
 * list; the install directory by default).  A module exports exactly one
 * symbol, ferry_plugin_entry.  Loaded modules stay loaded for the life of
 * the process: their threads or atexit handlers may outlive an engine.
 */
#include "core.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef const ferry_plugin_t *(*builtin_fn_t)(void);
static const builtin_fn_t builtins[] = {ferry_tcp_plugin, ferry_shm_plugin, ferry_cxl_plugin,
                                         ferry_p2p_plugin, ferry_file_plugin};

int ferry_plugin_is_builtin(const ferry_plugin_t *plugin)
{
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(builtins); i++)
        if (builtins[i]() == plugin)
            return 1;
    return 0;
}

static pthread_mutex_t loaded_lock = PTHREAD_MUTEX_INITIALIZER;
static struct loaded_module {
    char path[512];
    const ferry_plugin_t *plugin;
} loaded[32];
static size_t loaded_count;

const char *ferry_plugin_default_dir(void)
{
    return FERRY_MODULE_DIR;
}

static const char *kind_name(ferry_plugin_kind_t kind)
{
    return kind == FERRY_PLUGIN_TRANSPORT ? "transport" : "metadata";
}

/* Load (once) the module at path; NULL with *why set when it is no plugin. */
static const ferry_plugin_t *module_load(const char *path, const char **why)
{
    const ferry_plugin_t *plugin = NULL;
    pthread_mutex_lock(&loaded_lock);
    for (size_t i = 0; i < loaded_count; i++) {
        if (strcmp(loaded[i].path, path) == 0) {
            plugin = loaded[i].plugin;
            goto out_unlock;
        }
    }
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (dl == NULL) {
        *why = dlerror();
        goto out_unlock;
    }
    ferry_plugin_entry_fn_t entry = (ferry_plugin_entry_fn_t)dlsym(dl, FERRY_PLUGIN_ENTRY_SYMBOL);
    plugin = entry ? entry() : NULL;
    if (plugin == NULL || plugin->abi_version != FERRY_PLUGIN_ABI_VERSION) {
        *why = plugin ? "plugin ABI version differs from libferry's" : "no ferry_plugin_entry";
        plugin = NULL;
        dlclose(dl);
        goto out_unlock;
    }
    if (loaded_count < FERRY_ARRAY_SIZE(loaded)) {
        snprintf(loaded[loaded_count].path, sizeof(loaded[0].path), "%s", path);
        loaded[loaded_count++].plugin = plugin;
    }
out_unlock:
    pthread_mutex_unlock(&loaded_lock);
    return plugin;
}

/* Calls visit(dir) for each entry of the colon-separated module path. */
static void for_each_dir(const char *module_dir, void (*visit)(const char *dir, void *arg),
                         void *arg)
{
    const char *path = module_dir && *module_dir ? module_dir : ferry_plugin_default_dir();
    char *copy = strdup(path);
    if (copy == NULL)
        return;
    char *save = NULL;
    for (char *dir = strtok_r(copy, ":", &save); dir; dir = strtok_r(NULL, ":", &save))
        visit(dir, arg);
    free(copy);
}

struct find_args {
    ferry_plugin_kind_t kind;
    const char *name;
    const ferry_plugin_t *found;
    char why[1200];
};

static void find_in_dir(const char *dir, void *arg)
{
    struct find_args *args = arg;
    char path[512];
    if (args->found)
        return;
    snprintf(path, sizeof(path), "%s/ferry_%s.so", dir, args->name);
    FILE *probe = fopen(path, "r");
    if (probe == NULL)
        return;
    fclose(probe);
    const char *why = "unknown error";
    const ferry_plugin_t *plugin = module_load(path, &why);
    if (plugin == NULL) {
        snprintf(args->why, sizeof(args->why), "%s: %s", path, why);
        return;
    }
    if (plugin->kind == args->kind && strcmp(plugin->name, args->name) == 0)
        args->found = plugin;
}

/* Built-in first, then the module path; args->why says why a module failed. */
static const ferry_plugin_t *plugin_lookup(const char *module_dir, struct find_args *args)
{
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(builtins); i++) {
        const ferry_plugin_t *plugin = builtins[i]();
        if (plugin->kind == args->kind && strcmp(plugin->name, args->name) == 0)
            return plugin;
    }
    for_each_dir(module_dir, find_in_dir, args);
    return args->found;
}

int ferry_plugin_available(const char *module_dir, ferry_plugin_kind_t kind, const char *name)
{
    struct find_args args = {.kind = kind, .name = name};
    return plugin_lookup(module_dir, &args) != NULL;
}

ferry_status_t ferry_plugin_find(const char *module_dir, ferry_plugin_kind_t kind,
                                 const char *name, const ferry_plugin_t **plugin_p)
{
    struct find_args args = {.kind = kind, .name = name};
    const ferry_plugin_t *plugin = plugin_lookup(module_dir, &args);
    if (plugin != NULL) {
        *plugin_p = plugin;
        return FERRY_OK;
    }
    if (args.why[0])
        ferry_error("%s plugin \"%s\" cannot be loaded: %s", kind_name(kind), name, args.why);
    else
        ferry_error("%s plugin \"%s\" is not built or not installed (module path: %s)",
                    kind_name(kind), name,
                    module_dir && *module_dir ? module_dir : ferry_plugin_default_dir());
    return FERRY_ERR_PLUGIN_NOT_FOUND;
}

static void list_add(ferry_plugin_list_t *list, const ferry_plugin_t *plugin)
{
    for (size_t i = 0; i < list->count; i++)
        if (list->plugins[i] == plugin || (list->plugins[i]->kind == plugin->kind &&
                                           strcmp(list->plugins[i]->name, plugin->name) == 0))
            return;
    if (list->count < FERRY_ARRAY_SIZE(list->plugins))
        list->plugins[list->count++] = plugin;
    else
        ferry_warn("more than %zu plugins found: %s plugin \"%s\" is left out (name it in "
                   "FERRY_TRANSPORTS or FERRY_METADATA to use it)",
                   FERRY_ARRAY_SIZE(list->plugins), kind_name(plugin->kind), plugin->name);
}

static void list_dir(const char *dir, void *arg)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        size_t len = strlen(ent->d_name);
        if (strncmp(ent->d_name, "ferry_", 6) != 0 || len < 4 ||
            strcmp(ent->d_name + len - 3, ".so") != 0)
            continue;
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, ent->d_name);
        const char *why = NULL;
        const ferry_plugin_t *plugin = module_load(path, &why);
        if (plugin)
            list_add(arg, plugin);
        else
            ferry_warn("%s is not a usable Ferry module: %s", path, why);
    }
    closedir(d);
}

void ferry_plugin_list_all(const char *module_dir, ferry_plugin_list_t *list)
{
    memset(list, 0, sizeof(*list));
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(builtins); i++)
        list_add(list, builtins[i]());
    for_each_dir(module_dir, list_dir, list);
}

void ferry_plugin_list_release(ferry_plugin_list_t *list)
{
    list->count = 0;
}
