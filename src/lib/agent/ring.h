/* A byte ring addressed by absolute offsets: it holds the stream's bytes
 * [start, end); writing past its capacity drops the oldest bytes (start
 * advances).  Readers keep their own cursor and learn how much they missed.
 * Used by hutch-shim for command output, so a late or slow client never
 * makes the shim's memory grow. Not thread-safe (the shim is one thread). */
#ifndef HUTCH_RING_H
#define HUTCH_RING_H

#include <stddef.h>
#include <stdint.h>

struct hutch_ring {
  unsigned char *buf;
  size_t cap;
  uint64_t start, end;
};

void hutch_ring_init(struct hutch_ring *r, size_t cap); /* allocates lazily on first write */
void hutch_ring_free(struct hutch_ring *r);
void hutch_ring_write(struct hutch_ring *r, const void *p, size_t n);
/* Copy up to max bytes from absolute offset *cursor.  If *cursor is older
 * than start, *missed gets the gap and the read begins at start.  Advances
 * *cursor; returns the bytes copied. */
size_t hutch_ring_read(const struct hutch_ring *r, uint64_t *cursor, void *out, size_t max, uint64_t *missed);
static inline uint64_t hutch_ring_len(const struct hutch_ring *r) { return r->end - r->start; }

#endif
