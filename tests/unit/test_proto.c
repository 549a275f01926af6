/* The agent protocol (src/lib/agent/proto.c): frame headers, TLV fields,
 * blocking frame I/O over a socketpair, the incremental decoder and the
 * SPAWN payload.  Every parser here reads bytes from another process, so the
 * malformed cases matter as much as the round trips. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent/proto.h"
#include "common/util.h"
#include "tap.h"

static void le32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)v;
  p[1] = (unsigned char)(v >> 8);
  p[2] = (unsigned char)(v >> 16);
  p[3] = (unsigned char)(v >> 24);
}

/* A raw header, bypassing hutch_frame_hdr_encode, for the malformed cases. */
static void raw_hdr(unsigned char out[HUTCH_FRAME_HDR], uint32_t len, uint16_t type, uint16_t flags, uint32_t id) {
  le32(out, len);
  out[4] = (unsigned char)type;
  out[5] = (unsigned char)(type >> 8);
  out[6] = (unsigned char)flags;
  out[7] = (unsigned char)(flags >> 8);
  le32(out + 8, id);
}

static void test_header(void) {
  unsigned char b[HUTCH_FRAME_HDR];
  struct hutch_frame_hdr h = {.len = 0x01020304 & 0xfffff, .type = 0x0a0b, .flags = 0x0c0d, .id = 0xdeadbeef};
  hutch_frame_hdr_encode(&h, b);
  static const unsigned char want[HUTCH_FRAME_HDR] = {0x04, 0x03, 0x02, 0x00, 0x0b, 0x0a,
                                                       0x0d, 0x0c, 0xef, 0xbe, 0xad, 0xde};
  ok(!memcmp(b, want, sizeof want), "header encodes little endian: len, type, flags, id");

  struct hutch_frame_hdr d;
  hutch_err err = HUTCH_ERR_INIT;
  memset(&d, 0xff, sizeof d);
  is_int(hutch_frame_hdr_decode(b, &d, &err), 0, "header decodes");
  ok(d.len == h.len && d.type == h.type && d.flags == h.flags && d.id == h.id, "decoded header equals the encoded one");

  raw_hdr(b, HUTCH_FRAME_MAX, HUTCH_MSG_STDOUT, 0, 1);
  is_int(hutch_frame_hdr_decode(b, &d, &err), 0, "a payload of exactly HUTCH_FRAME_MAX is accepted");
  is_int(d.len, HUTCH_FRAME_MAX, "len = HUTCH_FRAME_MAX");

  hutch_err_clear(&err);
  raw_hdr(b, HUTCH_FRAME_MAX + 1, HUTCH_MSG_STDOUT, 0, 1);
  is_int(hutch_frame_hdr_decode(b, &d, &err), -1, "HUTCH_FRAME_MAX + 1 is rejected");
  is_int(err.status, 400, "oversized frame: status 400");
  is_str(err.code, "protocol", "oversized frame: code protocol");
  ok(strstr(err.msg, "exceeds") != NULL, "oversized frame: message says why (%s)", err.msg);

  hutch_err_clear(&err);
  raw_hdr(b, 0xffffffffu, HUTCH_MSG_STDOUT, 0, 1);
  is_int(hutch_frame_hdr_decode(b, &d, &err), -1, "len 0xffffffff is rejected");

  hutch_err_clear(&err);
  raw_hdr(b, 0, 0, 0, 1);
  is_int(hutch_frame_hdr_decode(b, &d, &err), -1, "type 0 is rejected");
  is_int(err.status, 400, "type 0: status 400");
  is_str(err.code, "protocol", "type 0: code protocol");

  hutch_err_clear(&err);
  raw_hdr(b, 0, 0xffff, 0xffff, 0);
  is_int(hutch_frame_hdr_decode(b, &d, &err), 0, "unknown type and flag bits decode (policy is the caller's)");
  ok(d.type == 0xffff && d.flags == 0xffff && d.id == 0, "type/flags/id 0xffff/0xffff/0 preserved");

  /* NULL err must not crash. */
  raw_hdr(b, 0, 0, 0, 0);
  is_int(hutch_frame_hdr_decode(b, &d, NULL), -1, "decode with a NULL err still fails cleanly");
}

static void test_buf(void) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  ok(b.data == NULL && b.len == 0 && b.cap == 0, "buf_init: empty");
  hutch_buf_append(&b, NULL, 0);
  is_int(b.len, 0, "appending nothing keeps len 0");
  unsigned char chunk[1000];
  for (size_t i = 0; i < sizeof chunk; i++) chunk[i] = (unsigned char)(i * 7);
  for (int i = 0; i < 10; i++) hutch_buf_append(&b, chunk, sizeof chunk);
  is_int(b.len, 10000, "10 appends of 1000 bytes: len 10000");
  ok(b.cap >= b.len, "cap >= len");
  int same = 1;
  for (size_t i = 0; i < b.len; i++)
    if (b.data[i] != chunk[i % sizeof chunk]) same = 0;
  ok(same, "appended bytes are intact across growth");
  size_t cap = b.cap;
  hutch_buf_reset(&b);
  ok(b.len == 0 && b.cap == cap, "reset keeps the allocation");
  hutch_buf_free(&b);
  ok(b.data == NULL && b.len == 0 && b.cap == 0, "buf_free: empty again");
}

static void test_tlv(void) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "echo");
  hutch_tlv_put_u32(&b, HUTCH_TAG_UID, 0x11223344);
  hutch_tlv_put_i32(&b, HUTCH_TAG_EXIT_CODE, -5);
  hutch_tlv_put(&b, HUTCH_TAG_MESSAGE, NULL, 0);
  hutch_tlv_put(&b, 255, "\0\1\2", 3);
  is_int(b.len, 5 + 4 + 5 + 4 + 5 + 4 + 5 + 0 + 5 + 3, "TLV encoding is 5 header bytes + value per field");
  static const unsigned char first[] = {HUTCH_TAG_ARG, 4, 0, 0, 0, 'e', 'c', 'h', 'o',
                                        HUTCH_TAG_UID, 4, 0, 0, 0, 0x44, 0x33, 0x22, 0x11};
  ok(!memcmp(b.data, first, sizeof first), "TLV bytes: u8 tag, u32 LE length, value");

  struct hutch_tlv_iter it;
  uint8_t tag = 0;
  const unsigned char *val = NULL;
  uint32_t len = 0;
  hutch_tlv_iter_init(&it, b.data, b.len);
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 1, "field 1");
  ok(tag == HUTCH_TAG_ARG && len == 4 && !memcmp(val, "echo", 4), "field 1 is ARG \"echo\"");
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 1, "field 2");
  uint32_t u = 0;
  ok(tag == HUTCH_TAG_UID && hutch_tlv_u32(val, len, &u) == 0 && u == 0x11223344, "field 2 is UID 0x11223344");
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 1, "field 3");
  int32_t i32 = 0;
  ok(tag == HUTCH_TAG_EXIT_CODE && hutch_tlv_i32(val, len, &i32) == 0 && i32 == -5, "field 3 is EXIT_CODE -5");
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 1, "field 4");
  ok(tag == HUTCH_TAG_MESSAGE && len == 0, "field 4 is an empty MESSAGE");
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 1, "field 5");
  ok(tag == 255 && len == 3 && !memcmp(val, "\0\1\2", 3), "field 5: tag 255 with binary value");
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 0, "clean end");
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 0, "still the clean end when called again");

  /* Every strict prefix either ends on a field boundary (clean end) or
   * inside a field (-1); never reads past the prefix (ASan checks that, the
   * prefix is copied into an exact-size allocation). */
  size_t bounds[] = {0, 9, 18, 27, 32, 40};
  int all_right = 1;
  for (size_t cut = 0; cut < b.len; cut++) {
    unsigned char *p = xmalloc(cut ? cut : 1);
    memcpy(p, b.data, cut);
    hutch_tlv_iter_init(&it, p, cut);
    int r, fields = 0;
    while ((r = hutch_tlv_next(&it, &tag, &val, &len)) == 1) fields++;
    int boundary = 0;
    for (size_t k = 0; k < sizeof bounds / sizeof *bounds; k++)
      if (bounds[k] == cut) boundary = 1;
    int want = boundary ? 0 : -1;
    if (r != want) {
      all_right = 0;
      printf("#   prefix %zu: got %d after %d fields, expected %d\n", cut, r, fields, want);
    }
    free(p);
  }
  ok(all_right, "every truncated prefix returns -1 unless it ends on a field boundary");

  /* Malformed length fields. */
  unsigned char bad[9] = {HUTCH_TAG_ARG, 0, 0, 0, 0, 'a', 'b', 'c', 'd'};
  le32(bad + 1, 5); /* one byte more than there is */
  hutch_tlv_iter_init(&it, bad, sizeof bad);
  is_int(hutch_tlv_next(&it, &tag, &val, &len), -1, "length one past the end: -1");
  le32(bad + 1, 0xffffffffu);
  hutch_tlv_iter_init(&it, bad, sizeof bad);
  is_int(hutch_tlv_next(&it, &tag, &val, &len), -1, "length 0xffffffff: -1 (no wrap-around)");
  le32(bad + 1, 0xfffffffcu);
  hutch_tlv_iter_init(&it, bad, sizeof bad);
  is_int(hutch_tlv_next(&it, &tag, &val, &len), -1, "length 0xfffffffc: -1 (no wrap-around)");
  le32(bad + 1, 4);
  hutch_tlv_iter_init(&it, bad, sizeof bad);
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 1, "length exactly the rest: accepted");
  for (size_t n = 1; n < 5; n++) {
    hutch_tlv_iter_init(&it, bad, n);
    is_int(hutch_tlv_next(&it, &tag, &val, &len), -1, "%zu byte(s), less than a TLV header: -1", n);
  }
  hutch_tlv_iter_init(&it, NULL, 0);
  is_int(hutch_tlv_next(&it, &tag, &val, &len), 0, "empty payload: clean end");

  /* Fixed-size decoders. */
  static const unsigned char eight[8] = {1, 0, 0, 0, 2, 0, 0, 0};
  uint32_t out = 77;
  int32_t sout = 77;
  is_int(hutch_tlv_u32(eight, 4, &out), 0, "u32 of 4 bytes");
  is_int(out, 1, "u32 value 1");
  out = 77;
  is_int(hutch_tlv_u32(eight, 0, &out), -1, "u32 of 0 bytes: -1");
  is_int(hutch_tlv_u32(eight, 3, &out), -1, "u32 of 3 bytes: -1");
  is_int(hutch_tlv_u32(eight, 5, &out), -1, "u32 of 5 bytes: -1");
  is_int(hutch_tlv_u32(eight, 8, &out), -1, "u32 of 8 bytes: -1");
  is_int(out, 77, "u32 output untouched on failure");
  is_int(hutch_tlv_i32(eight, 2, &sout), -1, "i32 of 2 bytes: -1");
  is_int(sout, 77, "i32 output untouched on failure");
  static const unsigned char minus1[4] = {0xff, 0xff, 0xff, 0xff};
  is_int(hutch_tlv_i32(minus1, 4, &sout), 0, "i32 of 4 bytes");
  is_int(sout, -1, "i32 0xffffffff is -1");
  is_int(hutch_tlv_u32(minus1, 4, &out), 0, "u32 of 4 bytes");
  ok(out == 0xffffffffu, "u32 0xffffffff");

  hutch_buf_free(&b);
}

/* ---- blocking I/O over a socketpair ---- */

static int pair(int sv[2]) { return socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv); }

struct writer {
  int fd;
  const unsigned char *p;
  size_t n;
  int ret;
};
static void *writer_main(void *arg) {
  struct writer *w = arg;
  hutch_err err = HUTCH_ERR_INIT;
  w->ret = hutch_frame_write(w->fd, HUTCH_MSG_STDOUT, 99, w->p, w->n, &err);
  return NULL;
}

static void test_frame_io(void) {
  int sv[2];
  if (pair(sv) < 0) {
    ok(0, "socketpair: %s", strerror(errno));
    return;
  }
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_buf pl;
  hutch_buf_init(&pl);
  struct hutch_frame_hdr h;

  is_int(hutch_frame_write(sv[0], HUTCH_MSG_PING, 7, NULL, 0, &err), 0, "write an empty PING");
  is_int(hutch_frame_write(sv[0], HUTCH_MSG_STDOUT, 8, "hello", 5, &err), 0, "write STDOUT \"hello\"");
  is_int(hutch_frame_write(sv[0], HUTCH_MSG_STDERR, 0xffffffffu, "x", 1, &err), 0, "write STDERR with id 2^32-1");

  is_int(hutch_frame_read(sv[1], &h, &pl, &err), 1, "read frame 1");
  ok(h.type == HUTCH_MSG_PING && h.id == 7 && h.len == 0 && h.flags == 0 && pl.len == 0, "frame 1: empty PING id 7");
  is_int(hutch_frame_read(sv[1], &h, &pl, &err), 1, "read frame 2");
  ok(h.type == HUTCH_MSG_STDOUT && h.id == 8 && pl.len == 5 && !memcmp(pl.data, "hello", 5), "frame 2: STDOUT hello");
  is_int(hutch_frame_read(sv[1], &h, &pl, &err), 1, "read frame 3");
  ok(h.type == HUTCH_MSG_STDERR && h.id == 0xffffffffu && pl.len == 1 && pl.data[0] == 'x',
     "frame 3: payload reset (not appended) when the buffer is reused");

  /* Writes above the bound fail before touching the fd. */
  hutch_err_clear(&err);
  static unsigned char dummy[1];
  is_int(hutch_frame_write(sv[0], HUTCH_MSG_STDOUT, 1, dummy, (size_t)HUTCH_FRAME_MAX + 1, &err), -1,
         "writing a payload over HUTCH_FRAME_MAX fails");
  is_int(err.errnum, EMSGSIZE, "... with EMSGSIZE");

  /* A payload of exactly HUTCH_FRAME_MAX, bigger than the socket buffer, so
   * writer and reader run concurrently. */
  unsigned char *big = xmalloc(HUTCH_FRAME_MAX);
  for (size_t i = 0; i < HUTCH_FRAME_MAX; i++) big[i] = (unsigned char)(i * 31 + (i >> 11));
  struct writer w = {.fd = sv[0], .p = big, .n = HUTCH_FRAME_MAX, .ret = -2};
  pthread_t th;
  int started = pthread_create(&th, NULL, writer_main, &w) == 0;
  ok(started, "writer thread started");
  if (started) {
    int r = hutch_frame_read(sv[1], &h, &pl, &err);
    pthread_join(th, NULL);
    is_int(w.ret, 0, "1 MiB frame written");
    is_int(r, 1, "1 MiB frame read");
    ok(h.len == HUTCH_FRAME_MAX && pl.len == HUTCH_FRAME_MAX && !memcmp(pl.data, big, HUTCH_FRAME_MAX) && h.id == 99,
       "1 MiB payload intact");
  }
  free(big);

  /* Clean EOF before a header. */
  close(sv[0]);
  hutch_err_clear(&err);
  is_int(hutch_frame_read(sv[1], &h, &pl, &err), 0, "EOF before a header returns 0");
  close(sv[1]);
  hutch_buf_free(&pl);

  /* A header cut short. */
  unsigned char hdr[HUTCH_FRAME_HDR];
  if (pair(sv) == 0) {
    raw_hdr(hdr, 3, HUTCH_MSG_STDOUT, 0, 1);
    ok(write(sv[0], hdr, 5) == 5, "wrote 5 of 12 header bytes");
    close(sv[0]);
    hutch_err_clear(&err);
    is_int(hutch_frame_read(sv[1], &h, &pl, &err), -1, "truncated header is an error, not EOF");
    is_int(err.errnum, EPIPE, "truncated header: EPIPE");
    close(sv[1]);
  }

  /* A payload cut short. */
  if (pair(sv) == 0) {
    raw_hdr(hdr, 10, HUTCH_MSG_STDOUT, 0, 1);
    ok(write(sv[0], hdr, sizeof hdr) == (ssize_t)sizeof hdr && write(sv[0], "abcd", 4) == 4,
       "wrote a header for 10 bytes and 4 bytes");
    close(sv[0]);
    hutch_err_clear(&err);
    is_int(hutch_frame_read(sv[1], &h, &pl, &err), -1, "truncated payload is an error");
    is_int(err.errnum, EPIPE, "truncated payload: EPIPE");
    close(sv[1]);
    hutch_buf_free(&pl);
  }

  /* An oversized length is refused before allocating: the payload buffer
   * stays unallocated although the header claims 16 MiB. */
  if (pair(sv) == 0) {
    raw_hdr(hdr, 16u << 20, HUTCH_MSG_STDOUT, 0, 1);
    ok(write(sv[0], hdr, sizeof hdr) == (ssize_t)sizeof hdr, "wrote a header claiming 16 MiB");
    hutch_err_clear(&err);
    is_int(hutch_frame_read(sv[1], &h, &pl, &err), -1, "oversized frame rejected by frame_read");
    ok(pl.data == NULL && pl.cap == 0, "nothing was allocated for it");
    is_str(err.code, "protocol", "oversized frame: code protocol");
    close(sv[0]);
    close(sv[1]);
  }

  /* Type 0 over the wire. */
  if (pair(sv) == 0) {
    raw_hdr(hdr, 0, 0, 0, 1);
    ok(write(sv[0], hdr, sizeof hdr) == (ssize_t)sizeof hdr, "wrote a type-0 header");
    hutch_err_clear(&err);
    is_int(hutch_frame_read(sv[1], &h, &pl, &err), -1, "type 0 rejected by frame_read");
    close(sv[0]);
    close(sv[1]);
  }

  /* Reading from a bad fd. */
  hutch_err_clear(&err);
  is_int(hutch_frame_read(-1, &h, &pl, &err), -1, "read on fd -1 fails");
  is_int(err.errnum, EBADF, "... with EBADF");
  hutch_err_clear(&err);
  is_int(hutch_frame_write(-1, HUTCH_MSG_PING, 1, NULL, 0, &err), -1, "write on fd -1 fails");
  is_int(err.errnum, EBADF, "... with EBADF");
  hutch_buf_free(&pl);
}

/* ---- incremental decoder ---- */

struct frame_spec {
  uint16_t type;
  uint32_t id;
  size_t len;
};
static const struct frame_spec frames[] = {
    {HUTCH_MSG_HELLO, 0, 9},    {HUTCH_MSG_PING, 1, 0},       {HUTCH_MSG_STDOUT, 2, 1},
    {HUTCH_MSG_STDERR, 3, 4000}, {HUTCH_MSG_STDIN_CLOSE, 4, 0}, {HUTCH_MSG_STDIN, 5, 12},
    {HUTCH_MSG_EXIT, 6, 300},    {HUTCH_MSG_PONG, 0xffffffff, 0},
};
#define NFRAMES (sizeof frames / sizeof *frames)

static unsigned char payload_byte(size_t frame, size_t i) { return (unsigned char)(frame * 41 + i * 13 + 1); }

static void build_stream(struct hutch_buf *s) {
  for (size_t f = 0; f < NFRAMES; f++) {
    unsigned char hdr[HUTCH_FRAME_HDR];
    struct hutch_frame_hdr h = {.len = (uint32_t)frames[f].len, .type = frames[f].type, .id = frames[f].id};
    hutch_frame_hdr_encode(&h, hdr);
    hutch_buf_append(s, hdr, sizeof hdr);
    for (size_t i = 0; i < frames[f].len; i++) {
      unsigned char c = payload_byte(f, i);
      hutch_buf_append(s, &c, 1);
    }
  }
}

/* Pops every complete frame, checking each against `frames`. */
static int drain(struct hutch_frame_decoder *d, size_t *next, int *bad) {
  for (;;) {
    struct hutch_frame_hdr h;
    const unsigned char *p = NULL;
    hutch_err err = HUTCH_ERR_INIT;
    int r = hutch_decoder_pop(d, &h, &p, &err);
    if (r <= 0) return r;
    if (*next >= NFRAMES) {
      (*bad)++;
      return -1;
    }
    const struct frame_spec *want = &frames[*next];
    int good = h.type == want->type && h.id == want->id && h.len == want->len;
    for (size_t i = 0; good && i < h.len; i++)
      if (p[i] != payload_byte(*next, i)) good = 0;
    if (!good) (*bad)++;
    hutch_decoder_consume(d, &h);
    (*next)++;
  }
}

static void test_decoder(void) {
  struct hutch_buf s;
  hutch_buf_init(&s);
  build_stream(&s);

  /* Byte by byte. */
  struct hutch_frame_decoder d;
  hutch_decoder_init(&d);
  size_t next = 0;
  int bad = 0, err_seen = 0;
  for (size_t i = 0; i < s.len; i++) {
    hutch_decoder_feed(&d, s.data + i, 1);
    if (drain(&d, &next, &bad) < 0) err_seen = 1;
  }
  is_int(next, NFRAMES, "byte by byte: all %zu frames popped", NFRAMES);
  ok(!bad && !err_seen, "byte by byte: every frame intact, no errors");
  is_int(d.in.len, 0, "byte by byte: nothing left over");
  hutch_decoder_free(&d);

  /* Everything at once. */
  hutch_decoder_init(&d);
  next = 0;
  bad = err_seen = 0;
  hutch_decoder_feed(&d, s.data, s.len);
  if (drain(&d, &next, &bad) < 0) err_seen = 1;
  ok(next == NFRAMES && !bad && !err_seen && d.in.len == 0, "one feed: all frames popped intact");
  hutch_decoder_free(&d);

  /* Random chunk sizes, several seeds (deterministic). */
  int rounds_ok = 0;
  const int rounds = 200;
  for (int seed = 1; seed <= rounds; seed++) {
    srand((unsigned)seed);
    hutch_decoder_init(&d);
    next = 0;
    bad = err_seen = 0;
    size_t off = 0;
    while (off < s.len) {
      size_t n = (size_t)(rand() % (seed % 3 == 0 ? 5000 : 40)) + 1;
      if (n > s.len - off) n = s.len - off;
      hutch_decoder_feed(&d, s.data + off, n);
      off += n;
      if (drain(&d, &next, &bad) < 0) err_seen = 1;
    }
    if (next == NFRAMES && !bad && !err_seen && d.in.len == 0) rounds_ok++;
    else printf("#   seed %d: %zu frames, %d bad, err %d\n", seed, next, bad, err_seen);
    hutch_decoder_free(&d);
  }
  is_int(rounds_ok, rounds, "random chunk sizes: all frames intact in every one of %d rounds", rounds);

  /* Incomplete input. */
  hutch_decoder_init(&d);
  struct hutch_frame_hdr h;
  const unsigned char *p = NULL;
  hutch_err err = HUTCH_ERR_INIT;
  is_int(hutch_decoder_pop(&d, &h, &p, &err), 0, "empty decoder: no frame");
  hutch_decoder_feed(&d, s.data, HUTCH_FRAME_HDR - 1);
  is_int(hutch_decoder_pop(&d, &h, &p, &err), 0, "11 header bytes: no frame");
  hutch_decoder_feed(&d, s.data + HUTCH_FRAME_HDR - 1, 1 + frames[0].len - 1);
  is_int(hutch_decoder_pop(&d, &h, &p, &err), 0, "header and all but one payload byte: no frame");
  hutch_decoder_feed(&d, s.data + HUTCH_FRAME_HDR + frames[0].len - 1, 1);
  is_int(hutch_decoder_pop(&d, &h, &p, &err), 1, "last byte: the frame");
  is_int(hutch_decoder_pop(&d, &h, &p, &err), 1, "pop without consume returns the same frame again");
  is_int(h.len, frames[0].len, "same frame length");
  hutch_decoder_consume(&d, &h);
  is_int(hutch_decoder_pop(&d, &h, &p, &err), 0, "after consume: no frame");
  hutch_decoder_free(&d);

  /* Oversized length: rejected as soon as the header is there, without
   * buffering toward it. */
  hutch_decoder_init(&d);
  unsigned char hdr[HUTCH_FRAME_HDR];
  raw_hdr(hdr, HUTCH_FRAME_MAX + 1, HUTCH_MSG_STDOUT, 0, 1);
  hutch_decoder_feed(&d, hdr, sizeof hdr);
  hutch_err_clear(&err);
  is_int(hutch_decoder_pop(&d, &h, &p, &err), -1, "decoder rejects a length over HUTCH_FRAME_MAX");
  is_str(err.code, "protocol", "decoder: code protocol");
  is_int(err.status, 400, "decoder: status 400");
  hutch_decoder_free(&d);

  hutch_decoder_init(&d);
  raw_hdr(hdr, 0xffffffffu, HUTCH_MSG_STDOUT, 0, 1);
  hutch_decoder_feed(&d, hdr, sizeof hdr);
  is_int(hutch_decoder_pop(&d, &h, &p, &err), -1, "decoder rejects length 0xffffffff");
  hutch_decoder_free(&d);

  /* A valid frame followed by a bad one: the good one still comes out. */
  hutch_decoder_init(&d);
  raw_hdr(hdr, 2, HUTCH_MSG_STDOUT, 0, 5);
  hutch_decoder_feed(&d, hdr, sizeof hdr);
  hutch_decoder_feed(&d, "ok", 2);
  raw_hdr(hdr, 0, 0, 0, 6);
  hutch_decoder_feed(&d, hdr, sizeof hdr);
  int r1 = hutch_decoder_pop(&d, &h, &p, &err);
  ok(r1 == 1 && h.id == 5 && h.len == 2 && !memcmp(p, "ok", 2), "good frame before a bad one pops");
  if (r1 == 1) hutch_decoder_consume(&d, &h);
  is_int(hutch_decoder_pop(&d, &h, &p, &err), -1, "then the type-0 frame is rejected");
  hutch_decoder_free(&d);

  hutch_buf_free(&s);
}

/* ---- SPAWN ---- */

static void test_spawn(void) {
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_buf b;
  hutch_buf_init(&b);
  const char *argv[] = {"/bin/sh", "-c", "echo \"$X\" | tr a-z A-Z", "", "caf\xc3\xa9", NULL};
  const char *envp[] = {"X=1", "PATH=/usr/bin:/bin", "EMPTY=", NULL};
  hutch_spawn_encode(&b, argv, envp, "/work dir", 1500, 1000, 1001, HUTCH_SPAWN_STDIN);
  struct hutch_spawn s;
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), 0, "SPAWN round trip decodes");
  is_int(s.argc, 5, "argc 5");
  int args_ok = s.argc == 5 && s.argv[5] == NULL;
  for (size_t i = 0; args_ok && i < 5; i++) args_ok = !strcmp(s.argv[i], argv[i]);
  ok(args_ok, "argv round trips (incl. an empty arg and UTF-8), NULL-terminated");
  is_int(s.envc, 3, "envc 3");
  int env_ok = s.envc == 3 && s.envp[3] == NULL;
  for (size_t i = 0; env_ok && i < 3; i++) env_ok = !strcmp(s.envp[i], envp[i]);
  ok(env_ok, "envp round trips, NULL-terminated");
  is_str(s.cwd, "/work dir", "cwd");
  is_int(s.timeout_ms, 1500, "timeout_ms");
  is_int(s.uid, 1000, "uid");
  is_int(s.gid, 1001, "gid");
  is_int(s.flags, HUTCH_SPAWN_STDIN, "flags");
  hutch_spawn_free(&s);
  ok(s.argv == NULL && s.envp == NULL && s.store == NULL, "spawn_free clears the struct");

  /* Strings must not alias the caller's payload (payload freed after decode). */
  hutch_buf_reset(&b);
  const char *argv2[] = {"true", NULL};
  hutch_spawn_encode(&b, argv2, NULL, NULL, 0, 0xffffffffu, 0, 0);
  unsigned char *copy = xmalloc(b.len);
  memcpy(copy, b.data, b.len);
  int r = hutch_spawn_decode(copy, b.len, &s, &err);
  memset(copy, 'Z', b.len);
  free(copy);
  is_int(r, 0, "minimal SPAWN decodes");
  ok(s.argc == 1 && !strcmp(s.argv[0], "true"), "argv survives freeing the payload");
  ok(s.envc == 0 && s.envp && s.envp[0] == NULL, "no env: empty NULL-terminated envp");
  ok(s.cwd == NULL, "no cwd: NULL");
  ok(s.timeout_ms == 0 && s.uid == 0xffffffffu && s.gid == 0 && s.flags == 0, "numbers: 0, 2^32-1, 0, 0");
  hutch_spawn_free(&s);

  /* Defaults when the numeric fields are absent. */
  hutch_buf_reset(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "ls");
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), 0, "only an ARG: decodes");
  ok(s.timeout_ms == 0 && s.uid == 0 && s.gid == 0 && s.flags == 0 && s.cwd == NULL, "absent fields are zero");
  hutch_spawn_free(&s);

  /* No argv. */
  hutch_buf_reset(&b);
  hutch_spawn_encode(&b, NULL, envp, "/", 0, 0, 0, 0);
  hutch_err_clear(&err);
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), -1, "SPAWN without ARG rejected");
  is_int(err.status, 400, "no argv: 400");
  is_str(err.code, "protocol", "no argv: code protocol");
  ok(s.argv == NULL && s.store == NULL, "no argv: nothing allocated");
  hutch_err_clear(&err);
  is_int(hutch_spawn_decode(NULL, 0, &s, &err), -1, "empty SPAWN payload rejected");

  /* NUL inside each kind of string. */
  static const uint8_t string_tags[] = {HUTCH_TAG_ARG, HUTCH_TAG_ENV, HUTCH_TAG_CWD};
  for (size_t t = 0; t < sizeof string_tags; t++) {
    hutch_buf_reset(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "sh");
    hutch_tlv_put(&b, string_tags[t], "a\0b", 3);
    hutch_err_clear(&err);
    is_int(hutch_spawn_decode(b.data, b.len, &s, &err), -1, "NUL inside tag %u rejected", string_tags[t]);
    ok(strstr(err.msg, "NUL") != NULL, "... message mentions NUL (%s)", err.msg);
    ok(s.argv == NULL && s.store == NULL, "... nothing allocated");
  }
  hutch_buf_reset(&b);
  hutch_tlv_put(&b, HUTCH_TAG_ARG, "sh\0", 3);
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), -1, "trailing NUL inside an ARG rejected");

  /* Wrong-size numeric fields (the failure happens in the second pass,
   * after allocating: ASan/LSan check it frees). */
  static const uint8_t num_tags[] = {HUTCH_TAG_TIMEOUT_MS, HUTCH_TAG_UID, HUTCH_TAG_GID, HUTCH_TAG_FLAGS};
  static const uint32_t sizes[] = {0, 3, 5, 8};
  for (size_t t = 0; t < sizeof num_tags; t++) {
    hutch_buf_reset(&b);
    hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "sh");
    hutch_tlv_put_str(&b, HUTCH_TAG_ENV, "A=B");
    hutch_tlv_put(&b, num_tags[t], "\1\2\3\4\5\6\7\10", sizes[t]);
    hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "after");
    hutch_err_clear(&err);
    is_int(hutch_spawn_decode(b.data, b.len, &s, &err), -1, "tag %u with %u bytes rejected", num_tags[t], sizes[t]);
    ok(strstr(err.msg, "wrong size") != NULL && err.status == 400, "... 400 \"%s\"", err.msg);
    ok(s.argv == NULL && s.envp == NULL && s.store == NULL, "... and the partial result is freed");
  }

  /* Too many arguments / variables. */
  hutch_buf_reset(&b);
  for (int i = 0; i < HUTCH_SPAWN_MAX_ARGS; i++) hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "a");
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), 0, "exactly HUTCH_SPAWN_MAX_ARGS args accepted");
  is_int(s.argc, HUTCH_SPAWN_MAX_ARGS, "argc = HUTCH_SPAWN_MAX_ARGS");
  hutch_spawn_free(&s);
  hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "a");
  hutch_err_clear(&err);
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), -1, "HUTCH_SPAWN_MAX_ARGS + 1 args rejected");
  ok(err.status == 400 && strstr(err.msg, "too many") != NULL, "... 400 \"%s\"", err.msg);
  ok(s.argv == NULL, "... nothing allocated");

  hutch_buf_reset(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "env");
  for (int i = 0; i < HUTCH_SPAWN_MAX_ENV; i++) hutch_tlv_put_str(&b, HUTCH_TAG_ENV, "K=V");
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), 0, "exactly HUTCH_SPAWN_MAX_ENV variables accepted");
  hutch_spawn_free(&s);
  hutch_tlv_put_str(&b, HUTCH_TAG_ENV, "K=V");
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), -1, "HUTCH_SPAWN_MAX_ENV + 1 variables rejected");

  /* Unknown tags are skipped, wherever they are. */
  hutch_buf_reset(&b);
  hutch_tlv_put(&b, 200, "zzz", 3);
  hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "one");
  hutch_tlv_put(&b, 99, "\0\0\0", 3); /* NUL bytes in an unknown tag are fine */
  hutch_tlv_put(&b, HUTCH_TAG_PID, "12345678", 8); /* a known tag that SPAWN does not use */
  hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "two");
  hutch_tlv_put(&b, 0, NULL, 0);
  hutch_tlv_put_u32(&b, HUTCH_TAG_UID, 5);
  hutch_tlv_put(&b, 255, "x", 1);
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), 0, "unknown tags skipped");
  ok(s.argc == 2 && !strcmp(s.argv[0], "one") && !strcmp(s.argv[1], "two") && s.argv[2] == NULL,
     "argv is the two ARGs in order");
  is_int(s.uid, 5, "uid after unknown tags");
  hutch_spawn_free(&s);

  /* Truncated SPAWN payloads: every strict prefix that is not a field
   * boundary is malformed (and none may crash or leak). */
  hutch_buf_reset(&b);
  hutch_spawn_encode(&b, argv, envp, "/", 1, 2, 3, 4);
  int trunc_ok = 1;
  for (size_t cut = 1; cut < b.len; cut++) {
    unsigned char *p = xmalloc(cut);
    memcpy(p, b.data, cut);
    struct hutch_spawn t;
    hutch_err e2 = HUTCH_ERR_INIT;
    int rr = hutch_spawn_decode(p, cut, &t, &e2);
    if (rr == 0) hutch_spawn_free(&t);
    else if (e2.status != 400) trunc_ok = 0;
    free(p);
  }
  ok(trunc_ok, "truncated SPAWN payloads fail with 400 or decode a prefix, never crash");
  hutch_buf_reset(&b);
  hutch_spawn_encode(&b, argv, NULL, NULL, 0, 0, 0, 0);
  hutch_err_clear(&err);
  is_int(hutch_spawn_decode(b.data, b.len - 1, &s, &err), -1, "SPAWN cut inside the last field rejected");
  ok(strstr(err.msg, "malformed") != NULL, "... \"%s\"", err.msg);

  /* Duplicate CWD: the last one wins, nothing leaks. */
  hutch_buf_reset(&b);
  hutch_tlv_put_str(&b, HUTCH_TAG_ARG, "pwd");
  hutch_tlv_put_str(&b, HUTCH_TAG_CWD, "/first");
  hutch_tlv_put_str(&b, HUTCH_TAG_CWD, "/second");
  is_int(hutch_spawn_decode(b.data, b.len, &s, &err), 0, "two CWD fields decode");
  is_str(s.cwd, "/second", "the last CWD wins");
  hutch_spawn_free(&s);

  hutch_buf_free(&b);
}

static void test_exit(void) {
  static const struct hutch_exit cases[] = {{0, 0, false}, {3, 0, false}, {0, 9, true}, {0, 15, false}, {255, 0, true}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_exit_encode(&b, &cases[i]);
    struct hutch_exit got;
    hutch_exit_decode(b.data, b.len, &got);
    ok(got.exit_code == cases[i].exit_code && got.signo == cases[i].signo && got.timed_out == cases[i].timed_out,
       "EXIT round trip: code %d signal %d timed_out %d", cases[i].exit_code, cases[i].signo, cases[i].timed_out);
    hutch_buf_free(&b);
  }
  struct hutch_exit got = {7, 7, true};
  hutch_exit_decode(NULL, 0, &got);
  ok(got.exit_code == 0 && got.signo == 0 && !got.timed_out, "an empty EXIT payload decodes as a clean exit");
  unsigned char bad[] = {HUTCH_TAG_SIGNO, 2, 0, 0, 0, 9, 9};
  hutch_exit_decode(bad, sizeof bad, &got);
  ok(got.signo == 0, "a wrong-sized SIGNO field is ignored");
}

int main(void) {
  test_exit();
  test_header();
  test_buf();
  test_tlv();
  test_frame_io();
  test_decoder();
  test_spawn();
  return done_testing();
}
