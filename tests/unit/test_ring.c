#include <stdlib.h>
#include <string.h>

#include "agent/ring.h"
#include "tap.h"

int main(void) {
  struct hutch_ring r;
  hutch_ring_init(&r, 8);
  char out[64];
  uint64_t cur = 0, missed = 0;
  is_int(hutch_ring_read(&r, &cur, out, sizeof out, &missed), 0, "empty ring reads nothing");
  hutch_ring_write(&r, "abcde", 5);
  is_int(hutch_ring_read(&r, &cur, out, sizeof out, &missed), 5, "reads what was written");
  ok(!memcmp(out, "abcde", 5) && missed == 0, "bytes and no loss");
  hutch_ring_write(&r, "fghij", 5); /* wraps; holds cdefghij? no: holds the last 8: cdefghij */
  is_int(r.start, 2, "oldest bytes dropped when over capacity");
  is_int(hutch_ring_read(&r, &cur, out, sizeof out, &missed), 5, "reader at its cursor gets only new bytes");
  ok(!memcmp(out, "fghij", 5), "wrapped bytes in order");
  uint64_t late = 0;
  size_t n = hutch_ring_read(&r, &late, out, sizeof out, &missed);
  ok(n == 8 && missed == 2 && !memcmp(out, "cdefghij", 8), "late reader: what is left, and how much it missed");
  hutch_ring_write(&r, "0123456789ABCDEF", 16); /* larger than capacity */
  uint64_t c2 = 0;
  n = hutch_ring_read(&r, &c2, out, 3, &missed);
  ok(n == 3 && !memcmp(out, "89A", 3) && r.end == 26 && missed == 18, "oversized write keeps its tail; bounded read");
  n = hutch_ring_read(&r, &c2, out, sizeof out, &missed);
  ok(n == 5 && !memcmp(out, "BCDEF", 5) && missed == 0, "continues from cursor");
  /* Byte-by-byte against a model. */
  struct hutch_ring m;
  hutch_ring_init(&m, 37);
  unsigned char model[4096];
  size_t total = 0;
  uint64_t rc = 0;
  int bad = 0;
  srand(7);
  for (int i = 0; i < 2000 && total + 16 < sizeof model; i++) {
    unsigned char chunk[16];
    size_t k = (size_t)(rand() % 16);
    for (size_t j = 0; j < k; j++) chunk[j] = model[total + j] = (unsigned char)rand();
    hutch_ring_write(&m, chunk, k);
    total += k;
    if (rand() % 3 == 0) {
      unsigned char got[64];
      uint64_t before = rc, miss;
      size_t g = hutch_ring_read(&m, &rc, got, sizeof got, &miss);
      if (memcmp(got, model + before + miss, g) || rc != before + miss + g) bad++;
    }
  }
  ok(bad == 0, "random writes and reads match a model");
  hutch_ring_free(&m);
  hutch_ring_free(&r);
  return done_testing();
}
