#include "shell_run.h"

#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

int shell_run(char *out, size_t out_size, const char *fmt, ...)
{
    char command[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(command, sizeof(command), fmt, ap);
    va_end(ap);
    char full[4200];
    snprintf(full, sizeof(full), "{ %s; } 2>&1", command);
    FILE *pipe = popen(full, "r");
    cr_assert_not_null(pipe);
    size_t n = fread(out, 1, out_size - 1, pipe);
    out[n] = '\0';
    int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

void shell_env_for_mpi_jobs(void)
{
    static char lsan[1200], asan[1200];
    const char *srcdir = getenv("FERRY_SRCDIR");
    snprintf(lsan, sizeof(lsan), "suppressions=%s/test/lsan-mpi.supp:print_suppressions=0",
             srcdir ? srcdir : ".");
    setenv("LSAN_OPTIONS", lsan, 1);
    const char *given = getenv("ASAN_OPTIONS");
    snprintf(asan, sizeof(asan), "%s%sfast_unwind_on_malloc=0", given ? given : "",
             given && *given ? ":" : "");
    setenv("ASAN_OPTIONS", asan, 1);
}
