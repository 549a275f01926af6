/* SHA-256 (OpenSSL's libcrypto), hex encoded. */
#ifndef HUTCH_HASH_H
#define HUTCH_HASH_H

#include <stddef.h>

void hutch_sha256_hex(const void *data, size_t n, char out[65]);
/* Constant-time comparison of two equal-length strings. */
int hutch_ct_equal(const char *a, const char *b, size_t n);

#endif
