/* Small helpers shared by every hutch program: allocation that aborts on
 * failure, cleanup attributes that make ownership visible, fd I/O loops. */
#ifndef HUTCH_UTIL_H
#define HUTCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

void hutch_freep(void *p);
void hutch_closep(int *fd);
#define cleanup_free __attribute__((cleanup(hutch_freep)))
#define cleanup_close __attribute__((cleanup(hutch_closep)))

/* Take ownership of *pp, leaving NULL behind. */
static inline void *hutch_steal(void *pp) {
  void **p = (void **)pp;
  void *v = *p;
  *p = NULL;
  return v;
}
#define steal_pointer(pp) hutch_steal(pp)
static inline int steal_fd(int *fd) {
  int v = *fd;
  *fd = -1;
  return v;
}

/* Loops over EINTR and short transfers.  read_full returns bytes read (less
 * than n only at EOF) or -1. */
ssize_t read_full(int fd, void *buf, size_t n);
int write_full(int fd, const void *buf, size_t n);

/* Write a whole file (O_CLOEXEC|O_TRUNC|O_CREAT) with `mode`. */
int write_file(const char *path, const void *data, size_t n, mode_t mode, hutch_err *err);
int write_file_str(const char *path, const char *s, hutch_err *err);
/* Read a whole file of at most `max` bytes into a NUL-terminated buffer. */
char *read_file(const char *path, size_t max, size_t *len_out, hutch_err *err);

int mkdir_p(const char *path, mode_t mode, hutch_err *err);
/* Remove a tree without following symlinks and without crossing mount
 * points (EBUSY is reported, nothing beneath a mount is touched). */
int rm_rf(const char *path, hutch_err *err);
/* Copy a directory tree (regular files, dirs, symlinks) preserving mode. */
int copy_tree(const char *src, const char *dst, hutch_err *err);

uint64_t now_ms(void);      /* CLOCK_REALTIME, milliseconds */
uint64_t mono_us(void);     /* CLOCK_MONOTONIC, microseconds */
void iso8601(uint64_t ms, char out[32]);

/* Random identifier "<prefix>_<20 lowercase base32 chars>". */
void hutch_random_id(const char *prefix, char *out, size_t outlen);
int hutch_random_bytes(void *buf, size_t n);
void hex_encode(const unsigned char *in, size_t n, char *out /* 2n+1 */);

int set_cloexec(int fd);
int set_nonblock(int fd, bool on);

/* Run a program (PATH searched) and wait for it.  stdin from in_fd (-1:
 * /dev/null), stdout to out_fd (-1: captured with stderr).  Each line of the
 * captured output goes to on_line (may be NULL).  A failure names the program,
 * its exit status and its last line of output. */
typedef void (*hutch_run_line_fn)(void *arg, const char *line);
int hutch_run(const char *const argv[], int in_fd, int out_fd, hutch_run_line_fn on_line, void *arg, hutch_err *err);
/* The same in two steps, for a program whose stdin or stdout the caller
 * feeds or drains meanwhile (hutch_spawn_wait closes the child's fds). */
struct hutch_child {
  pid_t pid;      /* the middle process (see util.c), not the program */
  int output_fd;  /* the program's stderr (and stdout when out_fd was -1) */
  int status_fd;  /* its wait status arrives here */
};
int hutch_spawn(const char *const argv[], int in_fd, int out_fd, struct hutch_child *child, hutch_err *err);
int hutch_spawn_wait(const char *name, struct hutch_child *child, hutch_run_line_fn on_line, void *arg,
                     hutch_err *err);

/* Parse a non-negative decimal integer, full string, bounded by max. */
int parse_u64(const char *s, uint64_t max, uint64_t *out);

#endif
