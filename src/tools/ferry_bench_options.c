/* ferry_bench's command line: the options, their checks and defaults. */
#include "ferry_bench.h"
#include "tool_args.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
        "Usage: ferry_bench [--spawn | --mode=target | --mode=initiator --segment=NAME] [options]\n"
        "  --spawn               start a target process and run the initiator against it\n"
        "  --mode=MODE           target (register a buffer, serve until SIGTERM) or initiator\n"
        "  --metadata=URI        metadata store (default: FERRY_METADATA, else p2p)\n"
        "  --segment=NAME        initiator: the target's segment name\n"
        "  --operation=OP        read or write (default write)\n"
        "  -b, --block-size=BYTES  bytes per request (default 64k; k/m/g suffixes)\n"
        "  -B, --batch-size=N    requests per batch (default 128)\n"
        "  -t, --threads=N       initiator threads, each with its own batch (default 1)\n"
        "  -d, --duration=SECONDS  initiator run time (default 5)\n"
        "  --buffer-size=BYTES   buffer per thread on both sides (default batch x block, at\n"
        "                        most 64m; blocks wrap around it)\n"
        "  --local-buffer-size=BYTES  the initiator's buffer per thread only (default\n"
        "                        --buffer-size, at most that): the block a request reads\n"
        "                        into or writes from wraps around it, so a random I/O\n"
        "                        run can keep fio's footprint (its iodepth x block\n"
        "                        buffers) while its target offsets span the whole file;\n"
        "                        requests may then share a local block (not with\n"
        "                        --verify, --pingpong, --sweep or --memcpy-baseline)\n"
        "  --transport=NAME      transports to enable (sets FERRY_TRANSPORTS)\n"
        "  --via=NAME            every request names that transport (ferry_request_t's\n"
        "                        transport field) instead of the engine choosing one\n"
        "  --memory=MEMORY       both sides' buffers: ferry (default): ferry_alloc at \"cpu\",\n"
        "                        the memory the transports reach best; heap: malloc-ed\n"
        "                        memory registered with ferry_register; any other\n"
        "                        location is given to ferry_alloc: cpu, cxl (the CXL window\n"
        "                        of FERRY_CXL_PATH), cuda:0, hip:0, testgpu:0 (device\n"
        "                        memory: filled and checked through the engine only)\n"
        "                        file:PATH: the target's buffer is a storage buffer, the\n"
        "                        first bytes of the file or block device PATH (a file is\n"
        "                        made or grown to the buffer's size); the initiator's\n"
        "                        buffers stay \"ferry\" (a request's local side is memory)\n"
        "  --random              each request at a random block of the buffer (as fio's\n"
        "                        randread and randwrite), not the next one\n"
        "  --local-memory=MEMORY   the initiator's buffers only\n"
        "  --remote-memory=MEMORY  the target's buffer only\n"
        "  --window=N            batches each thread keeps in flight (default 1): with\n"
        "                        --batch-size=1, N requests in flight at all times\n"
        "  --memcpy-baseline     first measure single-thread memcpy of the same blocks\n"
        "                        between two buffers of this process, of the --memory\n"
        "                        kind the benchmark uses, and print it\n"
        "  --verify              check every byte moved (throughput then means little)\n"
        "  --latency             one request per batch, timed from submit to completion\n"
        "                        (a write completes once in the target's memory); prints\n"
        "                        the median and 99th percentile in microseconds of the\n"
        "                        mean of each 32 consecutive requests\n"
        "  --pingpong            writes back and forth: each side writes a block into the\n"
        "                        other's buffer, waits for completion and polls its own\n"
        "                        buffer for the reply (as ucx_perftest put_lat and OSU\n"
        "                        latency do); prints half the round trip (median, 99th\n"
        "                        percentile of 32-round-trip means); block >= 8 bytes\n"
        "  --sweep[=MIN:MAX]     block sizes MIN, 2 MIN, 4 MIN ... up to MAX (default 1:4m;\n"
        "                        k/m/g suffixes) in one run against one target: for each,\n"
        "                        throughput as above, then latency as --latency measures it,\n"
        "                        and memcpy with --memcpy-baseline; one row per size.\n"
        "                        --duration is per size and measurement (default 0.5 with\n"
        "                        --sweep); each size's blocks wrap around window x batch x\n"
        "                        block (at most --buffer-size, default window x batch x MAX,\n"
        "                        at most 64m)\n"
        "  --format=FORMAT       --sweep's rows: table (default) or csv (a header line,\n"
        "                        then one line per size; the other lines go to stderr)\n"
        "  --stats               after the run, the engine's statistics (requests,\n"
        "                        failures, bytes, latency percentiles per transport and\n"
        "                        per peer: ferry_stats_snapshot) as a table and STATS lines\n"
        "Before the run, the time of the first request to the target (a request of at\n"
        "most 64 bytes, submit to completion: connections and GPU IPC opens included)\n"
        "is printed on a line starting with FIRST.\n"
        "Prints throughput in GB/s (10^9 bytes per second) and requests per second.\n"
        "ferry_bench --metadata-ops [--metadata=URI] measures the metadata store instead\n"
        "(see ferry_bench --metadata-ops --help).\n");
}

int ferry_bench_parse_options(int argc, char **argv, ferry_bench_options_t *o)
{
    static const struct option long_options[] = {
        {"mode", required_argument, NULL, 'M'},      {"metadata", required_argument, NULL, 'm'},
        {"segment", required_argument, NULL, 's'},   {"operation", required_argument, NULL, 'o'},
        {"block-size", required_argument, NULL, 'b'}, {"batch-size", required_argument, NULL, 'B'},
        {"threads", required_argument, NULL, 't'},   {"duration", required_argument, NULL, 'd'},
        {"buffer-size", required_argument, NULL, 'S'}, {"transport", required_argument, NULL, 'T'},
        {"verify", no_argument, NULL, 'v'},          {"spawn", no_argument, NULL, 'P'},
        {"latency", no_argument, NULL, 'L'},          {"memory", required_argument, NULL, 'A'},
        {"memcpy-baseline", no_argument, NULL, 'C'}, {"pingpong", no_argument, NULL, 'G'},
        {"via", required_argument, NULL, 'V'},
        {"local-memory", required_argument, NULL, 'l'},
        {"remote-memory", required_argument, NULL, 'r'},
        {"window", required_argument, NULL, 'W'},
        {"sweep", optional_argument, NULL, 'w'},
        {"format", required_argument, NULL, 'F'},
        {"random", no_argument, NULL, 'R'},
        {"stats", no_argument, NULL, 'X'},
        {"local-buffer-size", required_argument, NULL, 'U'},
        {"help", no_argument, NULL, 'h'},            {NULL, 0, NULL, 0},
    };
    *o = (ferry_bench_options_t){.mode = "initiator", .write = 1, .block_size = 65536, .batch_size = 128,
                     .threads = 1, .duration = 5.0, .window = 1, .local_memory = "ferry",
                     .remote_memory = "ferry"};
    int opt, duration_given = 0;
    char *end;
    /* Short options for the ones a benchmark run changes most. */
    while ((opt = getopt_long(argc, argv, "hb:B:t:d:", long_options, NULL)) != -1) {
        switch (opt) {
        case 'M': o->mode = optarg; break;
        case 'm': o->metadata = optarg; break;
        case 's': o->segment = optarg; break;
        case 'T': o->transport = optarg; break;
        case 'v': o->verify = 1; break;
        case 'L': o->latency = 1; break;
        case 'G': o->pingpong = 1; break;
        case 'V': o->via = optarg; break;
        case 'C': o->baseline = 1; break;
        case 'P': o->spawn = 1; break;
        case 'w':
            if (ferry_bench_sweep_parse(optarg, o))
                return -1;
            break;
        case 'F':
            o->csv = strcmp(optarg, "csv") == 0;
            if (!o->csv && strcmp(optarg, "table")) {
                fprintf(stderr, "ferry_bench: --format is table or csv, not %s\n", optarg);
                return -1;
            }
            break;
        case 'X': o->stats = 1; break;
        case 'A':
        case 'l':
        case 'r':
            if (!ferry_bench_memory_valid(optarg)) {
                fprintf(stderr, "ferry_bench: --%s is ferry, heap or a location (cpu, cxl, "
                        "cuda:0, ...), not %s\n", opt == 'A' ? "memory" : opt == 'l' ?
                        "local-memory" : "remote-memory", optarg);
                return -1;
            }
            if (opt == 'l' && ferry_bench_memory_is_storage(optarg)) {
                fprintf(stderr, "ferry_bench: --local-memory cannot be storage: a request's "
                        "local buffer is memory (--remote-memory=%s)\n", optarg);
                return -1;
            }
            if (opt != 'r' && !ferry_bench_memory_is_storage(optarg))
                o->local_memory = optarg;
            if (opt != 'l')
                o->remote_memory = optarg;
            break;
        case 'R': o->random = 1; break;
        case 'W':
            if (ferry_tool_parse_count(optarg, 1, 1024, &o->window)) {
                fprintf(stderr, "ferry_bench: --window is 1..1024\n");
                return -1;
            }
            break;
        case 'o':
            if (strcmp(optarg, "write") && strcmp(optarg, "read")) {
                fprintf(stderr, "ferry_bench: --operation is read or write, not %s\n", optarg);
                return -1;
            }
            o->write = strcmp(optarg, "write") == 0;
            break;
        case 'b':
            if (ferry_tool_parse_size(optarg, &o->block_size) || o->block_size == 0) {
                fprintf(stderr, "ferry_bench: bad --block-size %s\n", optarg);
                return -1;
            }
            break;
        case 'B':
            if (ferry_tool_parse_size(optarg, &o->batch_size) || o->batch_size == 0) {
                fprintf(stderr, "ferry_bench: bad --batch-size %s\n", optarg);
                return -1;
            }
            break;
        case 'S':
            if (ferry_tool_parse_size(optarg, &o->buffer_size) || o->buffer_size == 0) {
                fprintf(stderr, "ferry_bench: bad --buffer-size %s\n", optarg);
                return -1;
            }
            break;
        case 'U':
            if (ferry_tool_parse_size(optarg, &o->local_buffer_size) ||
                o->local_buffer_size == 0) {
                fprintf(stderr, "ferry_bench: bad --local-buffer-size %s\n", optarg);
                return -1;
            }
            break;
        case 't':
            if (ferry_tool_parse_count(optarg, 1, 256, &o->threads)) {
                fprintf(stderr, "ferry_bench: --threads is 1..256\n");
                return -1;
            }
            break;
        case 'd':
            o->duration = strtod(optarg, &end);
            if (*end || o->duration < 0) {
                fprintf(stderr, "ferry_bench: bad --duration %s\n", optarg);
                return -1;
            }
            duration_given = 1;
            break;
        case 'h': usage(stdout); exit(0);
        default: usage(stderr); return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry_bench: unexpected argument %s\n", argv[optind]);
        return -1;
    }
    if (strcmp(o->mode, "target") && strcmp(o->mode, "initiator")) {
        fprintf(stderr, "ferry_bench: --mode is target or initiator\n");
        return -1;
    }
    if (o->pingpong && (o->block_size < 8 || !o->write || o->threads != 1 || o->verify)) {
        fprintf(stderr, "ferry_bench: --pingpong writes blocks of at least 8 bytes, one "
                "thread, no --verify\n");
        return -1;
    }
    if (o->pingpong && (ferry_bench_memory_is_device(o->local_memory) ||
                        ferry_bench_memory_is_device(o->remote_memory))) {
        fprintf(stderr, "ferry_bench: --pingpong polls its buffers with the CPU: host memory "
                "only\n");
        return -1;
    }
    if (o->random && (o->verify || o->pingpong)) {
        fprintf(stderr, "ferry_bench: --random goes with neither --verify nor --pingpong\n");
        return -1;
    }
    if (o->window > 1 && (o->verify || o->latency || o->pingpong)) {
        fprintf(stderr, "ferry_bench: --window keeps one batch in flight with --verify, "
                "--latency and --pingpong\n");
        return -1;
    }
    if (o->csv && !o->sweep) {
        fprintf(stderr, "ferry_bench: --format=csv is for --sweep's rows\n");
        return -1;
    }
    if (o->sweep && (o->latency || o->pingpong)) {
        fprintf(stderr, "ferry_bench: --sweep measures throughput and latency at each size; "
                "not with --latency or --pingpong\n");
        return -1;
    }
    if (o->sweep) {
        o->block_size = o->sweep_max; /* the buffers hold the largest block */
        if (!duration_given)
            o->duration = 0.5;
    }
    if (o->latency || o->pingpong)
        o->batch_size = 1;
    if (o->buffer_size == 0) {
        size_t want = o->block_size * o->batch_size * o->window;
        o->buffer_size = want < ((size_t)64 << 20) ? want : ((size_t)64 << 20);
    }
    if (o->buffer_size < o->block_size)
        o->buffer_size = o->block_size;
    if (o->pingpong && o->buffer_size < ferry_bench_pingpong_size(o->block_size))
        o->buffer_size = ferry_bench_pingpong_size(o->block_size); /* receive and send blocks */
    if (o->local_buffer_size != 0 &&
        (o->verify || o->pingpong || o->sweep || o->baseline)) {
        fprintf(stderr, "ferry_bench: --local-buffer-size goes with none of --verify, "
                "--pingpong, --sweep and --memcpy-baseline\n");
        return -1;
    }
    if (o->local_buffer_size != 0 &&
        (o->local_buffer_size < o->block_size || o->local_buffer_size > o->buffer_size)) {
        fprintf(stderr, "ferry_bench: --local-buffer-size %zu is not between the block size "
                "(%zu) and the buffer size (%zu)\n", o->local_buffer_size, o->block_size,
                o->buffer_size);
        return -1;
    }
    if (o->local_buffer_size == 0)
        o->local_buffer_size = o->buffer_size;
    if (!o->spawn && !strcmp(o->mode, "initiator") && o->segment == NULL) {
        fprintf(stderr, "ferry_bench: the initiator needs --segment=NAME (or use --spawn)\n");
        return -1;
    }
    return 0;
}
