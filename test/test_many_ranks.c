/*
 * Many engines at once: ferry_bench_scale's all-to-all (every engine opens
 * every other engine's segment and writes a slot that its owner checks)
 * through each store -- p2p, redis, etcd, ferry_metad (http) and the pmix
 * store of an mpirun job -- with 64 engines (32 under the sanitizers, which
 * make each one several times dearer).  Each store part skips when its
 * server, module or launcher is missing.  The store's own count of the
 * requests is checked where it keeps one: a segment open costs it one read.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service_process.h"
#include "shell_run.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define PROCESSES 4
#else
#define PROCESSES 8
#endif
#define ENGINES_PER_PROCESS 8
#define ENGINES (PROCESSES * ENGINES_PER_PROCESS)
#define PAIRS ((unsigned long long)ENGINES * (ENGINES - 1))

static char output[1 << 16];

static void setup(void)
{
    unsetenv("FERRY_METADATA");
    unsetenv("FERRY_SEGMENT_NAME");
    setenv("FERRY_RPC_ADDRESS", "127.0.0.1", 1);
    /* Engine log lines only when something is wrong. */
    setenv("FERRY_LOG_LEVEL", "error", 1);
}

TestSuite(many_ranks, .init = setup, .fini = service_cleanup_all, .timeout = 600);

/* A shell command; its output (stdout and stderr) goes to `output`. */
#define run(...) shell_run(output, sizeof(output), __VA_ARGS__)

static const char *bench(void)
{
    const char *path = getenv("FERRY_BENCH_SCALE");
    cr_assert_not_null(path, "FERRY_BENCH_SCALE is not set (make check sets it)");
    return path;
}

/* A number from the RESULT line: "key=value". */
static unsigned long long result(const char *key)
{
    const char *line = strstr(output, "RESULT ");
    cr_assert_not_null(line, "no RESULT line:\n%s", output);
    char pattern[64];
    snprintf(pattern, sizeof(pattern), " %s=", key);
    const char *at = strstr(line, pattern);
    cr_assert_not_null(at, "no %s in the RESULT line:\n%s", key, output);
    return strtoull(at + strlen(pattern), NULL, 10);
}

/* Every open and write went through and every slot held its bytes. */
static void all_to_all(const char *store_args)
{
    int rc = run("timeout -k 5 500 %s -p %d -e %d %s", bench(), PROCESSES, ENGINES_PER_PROCESS,
                 store_args);
    cr_assert_eq(rc, 0, "ferry_bench_scale %s: exit %d\n%s", store_args, rc, output);
    cr_assert_eq(result("engines"), ENGINES, "%s", output);
    cr_assert_eq(result("failures"), 0, "%s", output);
    cr_log_info("%s", strstr(output, "# time to full connectivity"));
}

static void require(service_kind_t kind)
{
    const char *missing = service_missing(kind);
    if (missing != NULL)
        cr_skip_test("%s", missing);
}

Test(many_ranks, p2p_all_to_all)
{
    all_to_all("-m p2p");
    /* p2p: every open fetches the descriptor from its owner over RPC. */
    cr_assert_geq(result("rpc_served"), PAIRS, "%s", output);
}

/* The calls redis counted for one command (INFO commandstats). */
static unsigned long long redis_calls(int port, const char *command)
{
    static char info[1 << 14];
    const char *argv[] = {"INFO", "commandstats"};
    size_t lengths[] = {4, 12};
    long length = 0;
    cr_assert_eq(redis_call(port, 2, argv, lengths, info, sizeof(info), &length), '$');
    char key[64];
    snprintf(key, sizeof(key), "cmdstat_%s:calls=", command);
    const char *at = strstr(info, key);
    return at ? strtoull(at + strlen(key), NULL, 10) : 0;
}

Test(many_ranks, redis_all_to_all)
{
    require(SERVICE_REDIS);
    service_t redis;
    cr_assert_eq(service_start(&redis, SERVICE_REDIS, NULL), 0);
    unsigned long long gets = redis_calls(redis.port, "get");
    char args[600];
    snprintf(args, sizeof(args), "-m %s", redis.uri);
    all_to_all(args);
    cr_assert_geq(redis_calls(redis.port, "get") - gets, PAIRS);
    service_cleanup(&redis);
}

Test(many_ranks, etcd_all_to_all)
{
    require(SERVICE_ETCD);
    service_t etcd;
    cr_assert_eq(service_start(&etcd, SERVICE_ETCD, NULL), 0);
    char args[600];
    snprintf(args, sizeof(args), "-m %s", etcd.uri);
    all_to_all(args);
    service_cleanup(&etcd);
}

/* ferry_metad's count of the GETs it answered (its /health). */
static unsigned long long metad_gets(int port)
{
    static char health[1024];
    cr_assert_eq(http_call(port, "GET", "/health", NULL, NULL, 0, health, sizeof(health), NULL),
                 200);
    const char *at = strstr(health, "\"get\":");
    cr_assert_not_null(at, "%s", health);
    return strtoull(at + 6, NULL, 10);
}

Test(many_ranks, http_all_to_all_through_ferry_metad)
{
    require(SERVICE_METAD);
    service_t metad;
    cr_assert_eq(service_start(&metad, SERVICE_METAD, NULL), 0);
    unsigned long long gets = metad_gets(metad.port);
    char args[600];
    snprintf(args, sizeof(args), "-m %s", metad.uri);
    all_to_all(args);
    cr_assert_geq(metad_gets(metad.port) - gets, PAIRS);
    service_cleanup(&metad);
}

Test(many_ranks, pmix_all_to_all_under_mpirun)
{
    if (!service_module_built("pmix"))
        cr_skip_test("the pmix module is not built (libpmix-dev missing)");
    const char *mpirun = getenv("FERRY_MPIRUN");
    if (mpirun == NULL || *mpirun == '\0')
        cr_skip_test("mpirun is not installed");
    shell_env_for_mpi_jobs();
    unsetenv("PMIX_NAMESPACE");
    unsetenv("PMIX_RANK");
    /* One rank per process as a job has them, each with two engines: the
     * rank's own ("rank:N") and a named one, found in the ranks' snapshots. */
    int rc = run("timeout -k 5 500 %s --allow-run-as-root --oversubscribe --bind-to none -np %d "
                 "%s -e 2", mpirun, ENGINES / 2, bench());
    cr_assert_eq(rc, 0, "mpirun ferry_bench_scale: exit %d\n%s", rc, output);
    cr_assert_eq(result("engines"), ENGINES, "%s", output);
    cr_assert_eq(result("failures"), 0, "%s", output);
    /* Each engine published (put and commit) and every open read the store. */
    cr_assert_geq(result("pmix_put"), ENGINES, "%s", output);
    cr_assert_geq(result("pmix_commit"), ENGINES, "%s", output);
    cr_assert_geq(result("pmix_get"), PAIRS, "%s", output);
}

/* A store that does not answer: every open fails, the run says so and
 * ends with an error, in bounded time, nothing hangs. */
Test(many_ranks, a_dead_store_fails_cleanly)
{
    require(SERVICE_REDIS);
    int port = service_free_port();
    /* -T 2: the wait for the segments to be published ends in 2 s */
    int rc = run("FERRY_LOG_LEVEL=error timeout -k 5 120 %s -p 2 -e 2 -T 2 -m redis://127.0.0.1:%d",
                 bench(), port);
    cr_assert_eq(rc, 1, "exit %d\n%s", rc, output);
    cr_assert(strstr(output, "failed opens 12") != NULL, "%s", output);
    cr_assert(strstr(output, "ferry_bench_scale: engine 0: open") != NULL, "%s", output);
    cr_assert(strstr(output, "not published in 2 s") != NULL, "%s", output);
}

/* Bad options: one line, exit 2, nothing started. */
Test(many_ranks, bad_options_are_refused)
{
    cr_assert_eq(run("%s -p 0", bench()), 2, "%s", output);
    cr_assert(strstr(output, "-p takes 1..65536") != NULL, "%s", output);
    cr_assert_eq(run("%s -s 2m", bench()), 2, "%s", output);
    cr_assert(strstr(output, "-s takes a size") != NULL, "%s", output);
    cr_assert_eq(run("%s -p 300 -e 300", bench()), 2, "%s", output);
    cr_assert(strstr(output, "at most 65536 engines") != NULL, "%s", output);
}
