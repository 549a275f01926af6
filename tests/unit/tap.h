/* Minimal TAP producer for hutch's C unit tests (run with `prove`). */
#ifndef HUTCH_TAP_H
#define HUTCH_TAP_H

#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

#define ok(cond, ...)                                                   \
  do {                                                                  \
    int ok_ = !!(cond);                                                 \
    tap_n++;                                                            \
    if (!ok_) tap_failed++;                                             \
    printf("%sok %d - ", ok_ ? "" : "not ", tap_n);                     \
    printf(__VA_ARGS__);                                                \
    printf("\n");                                                       \
    if (!ok_) printf("#   failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
  } while (0)

#define is_int(a, b, ...)                                                       \
  do {                                                                          \
    long long a_ = (long long)(a), b_ = (long long)(b);                         \
    ok(a_ == b_, __VA_ARGS__);                                                  \
    if (a_ != b_) printf("#   got %lld, expected %lld\n", a_, b_);              \
  } while (0)

#define is_str(a, b, ...)                                                       \
  do {                                                                          \
    const char *a_ = (a), *b_ = (b);                                            \
    int eq_ = a_ && b_ && strcmp(a_, b_) == 0;                                  \
    ok(eq_, __VA_ARGS__);                                                       \
    if (!eq_) printf("#   got '%s', expected '%s'\n", a_ ? a_ : "(null)", b_ ? b_ : "(null)"); \
  } while (0)

#define skip_all(why)                     \
  do {                                    \
    printf("1..0 # SKIP %s\n", why);      \
    return 0;                             \
  } while (0)

static inline int done_testing(void) {
  printf("1..%d\n", tap_n);
  return tap_failed ? 1 : 0;
}

#endif
