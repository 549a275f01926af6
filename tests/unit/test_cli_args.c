/* Unit tests for the hutch CLI's argument parsing (src/hutch/args.c).
 * The CLI's sources are not in libhutch.a, so the file is included. */
#include "../../src/hutch/args.c"

#include <stdlib.h>

#include "tap.h"

#define ARGV(...) ((char *[]){__VA_ARGS__, NULL})
#define ARGC(...) ((int)(sizeof((char *[]){__VA_ARGS__}) / sizeof(char *)))
#define PARSE(fn, out, ...) fn(ARGC(__VA_ARGS__), ARGV(__VA_ARGS__), (out), &err)

/* Compact JSON of j; the returned string is freed at the next call. */
static const char *dump(json_t *j) {
  static char *last;
  free(last);
  last = json_dumps(j, JSON_COMPACT);
  return last ? last : "(null)";
}

static void test_argp(void) {
  static const hutch_opt opts[] = {{"name", 'n', true, 10},
                                   {"flag", 0, false, 11},
                                   {"help", 'h', false, 12},
                                   {NULL, 0, false, 0}};
  hutch_err err = HUTCH_ERR_INIT;
  hutch_argp p;
  char **av = ARGV("cmd", "a", "--name=x", "-n", "y", "--flag", "b", "-nz", "--", "--flag", "-h");
  hutch_argp_init(&p, 11, av, opts, -1);
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_POSITIONAL, "argp: positional first");
  is_str(p.arg, "a", "argp: positional value");
  is_int(hutch_argp_next(&p, &err), 10, "argp: --name=x");
  is_str(p.arg, "x", "argp: inline value");
  is_int(hutch_argp_next(&p, &err), 10, "argp: -n y");
  is_str(p.arg, "y", "argp: separate value");
  is_int(hutch_argp_next(&p, &err), 11, "argp: --flag");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_POSITIONAL, "argp: positional between options");
  is_int(hutch_argp_next(&p, &err), 10, "argp: -nz");
  is_str(p.arg, "z", "argp: short inline value");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_POSITIONAL, "argp: after -- options are words");
  is_str(p.arg, "--flag", "argp: --flag after --");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_POSITIONAL, "argp: -h after --");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_END, "argp: end");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_END, "argp: end is sticky");

  /* max_positional 1: the second word ends parsing. */
  av = ARGV("cmd", "--flag", "ID", "--flag", "ls", "--flag");
  hutch_argp_init(&p, 6, av, opts, 1);
  is_int(hutch_argp_next(&p, &err), 11, "argp1: flag");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_POSITIONAL, "argp1: ID");
  is_int(hutch_argp_next(&p, &err), 11, "argp1: option after ID");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_END, "argp1: stops at the command");
  is_int(p.i, 4, "argp1: rest starts at ls");

  hutch_argp_init(&p, 3, ARGV("cmd", "--bogus", "x"), opts, -1);
  is_int(hutch_argp_next(&p, &err), -1, "argp: unknown option");
  is_str(err.msg, "unknown option `--bogus`", "argp: unknown option message");
  hutch_argp_init(&p, 2, ARGV("cmd", "--name"), opts, -1);
  is_int(hutch_argp_next(&p, &err), -1, "argp: missing value");
  is_str(err.msg, "option `--name` needs a value", "argp: missing value message");
  hutch_argp_init(&p, 2, ARGV("cmd", "--flag=1"), opts, -1);
  is_int(hutch_argp_next(&p, &err), -1, "argp: value for a flag");
  hutch_argp_init(&p, 2, ARGV("cmd", "-hx"), opts, -1);
  is_int(hutch_argp_next(&p, &err), -1, "argp: -hx is not -h");
  hutch_argp_init(&p, 2, ARGV("cmd", "--fla"), opts, -1);
  is_int(hutch_argp_next(&p, &err), -1, "argp: no prefix matching");
  hutch_argp_init(&p, 2, ARGV("cmd", "-"), opts, -1);
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_POSITIONAL, "argp: lone - is a word");
}

static void test_values(void) {
  hutch_err err = HUTCH_ERR_INIT;
  json_t *o = json_object();
  ok(hutch_parse_kv("env", "A=1", o, &err) == 0, "kv: A=1");
  ok(hutch_parse_kv("env", "B=", o, &err) == 0, "kv: empty value");
  ok(hutch_parse_kv("env", "C=x=y", o, &err) == 0, "kv: value with =");
  is_str(dump(o), "{\"A\":\"1\",\"B\":\"\",\"C\":\"x=y\"}", "kv: object");
  ok(hutch_parse_kv("env", "=x", o, &err) < 0, "kv: empty key");
  is_str(err.msg, "--env `=x`: empty key", "kv: empty key message");
  ok(hutch_parse_kv("label", "x", o, &err) < 0, "kv: no =");
  ok(hutch_parse_kv("env", "K=\xff", o, &err) < 0, "kv: invalid UTF-8 value");
  ok(hutch_parse_kv("env", "\xc3=v", o, &err) < 0, "kv: invalid UTF-8 key");
  json_decref(o);

  double d = 0;
  ok(hutch_parse_number("cpus", "2", &d, &err) == 0 && d == 2, "number: 2");
  ok(hutch_parse_number("cpus", "0.5", &d, &err) == 0 && d == 0.5, "number: 0.5");
  ok(hutch_parse_number("cpus", ".25", &d, &err) == 0 && d == 0.25, "number: .25");
  const char *bad[] = {"",
                       "0",
                       "0.0",
                       "-1",
                       "1e3",
                       "inf",
                       "nan",
                       "0x10",
                       " 1",
                       "1.",
                       ".",
                       "1.2.3",
                       "99999999999999999999"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    ok(hutch_parse_number("cpus", bad[i], &d, &err) < 0, "number: `%s` rejected", bad[i]);

  long long v = 0;
  ok(hutch_parse_int("pids", "256", 1000, &v, &err) == 0 && v == 256, "int: 256");
  ok(hutch_parse_int("pids", "1001", 1000, &v, &err) < 0, "int: over max");
  ok(hutch_parse_int("pids", "-1", 1000, &v, &err) < 0, "int: negative");
  ok(hutch_parse_int("pids", "12a", 1000, &v, &err) < 0, "int: junk");

  char *e = hutch_url_escape("sb_x/../a b?c", NULL);
  is_str(e, "sb_x%2F..%2Fa%20b%3Fc", "escape: path segment");
  free(e);
  e = hutch_url_escape("k=v/w&x y", "=/");
  is_str(e, "k=v/w%26x%20y", "escape: query keeps = and /");
  free(e);
}

static void test_global(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_global_args g;
  ok(PARSE(hutch_parse_global_args, &g, "hutch", "--socket", "/s", "--json", "ls", "--json") == 0,
     "global: parse");
  is_str(g.socket, "/s", "global: socket");
  ok(g.json, "global: json");
  is_int(g.cmd_index, 4, "global: command index");
  ok(PARSE(hutch_parse_global_args, &g, "hutch", "--url=http://h:1", "--api-key", "k") == 0,
     "global: no command");
  is_int(g.cmd_index, 4, "global: cmd_index == argc without a command");
  is_str(g.api_key, "k", "global: api key");
  ok(PARSE(hutch_parse_global_args, &g, "hutch", "--socket", "/s", "--url", "http://x", "ls") < 0,
     "global: --socket with --url");
  ok(PARSE(hutch_parse_global_args, &g, "hutch", "--socket", "", "ls") < 0, "global: empty socket");
  ok(PARSE(hutch_parse_global_args, &g, "hutch", "--version") == 0 && g.version, "global: version");
  ok(PARSE(hutch_parse_global_args, &g, "hutch", "-h") == 0 && g.help, "global: -h");
}

static void test_create(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_create_args a;
  ok(PARSE(hutch_parse_create_args, &a, "create") == 0, "create: no options");
  is_str(dump(a.body), "{}", "create: empty body");
  ok(a.wait && !a.json, "create: waits by default");
  hutch_create_args_free(&a);

  ok(PARSE(hutch_parse_create_args, &a, "create", "--template", "py", "--runtime=native", "--cpus",
           "0.5", "--memory", "256", "--pids", "64", "--env", "A=1", "--label", "team=a", "--label",
           "x=", "--timeout", "900", "--no-wait", "--json") == 0,
     "create: all options");
  is_str(
      dump(a.body),
      "{\"template\":\"py\",\"runtime\":\"native\",\"resources\":{\"cpus\":0.5,\"memory_mib\":256,"
      "\"pids\":64},\"env\":{\"A\":\"1\"},\"labels\":{\"team\":\"a\",\"x\":\"\"},\"timeout_s\":"
      "900}",
      "create: body");
  ok(!a.wait && a.json, "create: --no-wait --json");
  hutch_create_args_free(&a);

  ok(PARSE(hutch_parse_create_args, &a, "create", "--cpus", "2") == 0, "create: --cpus 2");
  is_str(dump(a.body), "{\"resources\":{\"cpus\":2}}", "create: whole cpus is an integer");
  hutch_create_args_free(&a);

  const char *bad[][3] = {{"--cpus", "many", NULL},  {"--memory", "1G", NULL},
                          {"--template", "", NULL},  {"--label", "=a", NULL},
                          {"--env", "A", NULL},      {"stray", NULL, NULL},
                          {"--timeout", "-5", NULL}, {"--cwd", "/x", NULL}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char *av[] = {"create", (char *)bad[i][0], (char *)bad[i][1], NULL};
    ok(hutch_parse_create_args(bad[i][1] ? 3 : 2, av, &a, &err) < 0, "create: %s %s rejected",
       bad[i][0], bad[i][1] ? bad[i][1] : "");
    hutch_create_args_free(&a);
  }
}

static void test_exec(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_exec_args a;
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "sb_x", "--", "ls", "-l", "--json") == 0,
     "exec: ID -- argv");
  is_str(a.id, "sb_x", "exec: id");
  is_str(dump(a.body), "{\"argv\":[\"ls\",\"-l\",\"--json\"]}",
         "exec: argv keeps options after --");
  ok(!a.json, "exec: --json after -- belongs to the command");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "sb_x", "ls", "-l") == 0, "exec: without --");
  is_str(dump(a.body), "{\"argv\":[\"ls\",\"-l\"]}", "exec: argv without --");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--env", "K=V", "sb_x", "--cwd", "/root", "--timeout",
           "5", "--json", "--", "python3", "-c", "print(1)") == 0,
     "exec: options before and after ID");
  is_str(dump(a.body),
         "{\"env\":{\"K\":\"V\"},\"cwd\":\"/root\",\"timeout_s\":5,\"argv\":[\"python3\",\"-c\","
         "\"print(1)\"]}",
         "exec: body");
  ok(a.json, "exec: --json");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--sh", "sb_x", "echo $HOME | tr a-z A-Z") == 0,
     "exec: --sh");
  is_str(dump(a.body), "{\"cmd\":\"echo $HOME | tr a-z A-Z\"}", "exec: cmd");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--", "sb_x", "ls") == 0, "exec: -- before ID");
  is_str(a.id, "sb_x", "exec: id after --");
  is_str(dump(a.body), "{\"argv\":[\"ls\"]}", "exec: argv after -- ID");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--help", "--bogus") == 0 && a.help, "exec: --help");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "sb_x") < 0, "exec: no command");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "sb_x", "--") < 0, "exec: empty command");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--cwd", "/") < 0, "exec: no ID");
  is_str(err.msg, "missing sandbox ID", "exec: no ID message");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--sh", "sb_x", "echo", "hi") < 0,
     "exec: --sh needs one word");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "sb_x", "--", "cat", "\xff") < 0,
     "exec: non-UTF-8 argument");
  is_str(err.msg, "command argument 2: not valid UTF-8", "exec: non-UTF-8 message");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--label", "a=b", "sb_x", "ls") < 0,
     "exec: no --label");
  hutch_exec_args_free(&a);
}

static void test_run(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_run_args a;
  ok(PARSE(hutch_parse_run_args, &a, "run", "--template", "py", "--memory", "128", "--label", "a=b",
           "--env", "K=V", "--cwd", "/tmp", "--timeout", "30", "--", "make", "test") == 0,
     "run: parse");
  is_str(dump(a.create),
         "{\"template\":\"py\",\"resources\":{\"memory_mib\":128},\"labels\":{\"a\":\"b\"},"
         "\"timeout_s\":90}",
         "run: create body (sandbox outlives the command timeout)");
  is_str(dump(a.exec),
         "{\"env\":{\"K\":\"V\"},\"cwd\":\"/tmp\",\"timeout_s\":30,\"argv\":[\"make\",\"test\"]}",
         "run: exec body");
  hutch_run_args_free(&a);

  ok(PARSE(hutch_parse_run_args, &a, "run", "ls", "-l") == 0, "run: without --");
  is_str(dump(a.create), "{}", "run: default create");
  is_str(dump(a.exec), "{\"argv\":[\"ls\",\"-l\"]}", "run: argv");
  hutch_run_args_free(&a);

  ok(PARSE(hutch_parse_run_args, &a, "run", "--sh", "--json", "echo hi") == 0, "run: --sh");
  is_str(dump(a.exec), "{\"cmd\":\"echo hi\"}", "run: cmd");
  ok(a.json, "run: --json");
  hutch_run_args_free(&a);

  ok(PARSE(hutch_parse_run_args, &a, "run", "--no-wait", "--", "ls") < 0, "run: no --no-wait");
  hutch_run_args_free(&a);
  ok(PARSE(hutch_parse_run_args, &a, "run", "--cpus", "1") < 0, "run: no command");
  hutch_run_args_free(&a);
}

static void test_small_verbs(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_ls_args l;
  ok(PARSE(hutch_parse_ls_args, &l, "ls") == 0, "ls: no filter");
  is_str(l.query, "", "ls: empty query");
  hutch_ls_args_free(&l);
  ok(PARSE(hutch_parse_ls_args, &l, "ls", "--label", "team=a b", "--json", "--label", "k=v&x=1",
           "--state", "running") == 0,
     "ls: filters");
  is_str(l.query, "?label=team=a%20b&label=k=v%26x=1&state=running", "ls: query");
  ok(l.json, "ls: --json");
  hutch_ls_args_free(&l);
  ok(PARSE(hutch_parse_ls_args, &l, "ls", "--label", "nokey") < 0, "ls: label without =");
  hutch_ls_args_free(&l);
  ok(PARSE(hutch_parse_ls_args, &l, "ls", "sb_x") < 0, "ls: no positional");
  hutch_ls_args_free(&l);

  hutch_ids_args ids;
  ok(PARSE(hutch_parse_get_args, &ids, "get", "sb_x", "--json") == 0, "get: ID --json");
  ok(ids.nids == 1 && ids.json, "get: one id, json");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_get_args, &ids, "get", "a", "b") < 0, "get: two ids");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_get_args, &ids, "get") < 0, "get: no id");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_rm_args, &ids, "rm", "a", "--no-wait", "b", "c") == 0, "rm: ids");
  ok(ids.nids == 3 && !ids.wait, "rm: three ids, no wait");
  is_str(ids.ids[2], "c", "rm: third id");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_rm_args, &ids, "rm", "--no-wait") < 0, "rm: no id");
  hutch_ids_args_free(&ids);

  hutch_admin_args ad;
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "key", "create", "--name", "ci") == 0,
     "admin: create");
  ok(ad.action == HUTCH_KEY_CREATE, "admin: create action");
  is_str(ad.name, "ci", "admin: name");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "key", "ls", "--json") == 0 &&
         ad.action == HUTCH_KEY_LS && ad.json,
     "admin: ls");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "key", "rm", "key_x") == 0 &&
         ad.action == HUTCH_KEY_RM,
     "admin: rm");
  is_str(ad.id, "key_x", "admin: rm id");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "key", "rm") < 0, "admin: rm without id");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "key", "ls", "x") < 0, "admin: ls extra word");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "key", "rm", "a", "--name", "n") < 0,
     "admin: --name only for create");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "user", "ls") < 0, "admin: unknown object");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "key", "frob") < 0, "admin: unknown action");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin") < 0, "admin: nothing");
  ok(PARSE(hutch_parse_admin_args, &ad, "admin", "--help") == 0 && ad.help, "admin: --help");

  hutch_plain_args pl;
  ok(PARSE(hutch_parse_plain_args, &pl, "health", "--json") == 0 && pl.json, "health: --json");
  ok(PARSE(hutch_parse_plain_args, &pl, "health", "x") < 0, "health: no positional");
}

int main(void) {
  test_argp();
  test_values();
  test_global();
  test_create();
  test_exec();
  test_run();
  test_small_verbs();
  dump(NULL);
  return done_testing();
}
