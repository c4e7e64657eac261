/* Command-line helpers shared by the tools. */
#ifndef FERRY_TOOL_ARGS_H
#define FERRY_TOOL_ARGS_H

#include <stddef.h>

/* "65536", "64k", "4m", "1g" (powers of 1024) -> *value_p; -1 when text is
 * not such a size or overflows. */
int ferry_tool_parse_size(const char *text, size_t *value_p);

#endif
