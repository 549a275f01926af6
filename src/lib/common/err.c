#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void set_code(hutch_err *err, const char *code) {
  snprintf(err->code, sizeof err->code, "%s", code);
}

int hutch_err_sys(hutch_err *err, int errnum, const char *fmt, ...) {
  if (!err) return -1;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  if (errnum && n >= 0 && (size_t)n < sizeof err->msg)
    snprintf(err->msg + n, sizeof err->msg - (size_t)n, ": %s", strerror(errnum));
  err->errnum = errnum;
  err->status = 500;
  set_code(err, "internal");
  return -1;
}

int hutch_err_set(hutch_err *err, int status, const char *code, const char *fmt, ...) {
  if (!err) return -1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof err->msg, fmt, ap);
  va_end(ap);
  err->errnum = 0;
  err->status = status;
  set_code(err, code);
  return -1;
}

int hutch_err_wrap(hutch_err *err, const char *fmt, ...) {
  if (!err) return -1;
  char ctx[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof ctx, fmt, ap);
  va_end(ap);
  char old[HUTCH_ERR_MSG_MAX];
  memcpy(old, err->msg, sizeof old);
  snprintf(err->msg, sizeof err->msg, "%.500s: %.1500s", ctx, old);
  if (!err->status) {
    err->status = 500;
    set_code(err, "internal");
  }
  return -1;
}

void hutch_err_clear(hutch_err *err) {
  if (!err) return;
  memset(err, 0, sizeof *err);
}
