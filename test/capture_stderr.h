/* Tests that check what the library logs. */
#ifndef FERRY_TEST_CAPTURE_STDERR_H
#define FERRY_TEST_CAPTURE_STDERR_H

/* Run fn(arg) with this process's stderr going to a temporary file; returns
 * what was written (malloc-ed, NUL-terminated; NULL if it cannot capture). */
char *capture_stderr(void (*fn)(void *), void *arg);

#endif
