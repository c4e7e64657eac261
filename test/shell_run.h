/* Tests that run a command line (an MPI job, a tool) and look at what it printed. */
#ifndef FERRY_TEST_SHELL_RUN_H
#define FERRY_TEST_SHELL_RUN_H

#include <stddef.h>

/* Run the command through the shell; its stdout and stderr (the command's
 * own 2> wins) go to out, NUL-terminated, cut at out_size - 1 bytes.  Its
 * exit status, or 128 + the signal that ended it. */
int shell_run(char *out, size_t out_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* For MPI jobs started from a sanitizer build: MPI and PMIx keep memory
 * until exit, so only Ferry's own leaks are reported (test/lsan-mpi.supp,
 * in LSAN_OPTIONS), and ASan unwinds fully so that the suppressions match
 * frames under MPI's plugins (the fast unwinder stops at them: "<unknown
 * module>").  Sets the variables of this process, for the jobs it starts. */
void shell_env_for_mpi_jobs(void);

#endif
