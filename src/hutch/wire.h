/* Pure helpers for the streaming verbs of the `hutch` CLI: base64, an
 * NDJSON line splitter with a bounded line length, the exit status of a
 * finished command, and display helpers.  No I/O, so that
 * tests/unit/test_cli_args.c can check them directly. */
#ifndef HUTCH_CLI_WIRE_H
#define HUTCH_CLI_WIRE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"

/* Longest attach event line accepted (checked before the buffer grows). */
#define HUTCH_MAX_EVENT_LINE (16u << 20)

/* Decode standard base64 (RFC 4648, '=' padding optional, no whitespace)
 * into out, which must hold at least hutch_b64_max_decoded(n) bytes.
 * Returns the decoded length, or -1 for invalid input. */
static inline size_t hutch_b64_max_decoded(size_t n) { return n / 4 * 3 + 3; }
long hutch_b64_decode(const char *in, size_t n, unsigned char *out);

/* Splits a byte stream into '\n'-terminated lines.  Complete lines inside
 * one chunk are handed out without copying; only a partial line is kept,
 * and it may not grow beyond `max` bytes. */
typedef int (*hutch_line_fn)(void *ctx, const char *line, size_t len, hutch_err *err);
typedef struct hutch_lines {
  char *buf;
  size_t len, cap, max;
} hutch_lines;
void hutch_lines_init(hutch_lines *l, size_t max);
/* Calls fn for every complete line (without its '\n'; a trailing '\r' is
 * kept).  Returns 0, or -1 when fn fails or a line is longer than max. */
int hutch_lines_feed(hutch_lines *l, const char *data, size_t n, hutch_line_fn fn, void *ctx,
                     hutch_err *err);
/* Bytes of an unterminated last line still held. */
static inline size_t hutch_lines_pending(const hutch_lines *l) { return l->len; }
void hutch_lines_free(hutch_lines *l);

/* The CLI's exit status for a finished command (an attach `exit` event or
 * a command object): exit_code when it is 0..255, else 124 when it timed
 * out, else 128+signal, else 1. */
int hutch_command_status(json_t *obj);

/* A command object's argv as one display-safe line (words with blanks or
 * quotes are single-quoted).  Returns a malloc'ed string. */
char *hutch_argv_display(json_t *argv);

/* A byte count (a JSON integer) for people: "512 B", "1.5 KiB",
 * "20.0 MiB", ... ; "-" when v is not a non-negative integer.  Returns a
 * malloc'ed string. */
char *hutch_size_display(json_t *v);

/* Join a sandbox path and a name with exactly one '/' between them. */
char *hutch_path_join(const char *dir, const char *name);
/* The last component of a path, ignoring trailing slashes ("" for "/").
 * Returns a malloc'ed string. */
char *hutch_path_base(const char *path);
/* True when the path ends with "/." (docker cp: copy the contents). */
bool hutch_path_is_contents(const char *path);

#endif
