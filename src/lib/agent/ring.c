#include "agent/ring.h"

#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void hutch_ring_init(struct hutch_ring *r, size_t cap) {
  memset(r, 0, sizeof *r);
  r->cap = cap ? cap : 1;
}

void hutch_ring_free(struct hutch_ring *r) {
  free(r->buf);
  r->buf = NULL;
}

void hutch_ring_write(struct hutch_ring *r, const void *p, size_t n) {
  const unsigned char *s = p;
  if (!r->buf) r->buf = xmalloc(r->cap);
  if (n > r->cap) { /* only the last cap bytes can survive */
    s += n - r->cap;
    r->end += n - r->cap;
    n = r->cap;
  }
  size_t pos = (size_t)(r->end % r->cap);
  size_t first = r->cap - pos < n ? r->cap - pos : n;
  memcpy(r->buf + pos, s, first);
  memcpy(r->buf, s + first, n - first);
  r->end += n;
  if (r->end - r->start > r->cap) r->start = r->end - r->cap;
}

size_t hutch_ring_read(const struct hutch_ring *r, uint64_t *cursor, void *out, size_t max, uint64_t *missed) {
  if (missed) *missed = 0;
  if (*cursor < r->start) {
    if (missed) *missed = r->start - *cursor;
    *cursor = r->start;
  }
  if (*cursor >= r->end || !r->buf) return 0;
  uint64_t avail = r->end - *cursor;
  size_t n = avail < max ? (size_t)avail : max;
  size_t pos = (size_t)(*cursor % r->cap);
  size_t first = r->cap - pos < n ? r->cap - pos : n;
  memcpy(out, r->buf + pos, first);
  memcpy((unsigned char *)out + first, r->buf, n - first);
  *cursor += n;
  return n;
}
