/* Memory locations: the strings ferry_register and ferry_alloc take. */
#include "util.h"

#include <string.h>

/* "name" or "name:N" (N anything non-empty: a NUMA node, a CXL node). */
static int location_kind(const char *location, const char *name)
{
    size_t n = strlen(name);
    return strncmp(location, name, n) == 0 &&
           (location[n] == '\0' || (location[n] == ':' && location[n + 1] != '\0'));
}

/* A kind is [a-z][a-z0-9_]*; a qualifier is [A-Za-z0-9_.-]+ (a device
 * ordinal, a NUMA node, a UUID). */
static int kind_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || (!first && ((c >= '0' && c <= '9') || c == '_'));
}

static int qualifier_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '.' || c == '-';
}

int ferry_location_valid(const char *location)
{
    if (location == NULL || *location == '\0')
        return 1;
    size_t i = 0;
    while (kind_char(location[i], i == 0))
        i++;
    if (i == 0)
        return 0;
    if (location[i] == ':') {
        size_t start = ++i;
        while (qualifier_char(location[i]))
            i++;
        if (i == start)
            return 0;
    }
    return location[i] == '\0' && i <= FERRY_LOCATION_MAX;
}

int ferry_location_is_host(const char *location)
{
    return location == NULL || *location == '\0' || location_kind(location, "cpu") ||
           location_kind(location, "cxl");
}

int ferry_location_is_cxl(const char *location)
{
    return location != NULL && location_kind(location, "cxl");
}

int ferry_location_is_kind(const char *location, const char *kind)
{
    return location != NULL && location_kind(location, kind);
}
