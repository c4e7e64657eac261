#include "forged_store.h"
#include "service_process.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

void forged_store_fetch(int port, const char *name, char *out, size_t size)
{
    char target[256];
    size_t length;
    snprintf(target, sizeof(target), "/metadata?key=ferry%%2Fsegments%%2F%s", name);
    cr_assert_eq(http_call(port, "GET", target, NULL, NULL, 0, out, size, &length), 200,
                 "segment %s is not in the store", name);
}

/* text with the first `find` replaced by `replace`, in out. */
static void replace_once(const char *text, const char *find, const char *replace, char *out,
                         size_t size)
{
    const char *hit = strstr(text, find);
    cr_assert_not_null(hit, "no %s in %s", find, text);
    int n = snprintf(out, size, "%.*s%s%s", (int)(hit - text), text, replace, hit + strlen(find));
    cr_assert(n > 0 && (size_t)n < size, "the forged descriptor does not fit");
}

void forged_store_publish(int port, const char *from, const char *to, const char *find,
                          const char *replace)
{
    static char json[1 << 17], renamed[1 << 17], forged[1 << 17];
    char name[300], new_name[300];
    forged_store_fetch(port, from, json, sizeof(json));
    snprintf(name, sizeof(name), "\"name\":\"%s\"", from);
    snprintf(new_name, sizeof(new_name), "\"name\":\"%s\"", to);
    replace_once(json, name, new_name, renamed, sizeof(renamed));
    if (find != NULL)
        replace_once(renamed, find, replace, forged, sizeof(forged));
    else
        snprintf(forged, sizeof(forged), "%s", renamed);
    char target[256];
    snprintf(target, sizeof(target), "/metadata?key=ferry%%2Fsegments%%2F%s", to);
    cr_assert_eq(http_call(port, "PUT", target, NULL, forged, strlen(forged), NULL, 0, NULL), 200);
}
