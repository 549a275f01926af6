/* The lifecycle table of docs/api.md ("Lifecycle"): which call fits which
 * state, which is an idempotent no-op, and what wake means. */
#include <string.h>

#include "lifecycle/ops.h"
#include "tap.h"

static int fit(const char *verb, const char *state) {
  hutch_err err = HUTCH_ERR_INIT;
  int r = hutch_ops_fit(verb, state, "sb_x", &err);
  if (r < 0 && err.status == 409 && !strstr(err.msg, state)) return -99; /* 409 must name the state */
  return r;
}

int main(void) {
  static const struct {
    const char *verb, *state;
    int want;
  } cases[] = {
      {"pause", "running", 0},     {"pause", "paused", 1},       {"pause", "stopped", -1},
      {"pause", "suspended", -1},  {"resume", "paused", 0},      {"resume", "running", 1},
      {"resume", "stopped", -1},   {"stop", "running", 0},       {"stop", "paused", 0},
      {"stop", "stopped", 1},      {"stop", "suspended", -1},    {"start", "stopped", 0},
      {"start", "running", 1},     {"start", "suspended", -1},   {"start", "paused", -1},
      {"suspend", "running", 0},   {"suspend", "paused", 0},     {"suspend", "stopped", 0},
      {"suspend", "suspended", 1}, {"suspend", "error", -1},     {"restore", "suspended", 0},
      {"restore", "running", 1},   {"restore", "stopped", -1},   {"wake", "running", 1},
      {"wake", "error", -1},       {"pause", "error", -1},       {"start", "creating", -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    is_int(fit(cases[i].verb, cases[i].state), cases[i].want, "%s on a %s sandbox", cases[i].verb, cases[i].state);
  hutch_err err = HUTCH_ERR_INIT;
  ok(hutch_ops_fit("explode", "running", "sb_x", &err) < 0 && err.status == 400, "an unknown call is 400");
  is_str(hutch_ops_wake_verb("paused"), "resume", "wake resumes a paused sandbox");
  is_str(hutch_ops_wake_verb("stopped"), "start", "wake starts a stopped sandbox");
  is_str(hutch_ops_wake_verb("suspended"), "restore", "wake restores a suspended sandbox");
  is_str(hutch_ops_wake_verb("running"), "wake", "wake on a running sandbox is a no-op");
  return done_testing();
}
