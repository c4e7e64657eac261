/* Command-line helpers shared by the tools. */
#ifndef FERRY_TOOL_ARGS_H
#define FERRY_TOOL_ARGS_H

#include <stddef.h>

/* "65536", "64k", "4m", "1g" (powers of 1024) -> *value_p; -1 when text is
 * not such a size or overflows. */
int ferry_tool_parse_size(const char *text, size_t *value_p);
/* Decimal digits of a count in [min, max] -> *value_p; -1 (nothing
 * stored) for anything else: empty, a sign, other characters, out of range. */
int ferry_tool_parse_count(const char *text, unsigned min, unsigned max, unsigned *value_p);

#endif
