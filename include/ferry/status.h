/*
 * Ferry status codes: one type for the whole library.
 * FERRY_OK is zero, FERRY_INPROGRESS is positive, every error is negative and
 * errors are grouped by kind so callers can test ranges.
 */
#ifndef FERRY_STATUS_H
#define FERRY_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the exported API; libferry is built with -fvisibility=hidden. */
#ifndef FERRY_API
#define FERRY_API __attribute__((visibility("default")))
#endif

typedef enum ferry_status {
    FERRY_OK = 0,
    FERRY_INPROGRESS = 1,

    /* argument errors: the caller passed something wrong */
    FERRY_ERR_INVALID_PARAM = -1,
    FERRY_ERR_INVALID_HANDLE = -2,
    FERRY_ERR_OVERLAP = -3,
    FERRY_ERR_NOT_REGISTERED = -4,
    FERRY_ERR_OUT_OF_RANGE = -5,
    FERRY_ERR_BUSY = -6,
    FERRY_ERR_UNSUPPORTED = -7,
    FERRY_ERR_TOO_MANY = -8,
    FERRY_ERR_NOT_FOUND = -9, /* e.g. a pointer that is no memory of this accelerator */

    /* resource errors: the machine said no */
    FERRY_ERR_NO_MEMORY = -20,
    FERRY_ERR_NO_RESOURCE = -21,
    FERRY_ERR_PLUGIN_NOT_FOUND = -22,

    /* metadata errors: the control plane said no */
    FERRY_ERR_METADATA = -40,
    FERRY_ERR_SEGMENT_NOT_FOUND = -41,
    FERRY_ERR_DECODE = -42,
    FERRY_ERR_STALE = -43,

    /* peer and link errors: the other side or the network failed */
    FERRY_ERR_TIMEOUT = -60,
    FERRY_ERR_CONNECT = -61,
    FERRY_ERR_PEER_FAILED = -62,
    FERRY_ERR_PROTOCOL = -63,
    FERRY_ERR_REMOTE_REFUSED = -64,
    FERRY_ERR_CANCELED = -65,

    /* I/O errors: a local system call failed */
    FERRY_ERR_IO = -80,
} ferry_status_t;

/* Short, static, human readable text for a status (never NULL). */
FERRY_API const char *ferry_status_string(ferry_status_t status);

#ifdef __cplusplus
}
#endif

#endif
