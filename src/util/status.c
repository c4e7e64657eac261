/* Text for every status code. */
#include "util.h"

const char *ferry_status_string(ferry_status_t status)
{
    switch (status) {
    case FERRY_OK: return "success";
    case FERRY_INPROGRESS: return "operation in progress";
    case FERRY_ERR_INVALID_PARAM: return "invalid parameter";
    case FERRY_ERR_INVALID_HANDLE: return "invalid, stale or foreign handle";
    case FERRY_ERR_OVERLAP: return "range partially overlaps a registered range";
    case FERRY_ERR_NOT_REGISTERED: return "range is not registered";
    case FERRY_ERR_OUT_OF_RANGE: return "range is outside the segment's buffers";
    case FERRY_ERR_BUSY: return "resource busy";
    case FERRY_ERR_UNSUPPORTED: return "operation not supported";
    case FERRY_ERR_TOO_MANY: return "too many requests";
    case FERRY_ERR_NOT_FOUND: return "not found";
    case FERRY_ERR_NO_MEMORY: return "out of memory";
    case FERRY_ERR_NO_RESOURCE: return "resource exhausted";
    case FERRY_ERR_PLUGIN_NOT_FOUND: return "plugin not found";
    case FERRY_ERR_METADATA: return "metadata store error";
    case FERRY_ERR_SEGMENT_NOT_FOUND: return "segment not found";
    case FERRY_ERR_DECODE: return "malformed segment descriptor";
    case FERRY_ERR_STALE: return "stale segment descriptor";
    case FERRY_ERR_TIMEOUT: return "timed out";
    case FERRY_ERR_CONNECT: return "connection failed";
    case FERRY_ERR_PEER_FAILED: return "peer failed";
    case FERRY_ERR_PROTOCOL: return "protocol error";
    case FERRY_ERR_REMOTE_REFUSED: return "refused by the remote engine";
    case FERRY_ERR_CANCELED: return "canceled";
    case FERRY_ERR_IO: return "I/O error";
    }
    return "unknown status";
}
