/* Settings tables: FERRY_<COMPONENT>_<NAME> variables parsed by type. */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void variable_name(const char *component, const char *name, char *out, size_t len)
{
    if (component != NULL && *component != '\0')
        snprintf(out, len, "FERRY_%s_%s", component, name);
    else
        snprintf(out, len, "FERRY_%s", name);
}

ferry_status_t ferry_setting_parse_size(const char *text, size_t *value_p)
{
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (end == text || errno != 0 || *text == '-')
        return FERRY_ERR_INVALID_PARAM;
    unsigned shift = 0;
    switch (tolower((unsigned char)*end)) {
    case 'k': shift = 10; end++; break;
    case 'm': shift = 20; end++; break;
    case 'g': shift = 30; end++; break;
    case 't': shift = 40; end++; break;
    default: break;
    }
    if (shift && tolower((unsigned char)*end) == 'b')
        end++;
    if (*end != '\0' || (shift && value > (~0ull >> shift)))
        return FERRY_ERR_INVALID_PARAM;
    *value_p = (size_t)(value << shift);
    return FERRY_OK;
}

static ferry_status_t parse_bool(const char *text, int *value_p)
{
    static const char *const yes[] = {"y", "yes", "1", "on", "true"};
    static const char *const no[] = {"n", "no", "0", "off", "false"};
    for (size_t i = 0; i < FERRY_ARRAY_SIZE(yes); i++) {
        if (strcasecmp(text, yes[i]) == 0) {
            *value_p = 1;
            return FERRY_OK;
        }
        if (strcasecmp(text, no[i]) == 0) {
            *value_p = 0;
            return FERRY_OK;
        }
    }
    return FERRY_ERR_INVALID_PARAM;
}

static ferry_status_t parse_uint(const char *text, unsigned *value_p, int time_ms)
{
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (end == text || errno != 0 || *text == '-')
        return FERRY_ERR_INVALID_PARAM;
    if (time_ms && strcmp(end, "s") == 0) {
        value *= 1000;
        end++;
    } else if (time_ms && strcmp(end, "ms") == 0) {
        end += 2;
    }
    if (*end != '\0' || value > ~0u)
        return FERRY_ERR_INVALID_PARAM;
    *value_p = (unsigned)value;
    return FERRY_OK;
}

static ferry_status_t parse_one(const ferry_setting_t *setting, const char *text, void *dst)
{
    void *field = (char *)dst + setting->offset;
    switch (setting->type) {
    case FERRY_SETTING_STRING: {
        char *copy = strdup(text);
        if (copy == NULL)
            return FERRY_ERR_NO_MEMORY;
        *(char **)field = copy;
        return FERRY_OK;
    }
    case FERRY_SETTING_SIZE: return ferry_setting_parse_size(text, (size_t *)field);
    case FERRY_SETTING_UINT: return parse_uint(text, (unsigned *)field, 0);
    case FERRY_SETTING_TIME_MS: return parse_uint(text, (unsigned *)field, 1);
    case FERRY_SETTING_BOOL: return parse_bool(text, (int *)field);
    }
    return FERRY_ERR_INVALID_PARAM;
}

ferry_status_t ferry_settings_read(const char *component, const ferry_setting_t *table,
                                   size_t count, void *dst)
{
    char name[128];
    for (size_t i = 0; i < count; i++) {
        variable_name(component, table[i].name, name, sizeof(name));
        const char *value = getenv(name);
        const char *text = value != NULL ? value : table[i].default_value;
        ferry_status_t status = parse_one(&table[i], text, dst);
        if (status != FERRY_OK) {
            ferry_error("%s=\"%s\" is not a valid value (%s)", name, text, table[i].doc);
            ferry_settings_release(table, i, dst);
            return status;
        }
    }
    return FERRY_OK;
}

void ferry_settings_release(const ferry_setting_t *table, size_t count, void *dst)
{
    for (size_t i = 0; i < count; i++) {
        if (table[i].type == FERRY_SETTING_STRING) {
            char **field = (char **)((char *)dst + table[i].offset);
            free(*field);
            *field = NULL;
        }
    }
}

void ferry_settings_print(FILE *out, const ferry_settings_table_t *table)
{
    char name[128];
    fprintf(out, "\n# ---- %s ----\n", table->title);
    for (size_t i = 0; i < table->count; i++) {
        const ferry_setting_t *setting = &table->settings[i];
        variable_name(table->component, setting->name, name, sizeof(name));
        const char *current = getenv(name);
        fprintf(out, "# %s\n", setting->doc);
        if (current != NULL)
            fprintf(out, "%s=%s   # default: %s\n", name, current, setting->default_value);
        else
            fprintf(out, "%s=%s\n", name, setting->default_value);
    }
}
