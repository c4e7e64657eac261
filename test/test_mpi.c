/*
 * MPI jobs: ferry_test_mpi and the ferry_osu_* benchmarks launched by mpirun
 * and by srun --mpi=pmix, finding each other through the launcher's PMIx
 * store.  The mpirun part skips when mpirun or the pmix module is missing;
 * the srun part when no Slurm answers (contrib/slurm-single-node.sh start
 * brings one up; .ci/run does).
 */
#include <criterion/criterion.h>

#include <regex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shell_run.h"

#define OUTPUT_MAX (1 << 16)

static char output[OUTPUT_MAX];

static void setup(void)
{
    /* A PMIx job around `make check` must not leak into the jobs we start. */
    unsetenv("PMIX_NAMESPACE");
    unsetenv("PMIX_RANK");
    unsetenv("FERRY_METADATA");
    unsetenv("FERRY_SEGMENT_NAME");
    /* Segment descriptors carry loopback addresses: one host. */
    setenv("FERRY_RPC_ADDRESS", "127.0.0.1", 1);
    shell_env_for_mpi_jobs();
}

TestSuite(mpi, .init = setup, .timeout = 300);

/* A shell command; its output (stdout and stderr) goes to `output`. */
#define run(...) shell_run(output, sizeof(output), __VA_ARGS__)

static const char *builddir(void)
{
    const char *dir = getenv("FERRY_BUILDDIR");
    return dir ? dir : ".";
}

static void require_pmix_module(void)
{
    char path[1024];
    const char *dir = getenv("FERRY_MODULE_DIR");
    snprintf(path, sizeof(path), "%s/ferry_pmix.so", dir ? dir : ".");
    if (access(path, R_OK) != 0)
        cr_skip_test("the pmix module is not built (libpmix-dev missing)");
}

/* The launcher's command prefix for n ranks. */
static const char *launcher(const char *which, int n)
{
    static char prefix[1024];
    require_pmix_module();
    if (strcmp(which, "mpirun") == 0) {
        const char *mpirun = getenv("FERRY_MPIRUN");
        if (mpirun == NULL || *mpirun == '\0')
            cr_skip_test("mpirun is not installed");
        /* root needs --allow-run-as-root; 2 cores need --oversubscribe */
        snprintf(prefix, sizeof(prefix),
                 "timeout -k 5 240 %s --allow-run-as-root --oversubscribe --bind-to none "
                 "-np %d", mpirun, n);
    } else {
        if (system("command -v srun >/dev/null 2>&1 && "
                   "timeout 5 scontrol ping 2>/dev/null | grep -q UP") != 0)
            cr_skip_test("no Slurm answers (contrib/slurm-single-node.sh start)");
        /* -O: more tasks than CPUs */
        snprintf(prefix, sizeof(prefix),
                 "timeout -k 5 240 srun --mpi=pmix -n %d -O -t 5 --kill-on-bad-exit=1", n);
    }
    return prefix;
}

static int count(const char *needle)
{
    int n = 0;
    for (const char *p = output; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

/* Every rank said OK, and the job ended well. */
static void job(const char *which, int n, const char *args)
{
    int rc = run("%s %s/ferry_test_mpi %s", launcher(which, n), builddir(), args);
    cr_assert_eq(rc, 0, "%s -n %d ferry_test_mpi %s: exit %d\n%s", which, n, args, rc, output);
    for (int r = 0; r < n; r++) {
        char line[32];
        snprintf(line, sizeof(line), "rank %d: OK", r);
        cr_assert_eq(count(line), 1, "no \"%s\" from %s:\n%s", line, which, output);
    }
}

/* ---------------- discovery and byte-verified transfers ---------------- */

Test(mpi, mpirun_two_ranks_find_each_other_and_move_bytes)
{
    job("mpirun", 2, "alltoall 1048576");
}

Test(mpi, srun_two_ranks_find_each_other_and_move_bytes)
{
    job("srun", 2, "alltoall 1048576");
}

Test(mpi, mpirun_late_registration_and_segments_by_name)
{
    job("mpirun", 2, "late");
}

Test(mpi, srun_late_registration_and_segments_by_name)
{
    job("srun", 2, "late");
}

Test(mpi, mpirun_alltoall_eight_oversubscribed_ranks)
{
    job("mpirun", 8, "alltoall 65536");
}

Test(mpi, srun_alltoall_eight_oversubscribed_ranks)
{
    job("srun", 8, "alltoall 65536");
}

/* Outside a launcher: one clear line, an error status, no hang. */
Test(mpi, pmix_outside_a_launcher_is_a_clear_error)
{
    require_pmix_module();
    int rc = run("timeout -k 5 60 env FERRY_LOG_LEVEL=warn %s/ferry_test_mpi nolauncher",
                 builddir());
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, output);
    cr_assert_eq(count("\n"), 2, "one log line and the status, got:\n%s", output);
    cr_assert(strstr(output, "not started by a PMIx launcher") != NULL, "%s", output);
    cr_assert(strstr(output, "status metadata") != NULL, "%s", output);
}

/* ---------------- OSU-style benchmarks ---------------- */

static const char *const osu_programs[] = {
    "ferry_osu_put_latency", "ferry_osu_get_latency", "ferry_osu_put_bw", "ferry_osu_get_bw",
    "ferry_osu_put_bibw",
};

/* OSU's layout: '#' header lines, "# Size" then the unit in %-10s%20s, one
 * "%-10d%20.2f" line per size from 1 to max, doubling. */
static void check_osu_output(const char *program, size_t max)
{
    int latency = strstr(program, "latency") != NULL;
    char head[64];
    snprintf(head, sizeof(head), "%-10s%20s\n", "# Size",
             latency ? "Latency (us)" : "Bandwidth (MB/s)");
    const char *table = strstr(output, head);
    cr_assert_not_null(table, "%s: no \"%s\" line:\n%s", program, head, output);
    cr_assert_eq(strncmp(output, "# OSU ", 6), 0, "%s: starts with:\n%s", program, output);
    regex_t line;
    cr_assert_eq(regcomp(&line, "^[0-9]+ *  *[0-9]+\\.[0-9][0-9]$", REG_EXTENDED | REG_NOSUB),
                 0);
    const char *p = table + strlen(head);
    size_t expect = 1;
    while (*p != '\0') {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char text[128];
        snprintf(text, sizeof(text), "%.*s", (int)len, p);
        if (text[0] != '\0' && text[0] != '#') {
            char want[16];
            snprintf(want, sizeof(want), "%-10zu", expect);
            cr_assert_eq(len, 30, "%s: \"%s\" is not %%-10d%%20.2f", program, text);
            cr_assert_eq(strncmp(text, want, 10), 0, "%s: size %zu expected: \"%s\"", program,
                         expect, text);
            cr_assert_eq(regexec(&line, text, 0, NULL, 0), 0, "%s: \"%s\"", program, text);
            cr_assert_gt(strtod(text + 10, NULL), 0.0, "%s: \"%s\"", program, text);
            expect *= 2;
        }
        p += len + (end != NULL);
    }
    regfree(&line);
    cr_assert_eq(expect, max * 2, "%s: sizes stop before %zu:\n%s", program, max, output);
}

static void osu_sweep(const char *which, const char *api)
{
    for (size_t i = 0; i < sizeof(osu_programs) / sizeof(osu_programs[0]); i++) {
        int latency = strstr(osu_programs[i], "latency") != NULL;
        /* stdout only: the table must parse without log lines in it */
        int rc = run("%s %s/%s -m 4096 -i 20 -x 2 %s --api=%s 2>/dev/null", launcher(which, 2),
                     builddir(), osu_programs[i], latency ? "" : "-W 8", api);
        cr_assert_eq(rc, 0, "%s --api=%s: exit %d\n%s", osu_programs[i], api, rc, output);
        check_osu_output(osu_programs[i], 4096);
    }
}

Test(mpi, mpirun_osu_binaries_speak_the_osu_format)
{
    osu_sweep("mpirun", "ferry");
    osu_sweep("mpirun", "mpi");
}

Test(mpi, srun_osu_binaries_speak_the_osu_format)
{
    osu_sweep("srun", "ferry");
}

Test(mpi, osu_bad_options_are_refused)
{
    const char *prefix = launcher("mpirun", 2);
    int rc = run("%s %s/ferry_osu_put_bw -m 0 2>&1", prefix, builddir());
    cr_assert_neq(rc, 0, "-m 0 accepted:\n%s", output);
    cr_assert(strstr(output, "-m takes") != NULL, "%s", output);
    rc = run("%s %s/ferry_osu_put_latency --api=shmem 2>&1", prefix, builddir());
    cr_assert_neq(rc, 0);
    cr_assert(strstr(output, "--api is ferry, mpi or both") != NULL, "%s", output);
    rc = run("%s %s/ferry_osu_get_bw --passive-wait=nap 2>&1", prefix, builddir());
    cr_assert_neq(rc, 0);
    cr_assert(strstr(output, "--passive-wait is spin or sleep") != NULL, "%s", output);
}

/* Both ways of waiting at the end of a size, both APIs in one job. */
Test(mpi, osu_passive_rank_waits_either_way)
{
    static const char *const waits[] = {"sleep", "spin"};
    for (int i = 0; i < 2; i++) {
        int rc = run("%s %s/ferry_osu_put_bw -m 4096 -i 20 -x 2 -W 8 --api=both "
                     "--passive-wait=%s 2>/dev/null",
                     launcher("mpirun", 2), builddir(), waits[i]);
        cr_assert_eq(rc, 0, "--passive-wait=%s: exit %d\n%s", waits[i], rc, output);
        int says = strstr(output, "# Passive rank: sleeps") != NULL;
        cr_assert_eq(says, i == 0, "--passive-wait=%s header:\n%s", waits[i], output);
        char *mpi_table = strstr(output, "\n\n# OSU MPI_Put");
        cr_assert_not_null(mpi_table, "no MPI table:\n%s", output);
        mpi_table[1] = '\0'; /* the Ferry table first */
        check_osu_output("ferry_osu_put_bw", 4096);
        memmove(output, mpi_table + 2, strlen(mpi_table + 2) + 1);
        check_osu_output("ferry_osu_put_bw", 4096);
    }
}
