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

int ferry_location_is_host(const char *location)
{
    return location == NULL || *location == '\0' || location_kind(location, "cpu") ||
           location_kind(location, "cxl");
}

int ferry_location_is_cxl(const char *location)
{
    return location != NULL && location_kind(location, "cxl");
}
