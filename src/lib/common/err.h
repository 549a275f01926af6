/* hutch error convention (see docs/errors.md).
 *
 * A function that can fail takes `hutch_err *err` as its last argument,
 * returns -1 (or NULL) and fills `err` exactly once, at the failure site,
 * with the errno (0 when there is none), an HTTP status hint and a message.
 * Callers add context on the way up with hutch_err_wrap(), so that the
 * message reads as a chain: "create sandbox sb_x: copy template `host`: ENOSPC".
 */
#ifndef HUTCH_ERR_H
#define HUTCH_ERR_H

#include <stddef.h>

#define HUTCH_ERR_MSG_MAX 2048

typedef struct hutch_err {
  int errnum;      /* errno of the root cause, 0 if none */
  int status;      /* HTTP status to report: 4xx for the caller's mistake, 5xx for ours */
  char code[40];   /* stable machine-readable code, e.g. "invalid_argument" */
  char msg[HUTCH_ERR_MSG_MAX];
} hutch_err;

#define HUTCH_ERR_INIT {0, 0, {0}, {0}}

/* System failure: status 500, code "internal"; appends ": strerror(errnum)"
 * when errnum != 0.  Always returns -1. */
int hutch_err_sys(hutch_err *err, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Failure with an explicit status and code (client errors, conflicts).
 * Always returns -1. */
int hutch_err_set(hutch_err *err, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefix the message with context: "ctx: <old message>".  Returns -1. */
int hutch_err_wrap(hutch_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void hutch_err_clear(hutch_err *err);

/* Convenience: status 400 "invalid_argument". */
#define hutch_err_invalid(err, ...) hutch_err_set((err), 400, "invalid_argument", __VA_ARGS__)

#endif
