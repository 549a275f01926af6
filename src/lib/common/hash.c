#include "common/hash.h"

#include <openssl/evp.h>

#include "common/util.h"

void hutch_sha256_hex(const void *data, size_t n, char out[65]) {
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(data, n, md, &len, EVP_sha256(), NULL);
  hex_encode(md, 32, out);
}

int hutch_ct_equal(const char *a, const char *b, size_t n) {
  unsigned char d = 0;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
  return d == 0;
}
