/*
 * Segments exchanged by the application: this engine's descriptor exported
 * as a blob (descriptor_blob.c), and a segment opened from one without the
 * metadata store.  The blob is what a p2p FETCH would serve at that moment;
 * the segment it opens refreshes from its owner over RPC
 * (segment_cache.c, owner_refresh), and a one-sided transport uses it only
 * once its owner confirmed it (confirm.c), as with any descriptor.
 */
#include "core.h"

#include <stdlib.h>
#include <string.h>

ferry_status_t ferry_engine_export_blob(ferry_engine_h handle, void *blob, size_t capacity,
                                        size_t *length_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (length_p == NULL || (blob == NULL && capacity > 0))
        return FERRY_ERR_INVALID_PARAM;
    char *text;
    size_t text_length;
    ferry_status_t status =
        ferry_engine_local_text(engine, FERRY_DESC_FORM_COMPACT, &text, &text_length);
    if (status != FERRY_OK)
        return status;
    uint8_t *made;
    size_t length;
    status = ferry_descriptor_blob_wrap(text, text_length, &made, &length);
    free(text);
    if (status != FERRY_OK)
        return status;
    *length_p = length;
    if (blob == NULL) {
        status = FERRY_OK; /* the caller asks how much room it takes */
    } else if (capacity < length) {
        ferry_debug("segment blob: %zu bytes do not fit the caller's %zu", length, capacity);
        status = FERRY_ERR_OUT_OF_RANGE;
    } else {
        memcpy(blob, made, length);
    }
    free(made);
    return status;
}

ferry_status_t ferry_segment_open_blob(ferry_engine_h handle, const void *blob, size_t length,
                                       ferry_segment_h *segment_p)
{
    ferry_engine_t *engine = ferry_engine_lookup(handle);
    if (engine == NULL)
        return FERRY_ERR_INVALID_HANDLE;
    if (blob == NULL || segment_p == NULL)
        return FERRY_ERR_INVALID_PARAM;
    ferry_descriptor_t *desc;
    ferry_status_t status = ferry_descriptor_blob_decode(blob, length, &desc);
    if (status != FERRY_OK)
        return status;
    ferry_segment_t *segment;
    status = ferry_segment_cache_open_desc(engine, desc, &segment);
    ferry_descriptor_unref(desc);
    if (status == FERRY_OK)
        *segment_p = (ferry_segment_h)(uintptr_t)segment->handle;
    return status;
}
