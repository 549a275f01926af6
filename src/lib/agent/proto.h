/* The hutch agent protocol: framed messages on one byte stream.
 *
 * Used between hutchd and hutch-shim (unix socket) and between hutch-shim
 * and hutch-init (socketpair for native; a unix socket or virtio-serial for
 * other runtimes).  Full description: docs/protocol.md.
 *
 * Frame = 12-byte header + payload:
 *   u32 length   (payload bytes, little endian, <= HUTCH_FRAME_MAX)
 *   u16 type     (enum hutch_msg)
 *   u16 flags    (0 for now; receivers ignore unknown bits)
 *   u32 id       (command id the frame refers to; 0 for connection-level)
 *
 * Structured payloads (SPAWN, EXIT, ...) are a sequence of TLV fields:
 *   u8 tag, u32 length (LE), bytes
 * so that every parser is bounded and no JSON library is needed in the
 * static hutch-init.  Unknown tags are skipped (forward compatible).
 *
 * This module only encodes and decodes; it does no I/O policy.  Thread
 * safety: none needed, all functions work on caller-owned buffers.
 */
#ifndef HUTCH_PROTO_H
#define HUTCH_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define HUTCH_PROTO_VERSION 2
#define HUTCH_FRAME_HDR 12
#define HUTCH_FRAME_MAX (1u << 20) /* 1 MiB payload bound, checked before allocating */

enum hutch_msg {
  HUTCH_MSG_HELLO = 1,      /* init->shim at start / shim->client on connect: TLV VERSION, PID */
  HUTCH_MSG_SPAWN = 2,      /* ->init: TLV ARG*, ENV*, CWD, TIMEOUT_MS, UID, GID, FLAGS */
  HUTCH_MSG_STARTED = 3,    /* init->: TLV PID */
  HUTCH_MSG_STDOUT = 4,     /* init->: raw bytes */
  HUTCH_MSG_STDERR = 5,     /* init->: raw bytes */
  HUTCH_MSG_STDIN = 6,      /* ->init: raw bytes */
  HUTCH_MSG_STDIN_CLOSE = 7,/* ->init: no payload */
  HUTCH_MSG_SIGNAL = 8,     /* ->init: TLV SIGNO */
  HUTCH_MSG_EXIT = 9,       /* init->: TLV EXIT_CODE or SIGNO, TIMED_OUT */
  HUTCH_MSG_ERROR = 10,     /* any direction: TLV ERRNO, MESSAGE (spawn failures, protocol errors) */
  HUTCH_MSG_SHUTDOWN = 11,  /* client->shim: stop the sandbox and exit */
  HUTCH_MSG_PING = 12,      /* client->shim or shim->init: answered with PONG */
  HUTCH_MSG_PONG = 13,
  HUTCH_MSG_INFO = 14,      /* client->shim: answered with INFO TLV INIT_PID, SHIM_PID */
  /* v2: commands that outlive their client, PTYs, flow control */
  HUTCH_MSG_CREDIT = 15,        /* shim->init: BYTES more output may be read (FLOW commands) */
  HUTCH_MSG_RESIZE = 16,        /* ->init: ROWS, COLS of a PTY command */
  HUTCH_MSG_STDIN_WRITTEN = 17, /* init->: BYTES of stdin reached the pipe (queue drained) */
  HUTCH_MSG_ATTACH = 18,        /* client->shim: NAME, FLAGS(bit0 replay) */
  HUTCH_MSG_ATTACHED = 19,      /* shim->client: NAME, DROPPED_OUT, DROPPED_ERR (u64) */
  HUTCH_MSG_WAIT = 20,          /* client->shim: NAME; answered with EXIT when it ends */
  HUTCH_MSG_LIST = 21,          /* client->shim: [NAME]; answered with LIST: JSON text */
  HUTCH_MSG_ACK = 22,           /* generic success reply to a request id */
  /* v2: file operations, answered by hutch-init (paths resolved inside) */
  HUTCH_MSG_FS_STAT = 32,   /* PATH -> FS_RESULT(ENTRY) */
  HUTCH_MSG_FS_LIST = 33,   /* PATH, DEPTH -> FS_RESULT(ENTRY...) */
  HUTCH_MSG_FS_MKDIR = 34,  /* PATH, MODE, FLAGS(bit0 parents) -> FS_RESULT */
  HUTCH_MSG_FS_REMOVE = 35, /* PATH, FLAGS(bit0 recursive) -> FS_RESULT */
  HUTCH_MSG_FS_MOVE = 36,   /* PATH, PATH2, FLAGS(bit0 overwrite) -> FS_RESULT */
  HUTCH_MSG_FS_OPEN = 37,   /* PATH, FLAGS(FS_O_*), MODE -> FS_RESULT(HANDLE, ENTRY) */
  HUTCH_MSG_FS_READ = 38,   /* HANDLE, LEN(<=1MiB) -> FS_DATA (empty payload = EOF) */
  HUTCH_MSG_FS_WRITE = 39,  /* HANDLE, DATA -> FS_RESULT */
  HUTCH_MSG_FS_CLOSE = 40,  /* HANDLE -> FS_RESULT (errors of a write surface here) */
  HUTCH_MSG_FS_RESULT = 41, /* init->: TLVs per request */
  HUTCH_MSG_FS_DATA = 42,   /* init->: raw bytes */
};

/* Frame types in [HUTCH_MSG_FS_FIRST, HUTCH_MSG_FS_LAST] are file requests:
 * the shim forwards them to hutch-init, remapping only the id. */
#define HUTCH_MSG_FS_FIRST HUTCH_MSG_FS_STAT
#define HUTCH_MSG_FS_LAST HUTCH_MSG_FS_CLOSE

enum hutch_tag {
  HUTCH_TAG_VERSION = 1,
  HUTCH_TAG_ARG = 2,
  HUTCH_TAG_ENV = 3,
  HUTCH_TAG_CWD = 4,
  HUTCH_TAG_TIMEOUT_MS = 5,
  HUTCH_TAG_UID = 6,
  HUTCH_TAG_GID = 7,
  HUTCH_TAG_FLAGS = 8,
  HUTCH_TAG_PID = 9,
  HUTCH_TAG_EXIT_CODE = 10,
  HUTCH_TAG_SIGNO = 11,
  HUTCH_TAG_TIMED_OUT = 12,
  HUTCH_TAG_ERRNO = 13,
  HUTCH_TAG_MESSAGE = 14,
  HUTCH_TAG_INIT_PID = 15,
  HUTCH_TAG_SHIM_PID = 16,
  HUTCH_TAG_ROWS = 17,
  HUTCH_TAG_COLS = 18,
  HUTCH_TAG_BYTES = 19,       /* u32 */
  HUTCH_TAG_NAME = 20,        /* command id string (cmd_…) */
  HUTCH_TAG_TAG = 21,         /* user tag of a command */
  HUTCH_TAG_DATA = 22,        /* raw bytes */
  HUTCH_TAG_DROPPED_OUT = 23, /* u64 */
  HUTCH_TAG_DROPPED_ERR = 24, /* u64 */
  HUTCH_TAG_PATH = 25,
  HUTCH_TAG_PATH2 = 26,
  HUTCH_TAG_DEPTH = 27,       /* u32 */
  HUTCH_TAG_MODE = 28,        /* u32 permission bits */
  HUTCH_TAG_HANDLE = 29,      /* u32 */
  HUTCH_TAG_LEN = 30,         /* u32 */
  HUTCH_TAG_ENTRY = 31,       /* nested TLVs: PATH, E_TYPE, E_SIZE, MODE, E_MTIME, UID, GID, E_LINK */
  HUTCH_TAG_E_TYPE = 32,      /* u32: 1 file, 2 dir, 3 symlink, 4 other */
  HUTCH_TAG_E_SIZE = 33,      /* u64 */
  HUTCH_TAG_E_MTIME = 34,     /* u64 seconds since the epoch */
  HUTCH_TAG_E_LINK = 35,      /* symlink target */
};

/* FS_OPEN flags */
#define HUTCH_FS_O_READ 1u
#define HUTCH_FS_O_WRITE 2u   /* create or truncate */
#define HUTCH_FS_O_PARENTS 4u /* create missing parent directories (0755) */

/* SPAWN flags */
#define HUTCH_SPAWN_STDIN 1u  /* keep a stdin pipe open (else /dev/null) */
#define HUTCH_SPAWN_PTY 2u    /* run on a new PTY of ROWS x COLS; output is STDOUT */
#define HUTCH_SPAWN_FLOW 4u   /* read output only as CREDIT allows (lossless streaming) */
#define HUTCH_SPAWN_ATTACH 8u /* client->shim: attach this connection at spawn */

struct hutch_frame_hdr {
  uint32_t len;
  uint16_t type;
  uint16_t flags;
  uint32_t id;
};

void hutch_frame_hdr_encode(const struct hutch_frame_hdr *h, unsigned char out[HUTCH_FRAME_HDR]);
/* Returns -1 (err set, status 400 "protocol") when len exceeds HUTCH_FRAME_MAX. */
int hutch_frame_hdr_decode(const unsigned char in[HUTCH_FRAME_HDR], struct hutch_frame_hdr *h, hutch_err *err);

/* Growable byte buffer used to build payloads. */
struct hutch_buf {
  unsigned char *data;
  size_t len, cap;
};
void hutch_buf_init(struct hutch_buf *b);
void hutch_buf_free(struct hutch_buf *b);
void hutch_buf_append(struct hutch_buf *b, const void *p, size_t n);
void hutch_buf_reset(struct hutch_buf *b);

void hutch_tlv_put(struct hutch_buf *b, uint8_t tag, const void *val, uint32_t len);
void hutch_tlv_put_str(struct hutch_buf *b, uint8_t tag, const char *s);
void hutch_tlv_put_u32(struct hutch_buf *b, uint8_t tag, uint32_t v);
void hutch_tlv_put_i32(struct hutch_buf *b, uint8_t tag, int32_t v);
void hutch_tlv_put_u64(struct hutch_buf *b, uint8_t tag, uint64_t v);

/* Iterator over a TLV payload.  hutch_tlv_next returns 1 with tag, val and len
 * set, 0 at the clean end, -1 on a truncated or malformed field. */
struct hutch_tlv_iter {
  const unsigned char *p;
  size_t left;
};
void hutch_tlv_iter_init(struct hutch_tlv_iter *it, const void *payload, size_t len);
int hutch_tlv_next(struct hutch_tlv_iter *it, uint8_t *tag, const unsigned char **val, uint32_t *len);
/* Decode helpers for fixed-size values: return -1 if len is wrong. */
int hutch_tlv_u32(const unsigned char *val, uint32_t len, uint32_t *out);
int hutch_tlv_i32(const unsigned char *val, uint32_t len, int32_t *out);
int hutch_tlv_u64(const unsigned char *val, uint32_t len, uint64_t *out);
/* First field with `tag` in a payload: 1 found, 0 absent, -1 malformed. */
int hutch_tlv_find(const void *payload, size_t len, uint8_t tag, const unsigned char **val, uint32_t *vlen);
/* Same, copied into a NUL-terminated string (rejects embedded NULs); caller frees. */
char *hutch_tlv_find_str(const void *payload, size_t len, uint8_t tag);
int hutch_tlv_find_u32(const void *payload, size_t len, uint8_t tag, uint32_t *out);

/* Blocking frame I/O on a stream fd.  hutch_frame_read returns 1 with the
 * payload in `payload` (reset first), 0 on clean EOF before a header, -1 on
 * error (err set).  hutch_frame_write writes header and payload with one
 * writev, retrying short writes. */
int hutch_frame_read(int fd, struct hutch_frame_hdr *h, struct hutch_buf *payload, hutch_err *err);
int hutch_frame_write(int fd, uint16_t type, uint32_t id, const void *payload, size_t len, hutch_err *err);

/* Incremental decoder for non-blocking readers: feed bytes, pop frames. */
struct hutch_frame_decoder {
  struct hutch_buf in;
};
void hutch_decoder_init(struct hutch_frame_decoder *d);
void hutch_decoder_free(struct hutch_frame_decoder *d);
void hutch_decoder_feed(struct hutch_frame_decoder *d, const void *p, size_t n);
/* Returns 1 and fills h/payload (payload points into the decoder, valid until
 * the next feed/pop), 0 if no complete frame yet, -1 if malformed. */
int hutch_decoder_pop(struct hutch_frame_decoder *d, struct hutch_frame_hdr *h, const unsigned char **payload,
                      hutch_err *err);
/* Drop the frame returned by the last successful pop. */
void hutch_decoder_consume(struct hutch_frame_decoder *d, const struct hutch_frame_hdr *h);

/* An EXIT payload: a command ended with exit_code, or by signal signo
 * (signo != 0, exit_code then 0); timed_out when its timeout killed it. */
struct hutch_exit {
  int32_t exit_code;
  int32_t signo;
  bool timed_out;
};
void hutch_exit_encode(struct hutch_buf *b, const struct hutch_exit *e);
void hutch_exit_decode(const void *payload, size_t len, struct hutch_exit *out);

/* A parsed SPAWN request.  Strings point into the payload (not owned). */
#define HUTCH_SPAWN_MAX_ARGS 4096
#define HUTCH_SPAWN_MAX_ENV 4096
struct hutch_spawn {
  const char **argv; /* NULL-terminated, owned array (free with hutch_spawn_free) */
  size_t argc;
  const char **envp; /* NULL-terminated, owned array */
  size_t envc;
  const char *cwd;
  uint32_t timeout_ms; /* 0 = none */
  uint32_t uid, gid;
  uint32_t flags;
  /* backing copy of the payload so strings are NUL-terminated */
  char *store;
};
void hutch_spawn_encode(struct hutch_buf *b, const char *const *argv, const char *const *envp, const char *cwd,
                        uint32_t timeout_ms, uint32_t uid, uint32_t gid, uint32_t flags);
int hutch_spawn_decode(const void *payload, size_t len, struct hutch_spawn *out, hutch_err *err);
void hutch_spawn_free(struct hutch_spawn *s);

#endif
