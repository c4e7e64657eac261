/*
 * Binary IPC handles (CUDA's and HIP's 64-byte legacy handles) as the text
 * accel.h's ipc_export hands out: two lowercase hex digits a byte.
 * Header-only: each vendor module compiles its own copy.
 */
#ifndef FERRY_ACCEL_HEX_H
#define FERRY_ACCEL_HEX_H

#include <stddef.h>
#include <string.h>

/* text = the n bytes in hex, NUL-terminated; -1 when length is too small. */
static inline int ferry_accel_hex_encode(const void *bytes, size_t n, char *text, size_t length)
{
    static const char digits[] = "0123456789abcdef";
    const unsigned char *b = bytes;
    if (length < 2 * n + 1)
        return -1;
    for (size_t i = 0; i < n; i++) {
        text[2 * i] = digits[b[i] >> 4];
        text[2 * i + 1] = digits[b[i] & 15];
    }
    text[2 * n] = '\0';
    return 0;
}

static inline int ferry_accel_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* The n bytes text spells: exactly 2n hex digits, else -1. */
static inline int ferry_accel_hex_decode(const char *text, void *bytes, size_t n)
{
    unsigned char *b = bytes;
    if (strlen(text) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int high = ferry_accel_hex_digit(text[2 * i]), low = ferry_accel_hex_digit(text[2 * i + 1]);
        if (high < 0 || low < 0)
            return -1;
        b[i] = (unsigned char)(high << 4 | low);
    }
    return 0;
}

#endif
