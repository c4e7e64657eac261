/*
 * The compact descriptor form: it carries exactly what the JSON form does,
 * either form decodes through the one entry point, and whatever arrives in
 * it (malformed, truncated, hostile) is refused with FERRY_ERR_DECODE and
 * one log line, never a crash.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_rng.h"
#include "../src/core/core.h"
#include "capture_stderr.h"
#include "descriptor_samples.h"

static ferry_descriptor_t *decode_or_fail(const char *text, size_t length)
{
    ferry_descriptor_t *desc = NULL;
    cr_assert_eq(ferry_descriptor_decode(text, length, &desc), FERRY_OK, "%.*s", (int)length,
                 text);
    return desc;
}

Test(descriptor_compact, round_trip_and_canonical)
{
    ferry_descriptor_t *desc = ferry_test_sample_desc(40, 3);
    char *text = NULL;
    size_t length = 0;
    cr_assert_eq(ferry_descriptor_encode_as(desc, FERRY_DESC_FORM_COMPACT, &text, &length),
                 FERRY_OK);
    cr_assert_eq(length, strlen(text));
    cr_assert_eq(ferry_descriptor_text_form(text, length), FERRY_DESC_FORM_COMPACT);
    ferry_descriptor_t *back = decode_or_fail(text, length);
    ferry_test_expect_same_desc(desc, back);
    cr_assert_eq(back->revision, desc->revision, "the compact form carries the revision");

    char *again = NULL;
    cr_assert_eq(ferry_descriptor_compact_encode(back, &again, NULL), FERRY_OK);
    cr_assert_str_eq(again, text, "encode(decode(x)) must be x");
    free(again);
    free(text);
    ferry_descriptor_unref(back);
    ferry_descriptor_unref(desc);
}

Test(descriptor_compact, both_forms_carry_the_same_value)
{
    for (uint64_t seed = 0; seed < 20; seed++) {
        ferry_descriptor_t *desc = ferry_test_sample_desc(seed * 7, seed);
        char *json = NULL, *compact = NULL;
        cr_assert_eq(ferry_descriptor_encode_as(desc, FERRY_DESC_FORM_JSON, &json, NULL),
                     FERRY_OK);
        cr_assert_eq(ferry_descriptor_encode_as(desc, FERRY_DESC_FORM_COMPACT, &compact, NULL),
                     FERRY_OK);
        cr_assert_eq(ferry_descriptor_text_form(json, strlen(json)), FERRY_DESC_FORM_JSON);
        ferry_descriptor_t *from_json = decode_or_fail(json, strlen(json));
        ferry_descriptor_t *from_compact = decode_or_fail(compact, strlen(compact));
        ferry_test_expect_same_desc(from_json, from_compact);
        cr_assert_eq(from_json->revision, 0, "JSON carries no revision");

        /* and each converts to the other's exact text */
        char *json_again = NULL, *compact_again = NULL;
        cr_assert_eq(ferry_descriptor_encode(from_compact, &json_again), FERRY_OK);
        cr_assert_str_eq(json_again, json);
        from_json->revision = desc->revision;
        cr_assert_eq(ferry_descriptor_compact_encode(from_json, &compact_again, NULL), FERRY_OK);
        cr_assert_str_eq(compact_again, compact);
        free(json_again);
        free(compact_again);
        free(json);
        free(compact);
        ferry_descriptor_unref(from_json);
        ferry_descriptor_unref(from_compact);
        ferry_descriptor_unref(desc);
    }
}

#define HEADER "ferry:desc:1\nname 3:seg\ngeneration 1234abcd\nrevision 2\nhost 6:host-a\n" \
               "rpc d:10.0.0.1:7000\n"
#define TRANSPORTS "transports 2\n3:tcp d:10.0.0.1:4567\n3:ucx 4:AAEC\n"
#define VALID_COMPACT HEADER TRANSPORTS "buffers 2\n1000 1000 rw 3:cpu 0: 2:k1\n" \
                      "2000 1000 r 6:cuda:0 - 2:k2\n"

Test(descriptor_compact, the_documented_text)
{
    ferry_descriptor_t *desc = decode_or_fail(VALID_COMPACT, strlen(VALID_COMPACT));
    cr_assert_eq(desc->generation, 0x1234abcd);
    cr_assert_eq(desc->revision, 2);
    cr_assert_eq(desc->n_buffers, 2);
    cr_assert_null(desc->buffers[1].keys[0]);
    cr_assert_str_eq(desc->buffers[1].keys[1], "k2");
    cr_assert_eq(desc->buffers[1].access, FERRY_REG_REMOTE_READ);
    char *text = NULL;
    cr_assert_eq(ferry_descriptor_compact_encode(desc, &text, NULL), FERRY_OK);
    cr_assert_str_eq(text, VALID_COMPACT);
    free(text);
    ferry_descriptor_unref(desc);
}

Test(descriptor_compact, equal_strings_of_neighbours_are_stored_once)
{
    const char *text = HEADER TRANSPORTS "buffers 3\n1000 10 rw 3:cpu 0: -\n"
                                         "2000 10 rw 3:cpu 0: -\n3000 10 rw 4:cpu1 0: -\n";
    ferry_descriptor_t *desc = decode_or_fail(text, strlen(text));
    cr_assert_eq(desc->buffers[0].location, desc->buffers[1].location);
    cr_assert_eq(desc->buffers[0].keys[0], desc->buffers[1].keys[0]);
    cr_assert_str_eq(desc->buffers[2].location, "cpu1");
    ferry_descriptor_unref(desc);
}

typedef struct decode_call {
    const char *text;
    size_t length;
    ferry_status_t status;
} decode_call_t;

static void run_decode(void *arg)
{
    decode_call_t *call = arg;
    ferry_descriptor_t *desc = NULL;
    call->status = ferry_descriptor_decode(call->text, call->length, &desc);
    if (desc != NULL)
        ferry_descriptor_unref(desc);
}

static void expect_refused(const char *what, const char *text, size_t length, const char *log)
{
    char *copy = malloc(length ? length : 1); /* exact size: ASan sees over-reads */
    memcpy(copy, text, length);
    decode_call_t call = {.text = copy, .length = length};
    char *logged = capture_stderr(run_decode, &call);
    cr_assert_not_null(logged);
    cr_expect_eq(call.status, FERRY_ERR_DECODE, "%s: got %d", what, call.status);
    const char *newline = strchr(logged, '\n');
    cr_expect(newline != NULL && newline[1] == '\0', "%s: want one log line, got: %s", what,
              logged);
    cr_expect_not_null(strstr(logged, log), "%s: log should mention \"%s\", got: %s", what, log,
                       logged);
    free(logged);
    free(copy);
}

static const struct {
    const char *what, *text, *log;
} bad_cases[] = {
    {"other form version", "ferry:desc:2\n", "not valid JSON"},
    {"no name", "ferry:desc:1\nname 0:\n", "name: must not be empty"},
    {"upper-case hex", "ferry:desc:1\nname 1:s\ngeneration ABC\n", "generation"},
    {"leading zero", "ferry:desc:1\nname 1:s\ngeneration 01\n", "leading zero"},
    {"17 hex digits", "ferry:desc:1\nname 1:s\ngeneration 10000000000000000\n",
     "more than 16 hex digits"},
    {"string past the end", "ferry:desc:1\nname ff:s", "runs past the end"},
    {"string not UTF-8", "ferry:desc:1\nname 2:\xc3(\n", "not UTF-8"},
    {"NUL in a string", "ferry:desc:1\nname 3:a\0b\n", "not UTF-8"},
    {"string over 64 KiB", "ferry:desc:1\nname 10001:", "longer than 64 KiB"},
    {"too many transports", HEADER "transports 41\n", "too many"},
    {"transports past the text", HEADER "transports 3\n3:tcp 0:\n", "more than the text"},
    {"transport named twice", HEADER "transports 2\n3:tcp 0:\n3:tcp 0:\nbuffers 0\n",
     "named twice"},
    {"empty transport name", HEADER "transports 1\n0: 0:\nbuffers 0\n", "empty"},
    {"too many buffers", HEADER TRANSPORTS "buffers f4241\n", "too many"},
    {"buffers past the text", HEADER TRANSPORTS "buffers 5\n1000 10 rw 3:cpu - -\n",
     "more than the text"},
    {"zero length", HEADER TRANSPORTS "buffers 1\n1000 0 rw 3:cpu - -\n", "must not be 0"},
    {"end past 2^64", HEADER TRANSPORTS "buffers 1\nffffffffffffff00 101 rw 3:cpu - -\n",
     "does not fit"},
    {"bad access", HEADER TRANSPORTS "buffers 1\n1000 10 x 3:cpu - -\n", "r, w or rw"},
    {"access with no separator", HEADER TRANSPORTS "buffers 1\n1000 10 rwx3:cpu - -\n",
     "r, w or rw"},
    {"a key missing", HEADER TRANSPORTS "buffers 1\n1000 10 rw 3:cpu -\n      ", "separator"},
    {"a key too many", HEADER TRANSPORTS "buffers 1\n1000 10 rw 3:cpu - - -\n", "line does"},
    {"overlap", HEADER TRANSPORTS "buffers 2\n1000 20 rw 3:cpu - -\n1010 10 rw 3:cpu - -\n",
     "overlaps"},
    {"duplicate", HEADER TRANSPORTS "buffers 2\n1000 20 rw 3:cpu - -\n1000 20 rw 3:cpu - -\n",
     "not above the one before"},
    {"out of order", HEADER TRANSPORTS "buffers 2\n2000 20 rw 3:cpu - -\n1000 20 rw 3:cpu - -\n",
     "not above the one before"},
    {"trailing bytes", VALID_COMPACT "x", "continues after the last buffer"},
    {"CRLF", "ferry:desc:1\r\nname 1:s\n", "not valid JSON"},
    {"revision missing", "ferry:desc:1\nname 1:s\ngeneration 1\nhost 0:\n", "revision"},
};

Test(descriptor_compact, malformed_texts_are_refused_and_logged_once)
{
    for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
        size_t length = strlen(bad_cases[i].text);
        if (strcmp(bad_cases[i].what, "NUL in a string") == 0)
            length = strlen("ferry:desc:1\nname 3:a") + 3;
        expect_refused(bad_cases[i].what, bad_cases[i].text, length, bad_cases[i].log);
    }
}

Test(descriptor_compact, every_truncation_is_refused)
{
    size_t length = strlen(VALID_COMPACT);
    ferry_log_level_current = -1;
    for (size_t cut = 0; cut < length; cut++) {
        char *copy = malloc(cut ? cut : 1);
        memcpy(copy, VALID_COMPACT, cut);
        ferry_descriptor_t *desc = NULL;
        cr_expect_eq(ferry_descriptor_decode(copy, cut, &desc), FERRY_ERR_DECODE, "%zu bytes",
                     cut);
        cr_expect_null(desc);
        free(copy);
    }
}

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static uint64_t rng(void)
{
    return test_rng_next(&rng_state);
}

Test(descriptor_compact, random_mutations_never_crash)
{
    static const char interesting[] = "0123456789abcdef: -\nrw\x00\xff\xc3";
    size_t valid_length = strlen(VALID_COMPACT), ok = 0, refused = 0;
    ferry_log_level_current = -1;
    for (int round = 0; round < 6000; round++) {
        size_t capacity = valid_length + 32, length = valid_length;
        char *text = malloc(capacity);
        memcpy(text, VALID_COMPACT, valid_length);
        for (int e = 0, edits = 1 + (int)(rng() % 3); e < edits && length > 0; e++) {
            size_t at = rng() % length;
            char c = interesting[rng() % (sizeof(interesting) - 1)];
            switch (rng() % 3) {
            case 0: text[at] = c; break;
            case 1:
                memmove(text + at, text + at + 1, length - at - 1);
                length--;
                break;
            default:
                if (length < capacity) {
                    memmove(text + at + 1, text + at, length - at);
                    text[at] = c;
                    length++;
                }
            }
        }
        char *exact = malloc(length ? length : 1);
        memcpy(exact, text, length);
        free(text);
        ferry_descriptor_t *desc = NULL;
        ferry_status_t status = ferry_descriptor_decode(exact, length, &desc);
        cr_assert(status == FERRY_OK || status == FERRY_ERR_DECODE, "status %d", status);
        if (status == FERRY_OK) {
            /* what decodes is canonical: encoding gives back the same text */
            char *again = NULL;
            cr_assert_eq(ferry_descriptor_compact_encode(desc, &again, NULL), FERRY_OK);
            cr_assert(strlen(again) == length && memcmp(again, exact, length) == 0,
                      "not canonical: %.*s", (int)length, exact);
            free(again);
            ferry_descriptor_unref(desc);
            ok++;
        } else {
            refused++;
        }
        free(exact);
    }
    cr_log_info("compact mutations: %zu decoded, %zu refused", ok, refused);
    cr_expect_gt(ok, 0);
    cr_expect_gt(refused, 0);
}

Test(descriptor_compact, a_large_segment_round_trips)
{
    ferry_descriptor_t *desc = ferry_test_sample_desc(100000, 1);
    char *text = NULL;
    size_t length;
    cr_assert_eq(ferry_descriptor_compact_encode(desc, &text, &length), FERRY_OK);
    ferry_descriptor_t *back = decode_or_fail(text, length);
    ferry_test_expect_same_desc(desc, back);
    free(text);
    ferry_descriptor_unref(back);
    ferry_descriptor_unref(desc);
}
