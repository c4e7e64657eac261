/* Command-line helpers shared by the tools: see tool_args.h. */
#include "tool_args.h"

#include <errno.h>
#include <stdlib.h>

int ferry_tool_parse_size(const char *text, size_t *value_p)
{
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (end == text || errno != 0 || *text == '-')
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end != '\0' || (shift && value > (~0ull >> shift)) || value << shift > (size_t)-1)
        return -1;
    *value_p = (size_t)(value << shift);
    return 0;
}

int ferry_tool_parse_count(const char *text, unsigned min, unsigned max, unsigned *value_p)
{
    char *end;
    errno = 0;
    unsigned long value = strtoul(text, &end, 10);
    if (end == text || *end != '\0' || errno != 0 || *text == '-' || value < min ||
        value > max)
        return -1;
    *value_p = (unsigned)value;
    return 0;
}
