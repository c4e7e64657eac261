/* Tests that run a command line and look at what it printed. */
#ifndef FERRY_TEST_SHELL_RUN_H
#define FERRY_TEST_SHELL_RUN_H

#include <stddef.h>

/* Run the command through the shell; its stdout and stderr (the command's
 * own 2> wins) go to out, NUL-terminated, cut at out_size - 1 bytes.  Its
 * exit status, or 128 + the signal that ended it. */
int shell_run(char *out, size_t out_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
