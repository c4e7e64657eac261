/* ferry_info: version, plugins, settings, and a segment's descriptor. */
#include <ferry/ferry.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: ferry_info [-v] [-p] [-d] [-c] [-s NAME [-m URI]]\n"
            "  -v, --version         print the version\n"
            "  -p, --plugins         list built-in plugins and modules found\n"
            "  -d, --devices         list accelerator modules (cuda, hip), whether each can\n"
            "                        be used here (or why not) and their devices\n"
            "  -c, --config          print every setting with its default and doc\n"
            "  -s, --segment=NAME    print the decoded descriptor of segment NAME\n"
            "  -m, --metadata=URI    metadata store to find NAME in (default: FERRY_METADATA "
            "or p2p)\n"
            "  -h, --help            this text\n"
            "Without options: version, plugins and devices.\n");
}

static int describe(const char *name, const char *metadata)
{
    ferry_config_t config = {0};
    if (metadata) {
        config.field_mask |= FERRY_CONFIG_FIELD_METADATA;
        config.metadata = metadata;
    }
    ferry_engine_h engine;
    ferry_segment_h segment;
    char *json = NULL;
    ferry_status_t status = ferry_engine_create(&config, &engine);
    if (status != FERRY_OK) {
        fprintf(stderr, "ferry_info: cannot start an engine: %s\n", ferry_status_string(status));
        return 1;
    }
    status = ferry_segment_open(engine, name, &segment);
    if (status == FERRY_OK) {
        status = ferry_segment_describe(engine, segment, &json);
        ferry_segment_close(engine, segment);
    }
    if (status == FERRY_OK)
        printf("%s\n", json);
    else
        fprintf(stderr, "ferry_info: segment %s: %s\n", name, ferry_status_string(status));
    free(json);
    ferry_engine_destroy(engine);
    return status == FERRY_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    static const struct option options[] = {
        {"version", no_argument, NULL, 'v'},   {"plugins", no_argument, NULL, 'p'},
        {"devices", no_argument, NULL, 'd'},
        {"config", no_argument, NULL, 'c'},    {"segment", required_argument, NULL, 's'},
        {"metadata", required_argument, NULL, 'm'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    unsigned what = 0;
    const char *segment = NULL, *metadata = NULL;
    int opt;
    while ((opt = getopt_long(argc, argv, "vpdcs:m:h", options, NULL)) != -1) {
        switch (opt) {
        case 'v': what |= FERRY_INFO_VERSION; break;
        case 'p': what |= FERRY_INFO_PLUGINS; break;
        case 'd': what |= FERRY_INFO_DEVICES; break;
        case 'c': what |= FERRY_INFO_SETTINGS; break;
        case 's': segment = optarg; break;
        case 'm': metadata = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ferry_info: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (segment != NULL)
        return describe(segment, metadata);
    ferry_info_print(stdout, what ? what
                                  : FERRY_INFO_VERSION | FERRY_INFO_PLUGINS | FERRY_INFO_DEVICES);
    return 0;
}
