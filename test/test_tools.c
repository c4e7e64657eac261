/* ferry_info and ferry_bench, run as a user runs them. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(tools, .timeout = 120);

/* Run a command; return its exit status and its stdout in out. */
static int run(const char *command, char *out, size_t len)
{
    FILE *pipe = popen(command, "r");
    cr_assert_not_null(pipe);
    size_t n = fread(out, 1, len - 1, pipe);
    out[n] = '\0';
    int status = pclose(pipe);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static char output[1 << 16];

Test(tools, ferry_info_lists_plugins_and_settings)
{
    char command[1024];
    snprintf(command, sizeof(command), "%s", getenv("FERRY_INFO"));
    cr_assert_eq(run(command, output, sizeof(output)), 0);
    cr_assert(strstr(output, "Ferry version") != NULL, "%s", output);
    cr_assert(strstr(output, "tcp") != NULL && strstr(output, "p2p") != NULL, "%s", output);
    snprintf(command, sizeof(command), "%s -c", getenv("FERRY_INFO"));
    cr_assert_eq(run(command, output, sizeof(output)), 0);
    const char *expected[] = {"FERRY_METADATA=", "FERRY_TRANSPORTS=", "FERRY_TCP_SLICE_SIZE=",
                              "FERRY_TCP_TIMEOUT=", "FERRY_RPC_TIMEOUT="};
    for (size_t i = 0; i < sizeof(expected) / sizeof(expected[0]); i++)
        cr_assert(strstr(output, expected[i]) != NULL, "missing %s", expected[i]);
    snprintf(command, sizeof(command), "%s --bogus 2>/dev/null", getenv("FERRY_INFO"));
    cr_assert_eq(run(command, output, sizeof(output)), 2);
}

Test(tools, every_setting_is_documented)
{
    char command[1024], path[1024];
    snprintf(command, sizeof(command), "%s -c", getenv("FERRY_INFO"));
    cr_assert_eq(run(command, output, sizeof(output)), 0);
    snprintf(path, sizeof(path), "%s/doc/configuration.md", getenv("FERRY_SRCDIR"));
    FILE *doc = fopen(path, "r");
    cr_assert_not_null(doc, "%s", path);
    static char text[1 << 18];
    text[fread(text, 1, sizeof(text) - 1, doc)] = '\0';
    fclose(doc);
    for (char *line = strtok(output, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, "FERRY_", 6) != 0)
            continue;
        char name[128], quoted[132];
        snprintf(name, sizeof(name), "%.*s", (int)strcspn(line, "="), line);
        snprintf(quoted, sizeof(quoted), "`%s`", name);
        cr_assert(strstr(text, quoted) != NULL, "%s is not in doc/configuration.md", name);
    }
}

Test(tools, ferry_info_names_an_unreachable_segment)
{
    char command[1024];
    snprintf(command, sizeof(command), "%s -s 127.0.0.1:1 2>&1", getenv("FERRY_INFO"));
    cr_assert_eq(run(command, output, sizeof(output)), 1);
    cr_assert(strstr(output, "127.0.0.1:1") != NULL, "%s", output);
}

static void bench(const char *args)
{
    char command[1024];
    snprintf(command, sizeof(command), "%s --spawn --duration=0.5 %s", getenv("FERRY_BENCH"), args);
    int rc = run(command, output, sizeof(output));
    cr_assert_eq(rc, 0, "%s exited %d:\n%s", command, rc, output);
    cr_assert(strstr(output, "RESULT ") != NULL, "%s", output);
    cr_assert(strstr(output, "status=ok") != NULL, "%s", output);
    cr_assert(strstr(output, "GB/s") != NULL, "%s", output);
}

Test(tools, bench_write_verified)
{
    bench("--operation=write --block-size=100000 --batch-size=8 --buffer-size=300000 --verify");
    cr_assert(strstr(output, "verified=yes") != NULL);
}

Test(tools, bench_read_verified_two_threads)
{
    bench("--operation=read --block-size=64k --batch-size=16 --threads=2 --verify");
}

/* Each side sees the other's sequence numbers land, round after round. */
static void pingpong(const char *transport)
{
    char command[1024];
    snprintf(command, sizeof(command), "%s --spawn --duration=0.5 --pingpong --block-size=8 %s%s",
             getenv("FERRY_BENCH"), transport ? "--transport=" : "", transport ? transport : "");
    int rc = run(command, output, sizeof(output));
    cr_assert_eq(rc, 0, "%s exited %d:\n%s", command, rc, output);
    const char *line = strstr(output, "PINGPONG ");
    cr_assert_not_null(line, "%s", output);
    double median = 0;
    unsigned long long trips = 0;
    cr_assert_eq(sscanf(strstr(line, "median_us="), "median_us=%lf", &median), 1);
    cr_assert_eq(sscanf(strstr(line, "round_trips="), "round_trips=%llu", &trips), 1);
    cr_assert_gt(median, 0.0);
    cr_assert_geq(trips, 32, "%s", output);
    cr_assert_not_null(strstr(line, "status=ok"), "%s", output);
}

Test(tools, bench_pingpong_over_tcp_shm_and_the_default)
{
    pingpong("tcp");
    pingpong("shm");
    pingpong(NULL);
}

Test(tools, bench_rejects_bad_options)
{
    char command[1024];
    snprintf(command, sizeof(command), "%s --block-size=abc 2>&1", getenv("FERRY_BENCH"));
    cr_assert_eq(run(command, output, sizeof(output)), 2);
    cr_assert(strstr(output, "block-size") != NULL);
    snprintf(command, sizeof(command), "%s --spawn --transport=nosuch 2>&1", getenv("FERRY_BENCH"));
    cr_assert_neq(run(command, output, sizeof(output)), 0);
    cr_assert(strstr(output, "nosuch") != NULL, "%s", output);
    snprintf(command, sizeof(command), "%s --spawn --pingpong --block-size=4 2>&1",
             getenv("FERRY_BENCH"));
    cr_assert_eq(run(command, output, sizeof(output)), 2);
    cr_assert(strstr(output, "at least 8 bytes") != NULL, "%s", output);
}

/* The test vendor's module, where make check builds it; NULL (and the
 * caller skips) when this build has none. */
static const char *testgpu_module(void)
{
    static char path[1024];
    const char *dir = getenv("FERRY_MODULE_DIR");
    snprintf(path, sizeof(path), "%s/ferry_testgpu_ipc.so", dir ? dir : ".");
    return access(path, R_OK) == 0 ? path : NULL;
}

Test(tools, ferry_info_lists_devices)
{
    char command[1024];
    snprintf(command, sizeof(command), "env -u FERRY_TESTGPU_DEVICES %s -d", getenv("FERRY_INFO"));
    cr_assert_eq(run(command, output, sizeof(output)), 0);
    cr_assert(strstr(output, "# devices") != NULL, "%s", output);
    if (testgpu_module() == NULL)
        cr_skip("no testgpu module in FERRY_MODULE_DIR: only the empty devices section checked");
    cr_assert(strstr(output, "testgpu  not usable: ") != NULL, "%s", output);
    cr_assert(strstr(output, "FERRY_TESTGPU_DEVICES") != NULL, "%s", output);
    /* Ordinals follow the visible list; UUIDs stay with the physical device. */
    snprintf(command, sizeof(command),
             "FERRY_TESTGPU_DEVICES=2 FERRY_TESTGPU_VISIBLE_DEVICES=1,0 %s -d",
             getenv("FERRY_INFO"));
    cr_assert_eq(run(command, output, sizeof(output)), 0);
    cr_assert(strstr(output, "testgpu  usable, 2 device(s)") != NULL, "%s", output);
    const char *zero = strstr(output, "testgpu:0  TESTGPU-");
    const char *one = strstr(output, "testgpu:1  TESTGPU-");
    cr_assert(zero != NULL && one != NULL, "%s", output);
    char uuid0[64] = "", uuid1[64] = "";
    cr_assert_eq(sscanf(zero, "testgpu:0 %63s", uuid0), 1);
    cr_assert_eq(sscanf(one, "testgpu:1 %63s", uuid1), 1);
    cr_assert_eq(uuid0[strlen(uuid0) - 1], '1', "testgpu:0 is physical device 1: %s", output);
    cr_assert_eq(uuid1[strlen(uuid1) - 1], '0', "testgpu:1 is physical device 0: %s", output);
}

/* Device memory (testgpu: a PROT_NONE view, so any CPU access by the
 * benchmark or the engine crashes it) on either side or both, each byte
 * checked through the engine. */
Test(tools, bench_device_memory_verified)
{
    if (testgpu_module() == NULL)
        cr_skip("no testgpu module in FERRY_MODULE_DIR: device memory not benchmarked");
    setenv("FERRY_TESTGPU_DEVICES", "2", 1);
    const char *cases[] = {
        "--memory=testgpu:0 --operation=write",
        "--memory=testgpu:1 --operation=read --threads=2",
        "--local-memory=cpu --remote-memory=testgpu:0 --transport=tcp --operation=write",
        "--local-memory=testgpu:0 --remote-memory=heap --transport=tcp --operation=read",
        "--local-memory=testgpu:0 --remote-memory=cpu --transport=shm --operation=write",
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char args[512];
        snprintf(args, sizeof(args), "%s --block-size=100000 --batch-size=4 --verify", cases[i]);
        bench(args);
        cr_assert(strstr(output, "verified=yes") != NULL, "%s", output);
        cr_assert(strstr(output, "_memory=testgpu:") != NULL, "%s", output);
    }
    unsetenv("FERRY_TESTGPU_DEVICES");
}

Test(tools, bench_window_and_first_request)
{
    bench("--block-size=64k --batch-size=2 --window=4");
    cr_assert(strstr(output, "window=4") != NULL, "%s", output);
    cr_assert(strstr(output, "local_memory=ferry remote_memory=ferry") != NULL, "%s", output);
    const char *first = strstr(output, "FIRST ");
    cr_assert_not_null(first, "%s", output);
    double us = 0;
    cr_assert_eq(sscanf(strstr(first, "first_us="), "first_us=%lf", &us), 1);
    cr_assert_gt(us, 0.0);
    cr_assert_not_null(strstr(first, "status=ok"), "%s", output);
}

Test(tools, bench_rejects_bad_memory_options)
{
    const char *bad[] = {"--memory='*'", "--local-memory=Cuda", "--remote-memory=cuda:",
                         "--pingpong --memory=cuda:0", "--window=2 --verify", "--window=0"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char command[1024];
        snprintf(command, sizeof(command), "%s --spawn %s 2>&1", getenv("FERRY_BENCH"), bad[i]);
        cr_assert_eq(run(command, output, sizeof(output)), 2, "%s: %s", bad[i], output);
    }
}

/* --local-buffer-size: the initiator's blocks wrap around a smaller buffer
 * than the target's (random reads over the whole target buffer into a few
 * local blocks, as fio keeps iodepth buffers); what it cannot go with is
 * refused. */
Test(tools, bench_local_buffer_smaller_than_the_target_s)
{
    bench("--operation=read --random --block-size=4k --batch-size=1 --window=4 "
          "--buffer-size=1m --local-buffer-size=16k");
    cr_assert(strstr(output, "buffer 1048576 B (here 16384 B)") != NULL, "%s", output);
    bench("--operation=write --block-size=4k --batch-size=8 --buffer-size=64k "
          "--local-buffer-size=8k");
    const char *bad[] = {"--local-buffer-size=0", "--local-buffer-size=2k --block-size=4k",
                         "--local-buffer-size=2m --buffer-size=1m",
                         "--local-buffer-size=64k --verify", "--local-buffer-size=64k --sweep",
                         "--local-buffer-size=64k --memcpy-baseline"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char command[1024];
        snprintf(command, sizeof(command), "%s --spawn %s 2>&1", getenv("FERRY_BENCH"), bad[i]);
        cr_assert_eq(run(command, output, sizeof(output)), 2, "%s: %s", bad[i], output);
        cr_assert(strstr(output, "local-buffer-size") != NULL, "%s: %s", bad[i], output);
    }
}

/* --sweep: one CSV row per block size of the range, each with its own
 * throughput and latency, on stdout alone (a plot reads it as it is). */
Test(tools, bench_sweep_one_row_per_size)
{
    char command[1024];
    snprintf(command, sizeof(command), "%s --spawn --sweep=1k:8k --duration=0.1 --batch-size=4 "
             "--memcpy-baseline --format=csv 2>/dev/null", getenv("FERRY_BENCH"));
    int rc = run(command, output, sizeof(output));
    cr_assert_eq(rc, 0, "%s exited %d:\n%s", command, rc, output);
    char *line = strtok(output, "\n");
    cr_assert_not_null(line);
    cr_assert(strncmp(line, "block_size,operation,transport,", 31) == 0, "%s", line);
    size_t want[] = {1024, 2048, 4096, 8192}, rows = 0;
    while ((line = strtok(NULL, "\n")) != NULL) {
        cr_assert_lt(rows, 4, "a row past the range: %s", line);
        size_t block = 0, batch = 0;
        unsigned threads = 0, window = 0;
        char operation[16], transport[32];
        double gbps = -1, per_s = -1, median = -1, p99 = -1, memcpy_gbps = -1;
        int n = sscanf(line, "%zu,%15[^,],%31[^,],%u,%zu,%u,%lf,%lf,%lf,%lf,%lf", &block,
                       operation, transport, &threads, &batch, &window, &gbps, &per_s, &median,
                       &p99, &memcpy_gbps);
        cr_assert_eq(n, 11, "%s", line);
        cr_assert_eq(block, want[rows], "%s", line);
        cr_assert_str_eq(operation, "write");
        cr_assert_eq(batch, 4);
        cr_assert(gbps > 0 && per_s > 0 && median > 0 && p99 >= median && memcpy_gbps > 0, "%s",
                  line);
        cr_assert(strstr(line, ",ok") != NULL, "%s", line);
        rows++;
    }
    cr_assert_eq(rows, 4, "%zu rows", rows);
}

Test(tools, bench_sweep_rejects_bad_ranges)
{
    const char *bad[] = {"--sweep=8k:1k", "--sweep=0:4k", "--sweep=4k", "--sweep=1:2g",
                         "--sweep --latency", "--sweep --pingpong", "--format=csv",
                         "--sweep --format=json"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char command[1024];
        snprintf(command, sizeof(command), "%s --spawn %s 2>&1", getenv("FERRY_BENCH"), bad[i]);
        cr_assert_eq(run(command, output, sizeof(output)), 2, "%s: %s", bad[i], output);
    }
}
