/*
 * Change sets: what an owner's descriptor gained and lost between two
 * revisions of one generation, so that a peer holding revision v refreshes
 * by fetching the buffers that changed instead of the whole descriptor.
 * The owner keeps a bounded log of steps (engine_changes.c) and serves
 * them over RPC; the peer applies them here.
 *
 * Text form (the compact descriptor's conventions: descriptor_compact.c):
 *
 *   ferry:changes:1
 *   generation <hex>
 *   from <hex>                     the revision the first step applies to
 *   transports <hex n>             keys per added buffer (the descriptor's)
 *   steps <hex n>                  then n steps, revisions from+1, from+2, ...:
 *   step <hex revision> <hex removed> <hex added>
 *   <hex addr>                     x removed, ascending
 *   <buffer line>                  x added, ascending (the compact form's line)
 *
 * Applying is one merge of the old buffer array with the net effect of all
 * steps, O(buffers) memory moves and O(changes) decoding: for 100,000
 * buffers and one change, a copy of the array and no string work.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

/* A chain of applied change sets keeps each predecessor's pool (and the
 * strings of buffers since removed) alive: past this many, apply copies
 * every string into one new pool. */
#define POOL_DEPTH_MAX 32
#define STEPS_MAX ((size_t)1 << 20)

void ferry_desc_changes_init(ferry_desc_changes_t *changes, uint64_t generation, uint64_t from,
                             size_t n_transports)
{
    *changes = (ferry_desc_changes_t){.generation = generation, .from = from,
                                      .n_transports = n_transports};
}

void ferry_desc_changes_fini(ferry_desc_changes_t *changes)
{
    for (size_t s = 0; s < changes->n_steps; s++) {
        free(changes->steps[s].removed);
        free(changes->steps[s].added);
        ferry_desc_pool_unref(changes->steps[s].pool);
    }
    free(changes->steps);
    ferry_desc_pool_unref(changes->pool);
    *changes = (ferry_desc_changes_t){0};
}

/* ---------------- encode ---------------- */

static char *put_field(char *out, const char *word, uint64_t value)
{
    return ferry_desc_compact_put_hex(ferry_desc_compact_put_word(out, word), value);
}

ferry_status_t ferry_desc_changes_encode(const ferry_desc_changes_t *changes, uint64_t since,
                                         char **text_p, size_t *length_p)
{
    *text_p = NULL;
    if (since < changes->from || since - changes->from > changes->n_steps)
        return FERRY_ERR_INVALID_PARAM;
    size_t first = (size_t)(since - changes->from);
    /* buffer lines need only the transport count of a descriptor */
    ferry_descriptor_t shape = {.n_transports = changes->n_transports};
    size_t size = strlen(FERRY_DESC_CHANGES_MAGIC) + 4 * 32;
    for (size_t s = first; s < changes->n_steps; s++) {
        const ferry_desc_step_t *step = &changes->steps[s];
        size += 5 + 3 * 17 + 1 + step->n_removed * 17;
        for (size_t i = 0; i < step->n_added; i++)
            size += ferry_desc_compact_buffer_size(&shape, &step->added[i]) + 1;
    }
    char *text = malloc(size + 1);
    if (text == NULL) {
        ferry_error("segment descriptor changes: out of memory");
        return FERRY_ERR_NO_MEMORY;
    }
    char *out = ferry_desc_compact_put_word(text, FERRY_DESC_CHANGES_MAGIC);
    out = put_field(out, "generation ", changes->generation);
    out = put_field(out, "\nfrom ", since);
    out = put_field(out, "\ntransports ", changes->n_transports);
    out = put_field(out, "\nsteps ", changes->n_steps - first);
    *out++ = '\n';
    for (size_t s = first; s < changes->n_steps; s++) {
        const ferry_desc_step_t *step = &changes->steps[s];
        out = put_field(out, "step ", step->revision);
        *out++ = ' ';
        out = ferry_desc_compact_put_hex(out, step->n_removed);
        *out++ = ' ';
        out = ferry_desc_compact_put_hex(out, step->n_added);
        *out++ = '\n';
        for (size_t i = 0; i < step->n_removed; i++) {
            out = ferry_desc_compact_put_hex(out, step->removed[i]);
            *out++ = '\n';
        }
        for (size_t i = 0; i < step->n_added; i++) {
            out = ferry_desc_compact_put_buffer(&shape, &step->added[i], out);
            *out++ = '\n';
        }
    }
    *out = '\0';
    *text_p = text;
    if (length_p != NULL)
        *length_p = (size_t)(out - text);
    return FERRY_OK;
}

/* ---------------- decode ---------------- */

static ferry_status_t bad(const ferry_desc_cursor_t *in, const char *what, const char *problem)
{
    return ferry_desc_decode_bad("changes", "", "line %zu: %s: %s", in->line, what, problem);
}

static ferry_status_t read_line_hex(ferry_desc_cursor_t *in, const char *word, uint64_t *value_p)
{
    ferry_status_t status = ferry_desc_cursor_literal(in, word, word);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(in, word, value_p);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, '\n', word);
    return status;
}

static ferry_status_t no_memory(void)
{
    ferry_error("segment descriptor changes: out of memory");
    return FERRY_ERR_NO_MEMORY;
}

static ferry_status_t read_step(ferry_desc_cursor_t *in, ferry_desc_changes_t *changes,
                                ferry_desc_step_t *step, uint64_t revision)
{
    uint64_t n_removed, n_added;
    ferry_status_t status = ferry_desc_cursor_literal(in, "step ", "step");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(in, "step revision", &step->revision);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, ' ', "step");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(in, "step removed", &n_removed);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, ' ', "step");
    if (status == FERRY_OK)
        status = ferry_desc_cursor_hex(in, "step added", &n_added);
    if (status == FERRY_OK)
        status = ferry_desc_cursor_char(in, '\n', "step");
    if (status != FERRY_OK)
        return status;
    if (step->revision != revision)
        return bad(in, "step revision", "not the one after the previous step");
    /* each address line takes 2 bytes at least, each buffer line 9 + 2 per key */
    size_t left = (size_t)(in->end - in->p);
    if (n_removed > left / 2 || n_added > left / (9 + 2 * changes->n_transports))
        return bad(in, "step", "more buffers than the text holds");
    step->removed = malloc((n_removed ? n_removed : 1) * sizeof(*step->removed));
    step->added = calloc(n_added ? n_added : 1, sizeof(*step->added));
    if (step->removed == NULL || step->added == NULL)
        return no_memory();
    for (; step->n_removed < n_removed; step->n_removed++) {
        uint64_t *addr = &step->removed[step->n_removed];
        status = ferry_desc_cursor_hex(in, "removed addr", addr);
        if (status == FERRY_OK)
            status = ferry_desc_cursor_char(in, '\n', "removed addr");
        if (status != FERRY_OK)
            return status;
        if (step->n_removed > 0 && *addr <= addr[-1])
            return bad(in, "removed addr", "not above the one before");
    }
    for (; step->n_added < n_added; step->n_added++) {
        ferry_desc_buffer_t *buffer = &step->added[step->n_added];
        const ferry_desc_buffer_t *previous = step->n_added ? buffer - 1 : NULL;
        status = ferry_desc_cursor_buffer(in, changes->n_transports, changes->pool, previous,
                                          buffer);
        if (status != FERRY_OK)
            return status;
        if (previous != NULL && previous->addr + previous->length > buffer->addr)
            return bad(in, "added buffer", "overlaps (or is below) the one before");
    }
    return FERRY_OK;
}

ferry_status_t ferry_desc_changes_decode(const char *text, size_t length,
                                         ferry_desc_changes_t *changes)
{
    ferry_desc_changes_init(changes, 0, 0, 0);
    if (length > FERRY_DESC_MAX_TEXT)
        return ferry_desc_decode_bad("changes", "", "%zu bytes is more than %zu", length,
                                     FERRY_DESC_MAX_TEXT);
    ferry_desc_cursor_t in = {.p = text, .end = text + length, .line = 1};
    uint64_t n_transports = 0, n_steps = 0;
    ferry_status_t status = ferry_desc_cursor_literal(&in, FERRY_DESC_CHANGES_MAGIC, "magic");
    if (status == FERRY_OK)
        status = read_line_hex(&in, "generation ", &changes->generation);
    if (status == FERRY_OK)
        status = read_line_hex(&in, "from ", &changes->from);
    if (status == FERRY_OK)
        status = read_line_hex(&in, "transports ", &n_transports);
    if (status == FERRY_OK)
        status = read_line_hex(&in, "steps ", &n_steps);
    if (status != FERRY_OK)
        goto err_fini;
    if (n_transports > FERRY_DESC_MAX_TRANSPORTS) {
        status = bad(&in, "transports", "too many");
        goto err_fini;
    }
    changes->n_transports = (size_t)n_transports;
    /* a step line takes 12 bytes at least */
    if (n_steps > STEPS_MAX || n_steps > (size_t)(in.end - in.p) / 12 ||
        n_steps > UINT64_MAX - changes->from) {
        status = bad(&in, "steps", "more than the text holds");
        goto err_fini;
    }
    changes->steps = calloc(n_steps ? n_steps : 1, sizeof(*changes->steps));
    changes->pool = ferry_desc_pool_new(NULL);
    if (changes->steps == NULL || changes->pool == NULL) {
        status = no_memory();
        goto err_fini;
    }
    for (; changes->n_steps < n_steps; changes->n_steps++) {
        ferry_desc_step_t *step = &changes->steps[changes->n_steps];
        status = read_step(&in, changes, step, changes->from + changes->n_steps + 1);
        if (status != FERRY_OK) {
            changes->n_steps++; /* fini frees the partial step */
            goto err_fini;
        }
    }
    if (in.p != in.end) {
        status = bad(&in, "text", "continues after the last step");
        goto err_fini;
    }
    return FERRY_OK;

err_fini:
    ferry_desc_changes_fini(changes);
    return status;
}

/* ---------------- apply ---------------- */

/* One event of the change set: a removal (buffer NULL) or an addition, in
 * the order the steps made them. */
typedef struct change_event {
    uint64_t addr;
    size_t order;
    const ferry_desc_buffer_t *buffer;
} change_event_t;

static int event_compare(const void *a, const void *b)
{
    const change_event_t *x = a, *y = b;
    if (x->addr != y->addr)
        return (x->addr > y->addr) - (x->addr < y->addr);
    return (x->order > y->order) - (x->order < y->order);
}

/* The net effect on one address: base's buffer there goes (removed), and
 * what stands there at the end (added, or NULL).  An addition over one
 * that was not removed first is refused. */
typedef struct net_change {
    uint64_t addr;
    int removed;
    const ferry_desc_buffer_t *added;
} net_change_t;

static ferry_status_t net_effect(const ferry_desc_changes_t *changes, net_change_t **net_p,
                                 size_t *count_p)
{
    size_t total = 0;
    for (size_t s = 0; s < changes->n_steps; s++)
        total += changes->steps[s].n_removed + changes->steps[s].n_added;
    change_event_t *events = malloc((total ? total : 1) * sizeof(*events));
    net_change_t *net = calloc(total ? total : 1, sizeof(*net));
    if (events == NULL || net == NULL) {
        free(events);
        free(net);
        return no_memory();
    }
    size_t n = 0;
    for (size_t s = 0; s < changes->n_steps; s++) {
        const ferry_desc_step_t *step = &changes->steps[s];
        /* within a step, removals come first: a buffer re-registered with
         * another length is a removal and an addition at one address */
        for (size_t i = 0; i < step->n_removed; i++, n++)
            events[n] = (change_event_t){.addr = step->removed[i], .order = n};
        for (size_t i = 0; i < step->n_added; i++, n++)
            events[n] = (change_event_t){.addr = step->added[i].addr, .order = n,
                                         .buffer = &step->added[i]};
    }
    qsort(events, n, sizeof(*events), event_compare);
    size_t count = 0;
    for (size_t i = 0; i < n; i++) {
        if (count == 0 || net[count - 1].addr != events[i].addr)
            net[count++] = (net_change_t){.addr = events[i].addr};
        net_change_t *here = &net[count - 1];
        if (events[i].buffer == NULL && here->added != NULL) {
            here->added = NULL;
        } else if (events[i].buffer == NULL) {
            here->removed = 1;
        } else if (here->added != NULL) {
            unsigned long long addr = (unsigned long long)here->addr;
            free(events);
            free(net);
            return ferry_desc_decode_bad("changes", "", "buffer at 0x%llx added twice", addr);
        } else {
            here->added = events[i].buffer;
        }
    }
    free(events);
    *net_p = net;
    *count_p = count;
    return FERRY_OK;
}

/* A buffer's strings copied into pool. */
static int copy_strings(ferry_desc_pool_t *pool, size_t n_transports, ferry_desc_buffer_t *buffer)
{
    char **keys = buffer->keys;
    const char *location = buffer->location ? buffer->location : "cpu";
    buffer->location = ferry_desc_pool_strndup(pool, location, strlen(location));
    buffer->keys = ferry_desc_pool_alloc(pool, n_transports * sizeof(char *));
    if (buffer->location == NULL || buffer->keys == NULL)
        return 0;
    for (size_t t = 0; t < n_transports; t++) {
        const char *key = keys ? keys[t] : NULL;
        buffer->keys[t] = key ? ferry_desc_pool_strndup(pool, key, strlen(key)) : NULL;
        if (key != NULL && buffer->keys[t] == NULL)
            return 0;
    }
    return 1;
}

/* Name, host, rpc and transports: malloc-ed copies. */
static ferry_status_t copy_header(const ferry_descriptor_t *base, ferry_descriptor_t *desc)
{
    desc->name = strdup(base->name);
    desc->generation = base->generation;
    desc->host_id = base->host_id ? strdup(base->host_id) : NULL;
    desc->rpc = base->rpc ? strdup(base->rpc) : NULL;
    desc->transports = calloc(base->n_transports + 1, sizeof(*desc->transports));
    if (desc->name == NULL || (base->host_id && !desc->host_id) || (base->rpc && !desc->rpc) ||
        desc->transports == NULL)
        return no_memory();
    for (size_t t = 0; t < base->n_transports; t++, desc->n_transports++) {
        const ferry_desc_transport_t *from = &base->transports[t];
        ferry_desc_transport_t *to = &desc->transports[t];
        to->name = strdup(from->name);
        to->endpoint = from->endpoint ? strdup(from->endpoint) : NULL;
        if (to->name == NULL || (from->endpoint && !to->endpoint))
            return no_memory();
    }
    return FERRY_OK;
}

/* base's buffers without the removed ones, merged with the added ones. */
static ferry_status_t merge(const ferry_descriptor_t *base, const net_change_t *net,
                            size_t n_net, int own_strings, ferry_descriptor_t *desc)
{
    size_t capacity = base->n_buffers + n_net;
    desc->buffers = malloc((capacity ? capacity : 1) * sizeof(*desc->buffers));
    if (desc->buffers == NULL)
        return no_memory();
    size_t i = 0, n = 0;
    for (size_t c = 0; c <= n_net; c++) {
        /* base's buffers below this change's address, copied in one run */
        size_t run = i;
        while (run < base->n_buffers && (c == n_net || base->buffers[run].addr < net[c].addr))
            run++;
        if (run > i)
            memcpy(&desc->buffers[n], &base->buffers[i], (run - i) * sizeof(*desc->buffers));
        n += run - i;
        i = run;
        if (c == n_net)
            break;
        /* a removal of an address base lacks is no error: the owner may
         * serve a descriptor that misses a buffer it has not counted gone */
        if (i < base->n_buffers && base->buffers[i].addr == net[c].addr && net[c].removed)
            i++;
        if (net[c].added != NULL)
            desc->buffers[n++] = *net[c].added;
    }
    desc->n_buffers = n;
    for (size_t b = 0; b < n; b++) {
        atomic_init(&desc->buffers[b].route, 0); /* a new descriptor: routes are made anew */
        if (own_strings && !copy_strings(desc->pool, desc->n_transports, &desc->buffers[b]))
            return no_memory();
    }
    /* added buffers' strings live in the change set: copy them over */
    for (size_t c = 0, b = 0; !own_strings && c < n_net; c++) {
        if (net[c].added == NULL)
            continue;
        while (desc->buffers[b].addr != net[c].addr)
            b++;
        if (!copy_strings(desc->pool, desc->n_transports, &desc->buffers[b]))
            return no_memory();
    }
    return FERRY_OK;
}

ferry_status_t ferry_descriptor_apply(const ferry_descriptor_t *base,
                                      const ferry_desc_changes_t *changes,
                                      ferry_descriptor_t **desc_p)
{
    *desc_p = NULL;
    if (changes->generation != base->generation || changes->from != base->revision ||
        base->revision == 0)
        return ferry_desc_decode_bad("changes", "", "they apply to generation 0x%llx revision "
                                     "%llu, not to 0x%llx revision %llu",
                                     (unsigned long long)changes->generation,
                                     (unsigned long long)changes->from,
                                     (unsigned long long)base->generation,
                                     (unsigned long long)base->revision);
    if (changes->n_transports != base->n_transports)
        return ferry_desc_decode_bad("changes", "transports", "%zu, the descriptor has %zu",
                                     changes->n_transports, base->n_transports);
    net_change_t *net = NULL;
    size_t n_net = 0;
    ferry_status_t status = net_effect(changes, &net, &n_net);
    if (status != FERRY_OK)
        return status;
    ferry_descriptor_t *desc = ferry_descriptor_new();
    if (desc == NULL) {
        free(net);
        return no_memory();
    }
    desc->revision = changes->from + changes->n_steps;
    int own_strings = base->pool == NULL || ferry_desc_pool_depth(base->pool) >= POOL_DEPTH_MAX;
    status = copy_header(base, desc);
    if (status == FERRY_OK) {
        desc->pool = ferry_desc_pool_new(own_strings ? NULL : base->pool);
        status = desc->pool ? merge(base, net, n_net, own_strings, desc) : no_memory();
    }
    free(net);
    /* finish: the order is kept (no sort), overlaps of added buffers with
     * kept ones are found in one pass */
    return ferry_descriptor_complete(desc, status, desc_p);
}
