/* hutch-gateway's control protocol and sandbox table (see control.h). */
#include "gateway/control.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

void gw_table_init(struct gw_table *t) { memset(t, 0, sizeof *t); }

void gw_table_free(struct gw_table *t) {
  for (size_t i = 0; i < t->n; i++) hutch_policy_free(t->v[i].policy);
  free(t->v);
  memset(t, 0, sizeof *t);
}

const struct gw_sandbox *gw_table_find_addr(const struct gw_table *t, const struct hutch_ip *ip) {
  if (!ip || ip->family != AF_INET) return NULL;
  for (size_t i = 0; i < t->n; i++)
    if (hutch_ip_equal(&t->v[i].addr, ip)) return &t->v[i];
  return NULL;
}

const struct gw_sandbox *gw_table_find_id(const struct gw_table *t, const char *id) {
  for (size_t i = 0; i < t->n; i++)
    if (!strcmp(t->v[i].id, id)) return &t->v[i];
  return NULL;
}

int gw_table_set(struct gw_table *t, const char *id, const struct hutch_ip *addr, struct hutch_policy *policy,
                 hutch_err *err) {
  if (!gw_sandbox_id_ok(id)) {
    hutch_policy_free(policy);
    return hutch_err_invalid(err, "sandbox: invalid id");
  }
  const struct gw_sandbox *other = gw_table_find_addr(t, addr);
  if (other && strcmp(other->id, id) != 0) {
    char a[HUTCH_IP_TEXT_MAX];
    hutch_ip_to_text(addr, a);
    hutch_policy_free(policy);
    return hutch_err_invalid(err, "addr: %s is already sandbox %s's (remove it first)", a, other->id);
  }
  struct gw_sandbox *s = (struct gw_sandbox *)gw_table_find_id(t, id);
  if (!s) {
    if (t->n >= GW_MAX_SANDBOXES) {
      hutch_policy_free(policy);
      return hutch_err_set(err, 503, "unavailable", "at most %d sandboxes", GW_MAX_SANDBOXES);
    }
    if (t->n == t->cap) {
      t->cap = t->cap ? t->cap * 2 : 16;
      t->v = xrealloc(t->v, t->cap * sizeof *t->v);
    }
    s = &t->v[t->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->id, sizeof s->id, "%s", id);
  }
  hutch_policy_free(s->policy);
  s->policy = policy;
  s->addr = *addr;
  return 0;
}

int gw_table_remove(struct gw_table *t, const char *id, struct hutch_ip *addr) {
  for (size_t i = 0; i < t->n; i++) {
    if (strcmp(t->v[i].id, id) != 0) continue;
    if (addr) *addr = t->v[i].addr;
    hutch_policy_free(t->v[i].policy);
    t->v[i] = t->v[--t->n];
    return 1;
  }
  return 0;
}

bool gw_sandbox_id_ok(const char *s) {
  size_t n = s ? strlen(s) : 0;
  if (n == 0 || n > GW_SANDBOX_ID_MAX || !strcmp(s, "unknown")) return false;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

void gw_ctl_cmd_clear(struct gw_ctl_cmd *cmd) {
  hutch_policy_free(cmd->policy);
  memset(cmd, 0, sizeof *cmd);
}


static int only_members(json_t *o, const char *const *allowed, hutch_err *err) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    bool ok = false;
    for (size_t i = 0; allowed[i]; i++)
      if (!strcmp(k, allowed[i])) ok = true;
    if (!ok) return hutch_err_invalid(err, "unknown member `%.64s`", k);
  }
  return 0;
}

static int get_sandbox(json_t *o, struct gw_ctl_cmd *cmd, hutch_err *err) {
  json_t *s = json_object_get(o, "sandbox");
  if (!json_is_string(s)) return hutch_err_invalid(err, "sandbox: expected a string");
  if (json_string_length(s) != strlen(json_string_value(s)) || !gw_sandbox_id_ok(json_string_value(s)))
    return hutch_err_invalid(err, "sandbox: expected 1 to %d of [A-Za-z0-9_-], not `unknown`", GW_SANDBOX_ID_MAX);
  snprintf(cmd->sandbox, sizeof cmd->sandbox, "%s", json_string_value(s));
  return 0;
}

int gw_ctl_parse(const char *line, size_t len, struct gw_ctl_cmd *cmd, hutch_err *err) {
  memset(cmd, 0, sizeof *cmd);
  if (len > GW_CTL_LINE_MAX) return hutch_err_invalid(err, "line longer than %u bytes", GW_CTL_LINE_MAX);
  json_error_t je;
  json_auto_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &je);
  if (!o) return hutch_err_invalid(err, "invalid JSON: %s", je.text);
  if (!json_is_object(o)) return hutch_err_invalid(err, "expected an object");
  json_t *op = json_object_get(o, "op");
  if (!json_is_string(op)) return hutch_err_invalid(err, "op: expected \"set\", \"remove\" or \"list\"");
  const char *ops = json_string_value(op);
  if (!strcmp(ops, "list")) {
    static const char *const allowed[] = {"op", NULL};
    if (only_members(o, allowed, err) < 0) return -1;
    cmd->op = GW_CTL_LIST;
    return 0;
  }
  if (!strcmp(ops, "remove")) {
    static const char *const allowed[] = {"op", "sandbox", NULL};
    if (only_members(o, allowed, err) < 0 || get_sandbox(o, cmd, err) < 0) return -1;
    cmd->op = GW_CTL_REMOVE;
    return 0;
  }
  if (strcmp(ops, "set") != 0) return hutch_err_invalid(err, "op: expected \"set\", \"remove\" or \"list\"");
  static const char *const allowed[] = {"op", "sandbox", "addr", "policy", NULL};
  if (only_members(o, allowed, err) < 0 || get_sandbox(o, cmd, err) < 0) return -1;
  json_t *a = json_object_get(o, "addr");
  if (!json_is_string(a)) return hutch_err_invalid(err, "addr: expected an IPv4 address");
  struct hutch_ip ip;
  if (hutch_ip_parse(json_string_value(a), json_string_length(a), &ip) < 0 || ip.family != AF_INET)
    return hutch_err_invalid(err, "addr: expected an IPv4 address");
  enum hutch_addr_class cls = hutch_addr_classify(&ip, NULL, NULL);
  if (cls == HUTCH_ADDR_UNSPECIFIED || cls == HUTCH_ADDR_MULTICAST || cls == HUTCH_ADDR_BROADCAST)
    return hutch_err_invalid(err, "addr: not a unicast address");
  json_t *p = json_object_get(o, "policy");
  if (!p) return hutch_err_invalid(err, "policy: missing");
  struct hutch_policy *pol = NULL;
  if (hutch_policy_parse(p, "policy", &pol, err) < 0) return -1;
  cmd->op = GW_CTL_SET;
  cmd->addr = ip;
  cmd->policy = pol;
  return 0;
}

static char *answer(json_t *o) {
  char *s = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  if (!s) return xstrdup("{\"ok\":false,\"error\":\"internal: cannot encode the answer\"}\n");
  char *line = xasprintf("%s\n", s);
  free(s);
  return line;
}

static char *answer_error(const char *msg) {
  return answer(json_pack("{s:b,s:s}", "ok", 0, "error", msg));
}

char *gw_ctl_handle(struct gw_table *t, const char *line, size_t len, struct gw_ctl_effect *eff) {
  memset(eff, 0, sizeof *eff);
  hutch_err err = HUTCH_ERR_INIT;
  struct gw_ctl_cmd cmd;
  if (gw_ctl_parse(line, len, &cmd, &err) < 0) return answer_error(err.msg);
  if (cmd.op == GW_CTL_LIST) {
    json_t *arr = json_array();
    for (size_t i = 0; i < t->n; i++) {
      char a[HUTCH_IP_TEXT_MAX];
      hutch_ip_to_text(&t->v[i].addr, a);
      json_array_append_new(arr, json_pack("{s:s,s:s,s:o}", "sandbox", t->v[i].id, "addr", a, "policy",
                                           hutch_policy_to_json(t->v[i].policy)));
    }
    char *s = answer(json_pack("{s:b,s:o}", "ok", 1, "sandboxes", arr));
    if (strlen(s) > GW_CTL_LIST_MAX) {
      free(s);
      return answer_error("list: the answer would be too long");
    }
    return s;
  }
  if (cmd.op == GW_CTL_REMOVE) {
    struct hutch_ip gone;
    if (gw_table_remove(t, cmd.sandbox, &gone) == 1) {
      eff->addr_gone = true;
      eff->gone = gone;
      eff->changed = true;
    }
    gw_ctl_cmd_clear(&cmd);
    return answer(json_pack("{s:b}", "ok", 1));
  }
  const struct gw_sandbox *old = gw_table_find_id(t, cmd.sandbox);
  bool moved = old && !hutch_ip_equal(&old->addr, &cmd.addr);
  struct hutch_ip old_addr = old ? old->addr : cmd.addr;
  struct hutch_policy *pol = steal_pointer(&cmd.policy);
  if (gw_table_set(t, cmd.sandbox, &cmd.addr, pol, &err) < 0) {
    gw_ctl_cmd_clear(&cmd);
    return answer_error(err.msg);
  }
  if (moved) {
    eff->addr_gone = true;
    eff->gone = old_addr;
  }
  eff->changed = true;
  gw_ctl_cmd_clear(&cmd);
  return answer(json_pack("{s:b}", "ok", 1));
}
