/*
 * The harnesses' log sink: every log line the code under test writes is
 * formatted, as in the library, so a bad format argument (a string that is
 * not terminated, a wrong width) is caught by the sanitizers; the line is
 * then dropped, since printing millions of them would only slow the run.
 */
#include "fuzz_common.h"

#include <ferry/plugin.h>

#include <stdarg.h>
#include <string.h>

int ferry_log_level_current = FERRY_LOG_TRACE;

void ferry_log_write(ferry_log_level_t level, const char *file, int line, const char *fmt, ...)
{
    char message[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof(message), fmt, ap);
    va_end(ap);
    (void)level;
    (void)file;
    (void)line;
}

char *fuzz_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL);
    if (size > 0)
        memcpy(text, data, size);
    text[size] = '\0';
    return text;
}
