/* Unit tests for the hutch CLI's argument parsing (src/hutch/args.c) and
 * its pure stream helpers (src/hutch/wire.c).  The CLI's sources are not in
 * libhutch.a, so the files are included. */
#include "../../src/hutch/args.c"
#include "../../src/hutch/wire.c"

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
  is_int(hutch_argp_next(&p, &err), 12, "argp: -hx starts with -h");
  is_int(hutch_argp_next(&p, &err), -1, "argp: then -x is unknown");
  is_str(err.msg, "unknown option `-x`", "argp: -x message");
  hutch_argp_init(&p, 2, ARGV("cmd", "--fla"), opts, -1);
  is_int(hutch_argp_next(&p, &err), -1, "argp: no prefix matching");
  hutch_argp_init(&p, 2, ARGV("cmd", "-"), opts, -1);
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_POSITIONAL, "argp: lone - is a word");

  /* Short-option clusters: flags group, a value takes the rest. */
  static const hutch_opt sopts[] = {{"interactive", 'i', false, 20},
                                    {"tty", 't', false, 21},
                                    {"signal", 's', true, 22},
                                    {NULL, 0, false, 0}};
  hutch_argp_init(&p, 5, ARGV("cmd", "-it", "-tsKILL", "-s", "9"), sopts, -1);
  is_int(hutch_argp_next(&p, &err), 20, "cluster: -i of -it");
  is_int(hutch_argp_next(&p, &err), 21, "cluster: -t of -it");
  is_int(hutch_argp_next(&p, &err), 21, "cluster: -t of -tsKILL");
  is_int(hutch_argp_next(&p, &err), 22, "cluster: -s of -tsKILL");
  is_str(p.arg, "KILL", "cluster: value is the rest of the word");
  is_int(hutch_argp_next(&p, &err), 22, "cluster: -s 9");
  is_str(p.arg, "9", "cluster: value is the next word");
  is_int(hutch_argp_next(&p, &err), HUTCH_ARG_END, "cluster: end");
  hutch_argp_init(&p, 2, ARGV("cmd", "-ti-"), sopts, -1);
  is_int(hutch_argp_next(&p, &err), 21, "cluster: -t");
  is_int(hutch_argp_next(&p, &err), 20, "cluster: -i");
  is_int(hutch_argp_next(&p, &err), -1, "cluster: - inside is unknown");
  hutch_argp_init(&p, 2, ARGV("cmd", "-is"), sopts, -1);
  is_int(hutch_argp_next(&p, &err), 20, "cluster: -i before a bare -s");
  is_int(hutch_argp_next(&p, &err), -1, "cluster: -s at the end needs a value");
  is_str(err.msg, "option `-s` needs a value", "cluster: missing value message");
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

  ok(PARSE(hutch_parse_create_args, &a, "create", "--timeout", "60", "--on-timeout",
           "suspend") == 0,
     "create: --on-timeout suspend");
  is_str(dump(a.body), "{\"timeout_s\":60,\"on_timeout\":\"suspend\"}",
         "create: on_timeout in body");
  hutch_create_args_free(&a);
  ok(PARSE(hutch_parse_create_args, &a, "create", "--on-timeout=delete") == 0,
     "create: --on-timeout=delete");
  is_str(dump(a.body), "{\"on_timeout\":\"delete\"}", "create: on_timeout delete");
  hutch_create_args_free(&a);
  ok(PARSE(hutch_parse_create_args, &a, "create", "--on-timeout", "stop") < 0,
     "create: --on-timeout stop rejected");
  is_str(err.msg, "--on-timeout `stop`: expected delete or suspend", "create: on-timeout message");
  hutch_create_args_free(&a);
  ok(PARSE(hutch_parse_create_args, &a, "create", "--on-timeout") < 0,
     "create: --on-timeout needs a value");
  hutch_create_args_free(&a);

  ok(PARSE(hutch_parse_create_args, &a, "create", "--from-snapshot", "snap_a", "--snapshot-every",
           "600") == 0,
     "create: --from-snapshot --snapshot-every");
  is_str(dump(a.body), "{\"from_snapshot\":\"snap_a\",\"snapshots\":{\"interval_s\":600}}",
         "create: from_snapshot and the snapshot policy in body");
  hutch_create_args_free(&a);
  ok(PARSE(hutch_parse_create_args, &a, "create", "--snapshot-every=0") == 0,
     "create: --snapshot-every 0 (off)");
  is_str(dump(a.body), "{\"snapshots\":{\"interval_s\":0}}", "create: interval 0");
  hutch_create_args_free(&a);

  ok(PARSE(hutch_parse_create_args, &a, "create", "--cpus", "2") == 0, "create: --cpus 2");
  is_str(dump(a.body), "{\"resources\":{\"cpus\":2}}", "create: whole cpus is an integer");
  hutch_create_args_free(&a);

  const char *bad[][3] = {{"--cpus", "many", NULL},  {"--memory", "1G", NULL},
                          {"--template", "", NULL},  {"--label", "=a", NULL},
                          {"--env", "A", NULL},      {"stray", NULL, NULL},
                          {"--timeout", "-5", NULL}, {"--cwd", "/x", NULL},
                          {"--on-timeout", "", NULL}, {"--on-timeout", "Suspend", NULL},
                          {"--from-snapshot", "", NULL}, {"--from-snapshot", NULL, NULL},
                          {"--snapshot-every", "1h", NULL}, {"--snapshot-every", "-1", NULL},
                          {"--snapshot", "snap_a", NULL}};
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

  /* Streaming options. */
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "sb_x", "cat") == 0, "exec: plain");
  ok(!a.interactive && !a.tty && !a.detach, "exec: no -i/-t/-d by default");
  is_str(dump(a.body), "{\"argv\":[\"cat\"]}", "exec: no stdin field without -i");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "-it", "sb_x", "--", "bash") == 0, "exec: -it");
  ok(a.interactive && a.tty && !a.detach, "exec: -it sets both");
  is_str(dump(a.body), "{\"argv\":[\"bash\"],\"stdin\":true}", "exec: -i asks for stdin");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "sb_x", "-i", "--tty", "--", "cat", "-i") == 0,
     "exec: options after the ID");
  ok(a.interactive && a.tty, "exec: -i --tty after the ID");
  is_str(dump(a.body), "{\"argv\":[\"cat\",\"-i\"],\"stdin\":true}",
         "exec: -i after -- belongs to the command");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "-d", "--tag", "server", "-u", "user", "sb_x",
           "python3", "-m", "http.server") == 0,
     "exec: -d --tag -u");
  ok(a.detach && !a.interactive, "exec: -d");
  is_str(dump(a.body),
         "{\"tag\":\"server\",\"user\":\"user\",\"argv\":[\"python3\",\"-m\","
         "\"http.server\"]}",
         "exec: tag and user");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--user", "1000:100", "sb_x", "id") == 0,
     "exec: --user UID:GID");
  is_str(dump(a.body), "{\"uid\":1000,\"gid\":100,\"argv\":[\"id\"]}", "exec: uid and gid");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "-u0", "sb_x", "id") == 0, "exec: -u0");
  is_str(dump(a.body), "{\"uid\":0,\"argv\":[\"id\"]}", "exec: uid only");
  hutch_exec_args_free(&a);
  char *bad_users[] = {"70000", "1:x", "1:", "", "5:99999"};
  for (size_t i = 0; i < sizeof bad_users / sizeof *bad_users; i++) {
    ok(PARSE(hutch_parse_exec_args, &a, "exec", "--user", bad_users[i], "sb_x", "id") < 0,
       "exec: --user `%s` rejected", bad_users[i]);
    hutch_exec_args_free(&a);
  }
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "--tag", "", "sb_x", "id") < 0, "exec: empty tag");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "-x", "sb_x", "id") < 0, "exec: unknown -x");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_exec_args, &a, "exec", "-itd", "--sh", "sb_x", "sleep 9 &") == 0,
     "exec: -itd --sh");
  ok(a.interactive && a.tty && a.detach, "exec: -itd");
  is_str(dump(a.body), "{\"cmd\":\"sleep 9 &\",\"stdin\":true}", "exec: -itd body");
  hutch_exec_args_free(&a);
}

static void test_shell(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_exec_args a;
  ok(PARSE(hutch_parse_shell_args, &a, "shell", "sb_x") == 0, "shell: ID");
  is_str(a.id, "sb_x", "shell: id");
  ok(a.interactive && a.tty && !a.detach, "shell: is exec -it");
  is_str(dump(a.body), "{\"argv\":[\"/bin/bash\",\"-l\"],\"stdin\":true}",
         "shell: bash -l by default");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_shell_args, &a, "shell", "--env", "TERM=dumb", "sb_x", "--", "sh", "-i") ==
         0,
     "shell: -- CMD");
  is_str(dump(a.body), "{\"env\":{\"TERM\":\"dumb\"},\"argv\":[\"sh\",\"-i\"],\"stdin\":true}",
         "shell: own command");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_shell_args, &a, "shell", "sb_x", "--") == 0, "shell: ID --");
  is_str(dump(a.body), "{\"argv\":[\"/bin/bash\",\"-l\"],\"stdin\":true}",
         "shell: nothing after -- is the default");
  hutch_exec_args_free(&a);

  ok(PARSE(hutch_parse_shell_args, &a, "shell") < 0, "shell: no ID");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_shell_args, &a, "shell", "-d", "sb_x") < 0, "shell: no -d");
  hutch_exec_args_free(&a);
  ok(PARSE(hutch_parse_shell_args, &a, "shell", "--help") == 0 && a.help, "shell: --help");
  hutch_exec_args_free(&a);
}

static void test_command_verbs(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_cmd_args c;
  ok(PARSE(hutch_parse_attach_args, &c, "attach", "sb_x", "cmd_y") == 0, "attach: ID CMD_ID");
  is_str(c.id, "sb_x", "attach: id");
  is_str(c.cmd_id, "cmd_y", "attach: cmd id");
  ok(c.replay && !c.json, "attach: replay by default");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_attach_args, &c, "attach", "--no-replay", "sb_x", "--json", "cmd_y") == 0,
     "attach: --no-replay --json");
  ok(!c.replay && c.json, "attach: flags");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_attach_args, &c, "attach", "sb_x") < 0, "attach: no command id");
  is_str(err.msg, "missing command ID", "attach: message");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_attach_args, &c, "attach", "a", "b", "c") < 0, "attach: extra word");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_attach_args, &c, "attach", "", "b") < 0, "attach: empty id");
  hutch_cmd_args_free(&c);

  ok(PARSE(hutch_parse_kill_args, &c, "kill", "sb_x", "cmd_y") == 0, "kill: default signal");
  is_str(dump(c.body), "{\"signal\":\"TERM\"}", "kill: TERM");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_kill_args, &c, "kill", "-s", "KILL", "sb_x", "cmd_y") == 0, "kill: -s KILL");
  is_str(dump(c.body), "{\"signal\":\"KILL\"}", "kill: name");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_kill_args, &c, "kill", "sb_x", "cmd_y", "--signal=9") == 0,
     "kill: --signal=9");
  is_str(dump(c.body), "{\"signal\":9}", "kill: a number is an integer");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_kill_args, &c, "kill", "-s", "", "sb_x", "cmd_y") < 0, "kill: empty signal");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_kill_args, &c, "kill", "-s", "9x", "sb_x", "cmd_y") < 0, "kill: 9x");
  hutch_cmd_args_free(&c);
  ok(PARSE(hutch_parse_kill_args, &c, "kill", "sb_x") < 0, "kill: no command id");
  hutch_cmd_args_free(&c);

  hutch_ids_args ids;
  ok(hutch_parse_one_id_args("ps", 3, ARGV("ps", "sb_x", "--json"), &ids, &err) == 0,
     "ps: ID --json");
  ok(ids.nids == 1 && ids.json, "ps: parsed");
  hutch_ids_args_free(&ids);
  ok(hutch_parse_one_id_args("metrics", 3, ARGV("metrics", "a", "b"), &ids, &err) < 0,
     "metrics: two ids");
  is_str(err.msg, "unexpected argument `b` (metrics takes one ID)", "metrics: message");
  hutch_ids_args_free(&ids);

  hutch_timeout_args t;
  ok(PARSE(hutch_parse_timeout_args, &t, "timeout", "sb_x", "600") == 0, "timeout: ID SECONDS");
  is_str(t.id, "sb_x", "timeout: id");
  is_str(dump(t.body), "{\"timeout_s\":600}", "timeout: body");
  hutch_timeout_args_free(&t);
  ok(PARSE(hutch_parse_timeout_args, &t, "timeout", "sb_x", "10m") < 0, "timeout: 10m");
  hutch_timeout_args_free(&t);
  ok(PARSE(hutch_parse_timeout_args, &t, "timeout", "sb_x") < 0, "timeout: no seconds");
  is_str(err.msg, "missing SECONDS", "timeout: message");
  hutch_timeout_args_free(&t);
}

static void test_cp(void) {
  hutch_err err = HUTCH_ERR_INIT;
  char *id = NULL;
  const char *path = NULL;
  ok(hutch_cp_split("sb_x:/root/a", &id, &path), "split: ID:PATH");
  is_str(id, "sb_x", "split: id");
  is_str(path, "/root/a", "split: path");
  free(id);
  ok(hutch_cp_split("sb_x:rel:x", &id, &path) && strcmp(path, "rel:x") == 0,
     "split: first colon");
  free(id);
  ok(!hutch_cp_split("./a:b", &id, &path), "split: ./a:b is local");
  ok(!hutch_cp_split("/tmp/a:b", &id, &path), "split: absolute is local");
  ok(!hutch_cp_split("dir/a:b", &id, &path), "split: slash before colon is local");
  ok(!hutch_cp_split(":x", &id, &path), "split: empty id is local");
  ok(!hutch_cp_split("plain", &id, &path), "split: no colon");
  ok(!hutch_cp_split("-", &id, &path), "split: -");

  hutch_cp_args a;
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "./f", "sb_x:/root/") == 0, "cp: upload");
  ok(a.upload, "cp: direction up");
  is_str(a.id, "sb_x", "cp: id");
  is_str(a.remote, "/root/", "cp: remote");
  is_str(a.local, "./f", "cp: local");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "sb_x:/etc/hosts", "-") == 0, "cp: download to -");
  ok(!a.upload, "cp: direction down");
  is_str(a.local, "-", "cp: - is local");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "--", "-f", "sb_x:x") == 0, "cp: -- before -f");
  is_str(a.local, "-f", "cp: local -f");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "a", "b") < 0, "cp: two local paths");
  is_str(err.msg, "one of SRC and DST must be SANDBOX_ID:PATH", "cp: local-local message");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "sb_a:x", "sb_b:y") < 0, "cp: two sandboxes");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "sb_a:", "y") < 0, "cp: empty remote path");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "x") < 0, "cp: one word");
  is_str(err.msg, "missing destination", "cp: one word message");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "x", "sb:y", "z") < 0, "cp: three words");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "-r", "x", "sb:y") < 0, "cp: unknown option");
  hutch_cp_args_free(&a);
  ok(PARSE(hutch_parse_cp_args, &a, "cp", "-h") == 0 && a.help, "cp: -h");
  hutch_cp_args_free(&a);
}

static int collect_line(void *ctx, const char *line, size_t len, hutch_err *err) {
  char **acc = ctx;
  char *old = *acc;
  *acc = xasprintf("%s[%.*s]", old, (int)len, line);
  free(old);
  if (len == 4 && memcmp(line, "fail", 4) == 0) return hutch_err_invalid(err, "fail");
  return 0;
}

static void test_wire(void) {
  unsigned char out[64];
  long n = hutch_b64_decode("aGVsbG8K", 8, out);
  ok(n == 6 && memcmp(out, "hello\n", 6) == 0, "b64: hello");
  n = hutch_b64_decode("YQ==", 4, out);
  ok(n == 1 && out[0] == 'a', "b64: one byte, padded");
  n = hutch_b64_decode("YWI", 3, out);
  ok(n == 2 && memcmp(out, "ab", 2) == 0, "b64: unpadded");
  n = hutch_b64_decode("", 0, out);
  ok(n == 0, "b64: empty");
  n = hutch_b64_decode("AP8A/w==", 8, out);
  ok(n == 4 && out[0] == 0 && out[1] == 0xff && out[2] == 0 && out[3] == 0xff,
     "b64: binary with NUL and 0xff");
  n = hutch_b64_decode("+/+/", 4, out);
  ok(n == 3 && out[0] == 0xfb && out[1] == 0xff && out[2] == 0xbf, "b64: + and /");
  const char *bad[] = {"a", "ab=c", "a===", "YQ=", "Y Q==", "YQ==YQ==", "-_-_", "YQ=*"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    ok(hutch_b64_decode(bad[i], strlen(bad[i]), out) < 0, "b64: `%s` rejected", bad[i]);
  ok(hutch_b64_max_decoded(8) >= 6 && hutch_b64_max_decoded(3) >= 2, "b64: bound");

  hutch_err err = HUTCH_ERR_INIT;
  hutch_lines l;
  char *acc = xstrdup("");
  hutch_lines_init(&l, 8);
  ok(hutch_lines_feed(&l, "ab\ncd", 5, collect_line, &acc, &err) == 0, "lines: feed 1");
  is_str(acc, "[ab]", "lines: complete line out, partial held");
  is_int(hutch_lines_pending(&l), 2, "lines: 2 bytes pending");
  ok(hutch_lines_feed(&l, "e\n\nxy\n", 6, collect_line, &acc, &err) == 0, "lines: feed 2");
  is_str(acc, "[ab][cde][][xy]", "lines: joined across chunks, empty line kept");
  is_int(hutch_lines_pending(&l), 0, "lines: nothing pending");
  ok(hutch_lines_feed(&l, "12345678", 8, collect_line, &acc, &err) == 0, "lines: max-long partial");
  ok(hutch_lines_feed(&l, "9", 1, collect_line, &acc, &err) < 0, "lines: longer than max");
  ok(strstr(err.msg, "longer than 8 bytes") != NULL, "lines: message");
  hutch_lines_free(&l);

  hutch_lines_init(&l, 4);
  ok(hutch_lines_feed(&l, "123456789\n", 10, collect_line, &acc, &err) < 0,
     "lines: a long line inside one chunk is refused too");
  hutch_lines_free(&l);
  hutch_lines_init(&l, 16);
  free(acc);
  acc = xstrdup("");
  ok(hutch_lines_feed(&l, "a\nfail\nb\n", 9, collect_line, &acc, &err) < 0,
     "lines: callback failure stops");
  is_str(acc, "[a][fail]", "lines: nothing after the failure");
  hutch_lines_free(&l);
  free(acc);

  struct {
    const char *json;
    int status;
  } st[] = {
      {"{\"exit_code\":0,\"signal\":null,\"timed_out\":false}", 0},
      {"{\"exit_code\":3}", 3},
      {"{\"exit_code\":null,\"signal\":9}", 137},
      {"{\"exit_code\":null,\"signal\":9,\"timed_out\":true}", 124},
      {"{\"exit_code\":2,\"timed_out\":true}", 2},
      {"{\"exit_code\":null,\"signal\":null}", 1},
      {"{\"exit_code\":300}", 1},
      {"{}", 1},
  };
  for (size_t i = 0; i < sizeof st / sizeof *st; i++) {
    json_t *j = json_loads(st[i].json, 0, NULL);
    is_int(hutch_command_status(j), st[i].status, "status: %s", st[i].json);
    json_decref(j);
  }

  json_t *argv = json_pack("[s,s,s,s]", "sh", "-c", "echo 'hi' $X", "a\x1b[2Jb");
  char *d = hutch_argv_display(argv);
  is_str(d, "sh -c 'echo '\\''hi'\\'' $X' 'a?[2Jb'", "argv display: quoted, controls replaced");
  free(d);
  json_decref(argv);
  d = hutch_argv_display(NULL);
  is_str(d, "-", "argv display: missing");
  free(d);

  char *p = hutch_path_join("/root/", "a");
  is_str(p, "/root/a", "join: trailing slash");
  free(p);
  p = hutch_path_join("/", "a");
  is_str(p, "/a", "join: root");
  free(p);
  p = hutch_path_join("dir", "a");
  is_str(p, "dir/a", "join: relative");
  free(p);
  p = hutch_path_base("/a/b//");
  is_str(p, "b", "base: trailing slashes");
  free(p);
  p = hutch_path_base("/");
  is_str(p, "", "base: root");
  free(p);
  p = hutch_path_base("file");
  is_str(p, "file", "base: no slash");
  free(p);
  struct {
    const char *json;
    const char *shown;
  } sizes[] = {
      {"0", "0 B"},           {"1023", "1023 B"},         {"1024", "1.0 KiB"},
      {"1536", "1.5 KiB"},    {"311296", "304.0 KiB"},    {"1048575", "1.0 MiB"},
      {"67286073344", "62.7 GiB"}, {"-1", "-"},          {"null", "-"},
      {"\"12\"", "-"},        {"1.5", "-"},
  };
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    json_t *j = json_loads(sizes[i].json, JSON_DECODE_ANY, NULL);
    char *sz = hutch_size_display(j);
    is_str(sz, sizes[i].shown, "size: %s", sizes[i].json);
    free(sz);
    json_decref(j);
  }
  p = hutch_size_display(NULL);
  is_str(p, "-", "size: missing");
  free(p);

  ok(hutch_path_is_contents("dir/.") && hutch_path_is_contents(".") &&
         !hutch_path_is_contents("dir/.x") && !hutch_path_is_contents("a."),
     "contents: dir/. and .");
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

static void test_lifecycle(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_ids_args ids;
  static const char *const verbs[] = {"pause",   "resume",  "stop", "start",
                                      "suspend", "restore", "wake"};
  for (size_t i = 0; i < sizeof verbs / sizeof *verbs; i++) {
    ok(hutch_is_lifecycle_verb(verbs[i]), "lifecycle: %s is a verb", verbs[i]);
    is_str(hutch_lifecycle_verbs[i], verbs[i], "lifecycle: verb %zu is %s", i, verbs[i]);
    char *av[] = {(char *)verbs[i], "sb_a", NULL};
    ok(hutch_parse_lifecycle_args(2, av, &ids, &err) == 0, "lifecycle: %s ID", verbs[i]);
    ok(ids.nids == 1 && ids.wait && !ids.json && !ids.help, "lifecycle: %s waits by default",
       verbs[i]);
    is_str(ids.ids[0], "sb_a", "lifecycle: %s id", verbs[i]);
    hutch_ids_args_free(&ids);
  }
  ok(hutch_lifecycle_verbs[7] == NULL, "lifecycle: seven verbs");
  ok(!hutch_is_lifecycle_verb("rm") && !hutch_is_lifecycle_verb("Pause") &&
         !hutch_is_lifecycle_verb(""),
     "lifecycle: other words are not verbs");

  ok(PARSE(hutch_parse_lifecycle_args, &ids, "pause", "a", "--no-wait", "b", "--json", "c") == 0,
     "lifecycle: ids and options mixed");
  ok(ids.nids == 3 && !ids.wait && ids.json, "lifecycle: three ids, --no-wait, --json");
  is_str(ids.ids[0], "a", "lifecycle: first id");
  is_str(ids.ids[2], "c", "lifecycle: third id");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "stop", "--", "--odd") == 0 && ids.nids == 1,
     "lifecycle: -- then an id that looks like an option");
  is_str(ids.ids[0], "--odd", "lifecycle: id after --");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "wake", "--help") == 0 && ids.help,
     "lifecycle: --help without an id");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "wake", "-h", "x") == 0 && ids.help,
     "lifecycle: -h");
  hutch_ids_args_free(&ids);

  ok(PARSE(hutch_parse_lifecycle_args, &ids, "pause") < 0, "lifecycle: no id");
  is_str(err.msg, "missing sandbox ID", "lifecycle: no id message");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "pause", "--no-wait", "--json") < 0,
     "lifecycle: options but no id");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "resume", "") < 0, "lifecycle: empty id");
  is_str(err.msg, "empty sandbox ID", "lifecycle: empty id message");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "stop", "a", "--force") < 0,
     "lifecycle: unknown option");
  is_str(err.msg, "unknown option `--force`", "lifecycle: unknown option message");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "start", "a", "--no-wait=1") < 0,
     "lifecycle: --no-wait takes no value");
  hutch_ids_args_free(&ids);
  ok(PARSE(hutch_parse_lifecycle_args, &ids, "suspend", "a", "--timeout", "5") < 0,
     "lifecycle: no create options");
  hutch_ids_args_free(&ids);
}

static void test_template(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_template_args t;
  ok(PARSE(hutch_parse_template_args, &t, "template", "list") == 0, "template: list");
  ok(t.action == HUTCH_TPL_LIST && !t.name && !t.body && !t.json, "template: list parsed");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "ls", "--json") == 0 &&
         t.action == HUTCH_TPL_LIST && t.json,
     "template: ls --json");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "get", "py") == 0 &&
         t.action == HUTCH_TPL_GET,
     "template: get NAME");
  is_str(t.name, "py", "template: get name");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "rm", "py") == 0 &&
         t.action == HUTCH_TPL_DELETE,
     "template: rm is delete");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "delete", "--", "-odd") == 0,
     "template: delete -- NAME");
  is_str(t.name, "-odd", "template: name after --");
  hutch_template_args_free(&t);

  ok(PARSE(hutch_parse_template_args, &t, "template", "create", "t1", "--source", "host") == 0,
     "template: create --source host");
  ok(t.action == HUTCH_TPL_CREATE && t.wait, "template: create waits by default");
  is_str(dump(t.body), "{\"name\":\"t1\",\"source\":\"host\"}", "template: host body");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "create", "--source=debian", "deb",
           "--suite", "trixie", "--package", "python3", "--mirror", "http://m/debian",
           "--package", "git", "--no-wait") == 0,
     "template: create debian");
  is_str(dump(t.body),
         "{\"name\":\"deb\",\"source\":\"debian\",\"suite\":\"trixie\",\"mirror\":"
         "\"http://m/debian\",\"packages\":[\"python3\",\"git\"]}",
         "template: debian body");
  ok(!t.wait, "template: --no-wait");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "create", "t1", "--from-snapshot",
           "snap_a") == 0,
     "template: --from-snapshot implies --source snapshot");
  is_str(dump(t.body), "{\"name\":\"t1\",\"source\":\"snapshot\",\"snapshot\":\"snap_a\"}",
         "template: snapshot body");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "create", "t1", "--source", "snapshot",
           "--from-snapshot", "snap_a") == 0,
     "template: --source snapshot --from-snapshot");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "create", "img", "--oci", "img.tar",
           "--image", "alpine:3") == 0,
     "template: --oci implies --source oci");
  is_str(dump(t.body),
         "{\"name\":\"img\",\"source\":\"oci\",\"path\":\"img.tar\",\"image\":\"alpine:3\"}",
         "template: oci body (the command makes the path absolute)");
  hutch_template_args_free(&t);
  ok(PARSE(hutch_parse_template_args, &t, "template", "--help", "frob") == 0 && t.help,
     "template: --help");
  hutch_template_args_free(&t);

  struct {
    const char *argv[8];
    const char *msg;
  } bad[] = {
      {{"template"}, "missing template command (list, get, delete or create)"},
      {{"template", "frob"}, "unknown template command `frob` (list, get, delete or create)"},
      {{"template", "get"}, "missing template NAME"},
      {{"template", "get", ""}, "empty template NAME"},
      {{"template", "get", "a", "b"}, "unexpected argument `b`"},
      {{"template", "list", "x"}, "unexpected argument `x`"},
      {{"template", "create", "t"}, "missing --source (host, busybox, debian, oci or snapshot)"},
      {{"template", "create", "t", "--source", "docker"},
       "--source `docker`: expected host, busybox, debian, oci or snapshot"},
      {{"template", "create", "t", "--source", "debian", "--from-snapshot", "s"},
       "--from-snapshot implies --source snapshot, not `debian`"},
      {{"template", "create", "t", "--source", "host", "--oci", "/x"},
       "--oci implies --source oci, not `host`"},
      {{"template", "create", "t", "--oci", "/x", "--from-snapshot", "s"},
       "--from-snapshot and --oci exclude each other"},
      {{"template", "create", "t", "--source", "snapshot"},
       "--source snapshot needs --from-snapshot SNAP"},
      {{"template", "create", "t", "--source", "oci"}, "--source oci needs --oci PATH"},
      {{"template", "create", "t", "--source", "busybox", "--package", "git"},
       "--package applies only to `--source debian`"},
      {{"template", "create", "t", "--oci", "/x", "--suite", "bookworm"},
       "--suite applies only to `--source debian`"},
      {{"template", "create", "t", "--source", "debian", "--image", "x"},
       "--image applies only to `--source oci`"},
      {{"template", "create", "t", "--source", "debian", "--package", ""},
       "--package: must not be empty"},
      {{"template", "create", "t", "--from-snapshot"}, "option `--from-snapshot` needs a value"},
      {{"template", "get", "t", "--source", "host"}, "--source applies only to `template create`"},
      {{"template", "list", "--no-wait"}, "--no-wait applies only to `template create`"},
      {{"template", "create", "t", "--source", "host", "--bogus"}, "unknown option `--bogus`"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int n = 0;
    while (bad[i].argv[n]) n++;
    ok(hutch_parse_template_args(n, (char **)bad[i].argv, &t, &err) < 0, "template: bad %zu rejected",
       i);
    is_str(err.msg, bad[i].msg, "template: bad %zu message", i);
    hutch_template_args_free(&t);
  }
}

static void test_snapshot(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_snapshot_args s;
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "create", "sb_x") == 0, "snapshot: create ID");
  ok(s.action == HUTCH_SNAP_CREATE && s.nids == 1, "snapshot: create parsed");
  is_str(s.ids[0], "sb_x", "snapshot: create id");
  is_str(dump(s.body), "{}", "snapshot: create body without labels");
  hutch_snapshot_args_free(&s);
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "--label", "a=1", "create", "sb_x", "--label",
           "b=", "--json") == 0,
     "snapshot: create --label");
  is_str(dump(s.body), "{\"labels\":{\"a\":\"1\",\"b\":\"\"}}", "snapshot: labels");
  ok(s.json, "snapshot: --json");
  hutch_snapshot_args_free(&s);

  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "list") == 0 &&
         s.action == HUTCH_SNAP_LIST && s.nids == 0,
     "snapshot: list");
  is_str(s.query, "", "snapshot: list query empty");
  hutch_snapshot_args_free(&s);
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "ls", "sb_x", "--kind", "auto") == 0 &&
         s.nids == 1,
     "snapshot: ls ID --kind");
  is_str(s.query, "?kind=auto", "snapshot: kind query");
  hutch_snapshot_args_free(&s);

  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "get", "snap_a") == 0 &&
         s.action == HUTCH_SNAP_GET,
     "snapshot: get");
  hutch_snapshot_args_free(&s);
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "delete", "snap_a", "snap_b") == 0 &&
         s.action == HUTCH_SNAP_DELETE && s.nids == 2,
     "snapshot: delete two");
  is_str(s.ids[1], "snap_b", "snapshot: second to delete");
  hutch_snapshot_args_free(&s);

  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "export", "snap_a") == 0 &&
         s.action == HUTCH_SNAP_EXPORT && !s.output,
     "snapshot: export to stdout");
  is_str(s.query, "", "snapshot: full export");
  hutch_snapshot_args_free(&s);
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "export", "snap_b", "-o", "b.snap",
           "--parent", "snap_a") == 0,
     "snapshot: export -o --parent");
  is_str(s.output, "b.snap", "snapshot: output");
  is_str(s.query, "?parent=snap_a", "snapshot: parent query");
  hutch_snapshot_args_free(&s);
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "export", "--incremental", "snap_b",
           "--output=x") == 0,
     "snapshot: export --incremental --output=");
  is_str(s.query, "?incremental=true", "snapshot: incremental query");
  is_str(s.output, "x", "snapshot: --output=");
  hutch_snapshot_args_free(&s);
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "import", "-") == 0 &&
         s.action == HUTCH_SNAP_IMPORT,
     "snapshot: import -");
  is_str(s.ids[0], "-", "snapshot: import from stdin");
  hutch_snapshot_args_free(&s);
  ok(PARSE(hutch_parse_snapshot_args, &s, "snapshot", "-h") == 0 && s.help, "snapshot: -h");
  hutch_snapshot_args_free(&s);

  struct {
    const char *argv[8];
    const char *msg;
  } bad[] = {
      {{"snapshot"}, "missing snapshot command (create, list, get, delete, export or import)"},
      {{"snapshot", "take", "sb_x"},
       "unknown snapshot command `take` (create, list, get, delete, export or import)"},
      {{"snapshot", "create"}, "missing sandbox ID"},
      {{"snapshot", "create", ""}, "empty argument"},
      {{"snapshot", "create", "a", "b"}, "unexpected argument `b`"},
      {{"snapshot", "list", "a", "b"}, "unexpected argument `b`"},
      {{"snapshot", "get"}, "missing snapshot ID"},
      {{"snapshot", "delete"}, "missing snapshot ID"},
      {{"snapshot", "export"}, "missing snapshot ID"},
      {{"snapshot", "import"}, "missing FILE"},
      {{"snapshot", "import", "a", "b"}, "unexpected argument `b`"},
      {{"snapshot", "create", "sb_x", "--label", "nokey"}, "--label `nokey`: expected KEY=VALUE"},
      {{"snapshot", "get", "s", "--label", "a=b"}, "--label applies only to `snapshot create`"},
      {{"snapshot", "list", "--kind", "weekly"},
       "--kind `weekly`: expected manual, auto, fork, full or imported"},
      {{"snapshot", "get", "s", "--kind", "auto"}, "--kind applies only to `snapshot list`"},
      {{"snapshot", "import", "f", "-o", "x"}, "--output applies only to `snapshot export`"},
      {{"snapshot", "get", "s", "--parent", "p"}, "--parent applies only to `snapshot export`"},
      {{"snapshot", "list", "--incremental"}, "--incremental applies only to `snapshot export`"},
      {{"snapshot", "export", "s", "--parent", "p", "--incremental"},
       "--parent and --incremental exclude each other"},
      {{"snapshot", "export", "s", "--json"},
       "--json does not apply to `snapshot export` (it writes the stream)"},
      {{"snapshot", "export", "s", "-o"}, "option `-o` needs a value"},
      {{"snapshot", "export", "s", "-o", ""}, "--output: must not be empty"},
      {{"snapshot", "delete", "s", "--force"}, "unknown option `--force`"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int n = 0;
    while (bad[i].argv[n]) n++;
    ok(hutch_parse_snapshot_args(n, (char **)bad[i].argv, &s, &err) < 0, "snapshot: bad %zu rejected",
       i);
    is_str(err.msg, bad[i].msg, "snapshot: bad %zu message", i);
    hutch_snapshot_args_free(&s);
  }
}

static void test_rollback_fork(void) {
  hutch_err err = HUTCH_ERR_INIT;
  hutch_body_args b;
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback", "sb_x", "snap_a") == 0, "rollback: ID SNAP");
  is_str(b.id, "sb_x", "rollback: id");
  is_str(dump(b.body), "{\"snapshot\":\"snap_a\"}", "rollback: body");
  ok(!b.json, "rollback: no --json");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback", "--json", "sb_x", "snap_a") == 0 && b.json,
     "rollback: --json");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback", "sb_x") < 0, "rollback: no snapshot");
  is_str(err.msg, "missing snapshot ID", "rollback: no snapshot message");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback") < 0, "rollback: nothing");
  is_str(err.msg, "missing sandbox ID", "rollback: nothing message");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback", "sb_x", "") < 0, "rollback: empty snapshot");
  is_str(err.msg, "empty snapshot ID", "rollback: empty snapshot message");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback", "a", "b", "c") < 0, "rollback: extra word");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback", "a", "b", "--no-wait") < 0,
     "rollback: no --no-wait");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_rollback_args, &b, "rollback", "a", "\xff") < 0,
     "rollback: non-UTF-8 snapshot");
  hutch_body_args_free(&b);

  ok(PARSE(hutch_parse_fork_args, &b, "fork", "sb_x") == 0, "fork: ID");
  is_str(b.id, "sb_x", "fork: id");
  is_str(dump(b.body), "{}", "fork: default body (one copy, a fresh snapshot)");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_fork_args, &b, "fork", "--count", "3", "sb_x", "--snapshot", "snap_a",
           "--label", "k=v", "--json") == 0,
     "fork: all options");
  is_str(dump(b.body), "{\"count\":3,\"snapshot\":\"snap_a\",\"labels\":{\"k\":\"v\"}}",
         "fork: body");
  ok(b.json, "fork: --json");
  hutch_body_args_free(&b);
  ok(PARSE(hutch_parse_fork_args, &b, "fork", "-n2", "sb_x") == 0, "fork: -n2");
  is_str(dump(b.body), "{\"count\":2}", "fork: -n count");
  hutch_body_args_free(&b);

  struct {
    const char *argv[6];
    const char *msg;
  } bad[] = {
      {{"fork"}, "missing sandbox ID"},
      {{"fork", "a", "b"}, "unexpected argument `b`"},
      {{"fork", "a", "--count", "0"}, "--count `0`: at least 1"},
      {{"fork", "a", "--count", "two"},
       "--count `two`: expected a whole number from 0 to 1000000000000"},
      {{"fork", "a", "--count", "-1"},
       "--count `-1`: expected a whole number from 0 to 1000000000000"},
      {{"fork", "a", "--snapshot", ""}, "--snapshot: must not be empty"},
      {{"fork", "a", "--label", "=x"}, "--label `=x`: empty key"},
      {{"fork", "a", "--template", "t"}, "unknown option `--template`"},
      {{"fork", "a", "--count"}, "option `--count` needs a value"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int n = 0;
    while (bad[i].argv[n]) n++;
    ok(hutch_parse_fork_args(n, (char **)bad[i].argv, &b, &err) < 0, "fork: bad %zu rejected", i);
    is_str(err.msg, bad[i].msg, "fork: bad %zu message", i);
    hutch_body_args_free(&b);
  }

  hutch_plain_args pl;
  ok(PARSE(hutch_parse_plain_args, &pl, "storage", "--json") == 0 && pl.json, "storage: --json");
  ok(PARSE(hutch_parse_plain_args, &pl, "storage", "pool") < 0, "storage: no positional");
}

int main(void) {
  test_argp();
  test_values();
  test_global();
  test_create();
  test_exec();
  test_shell();
  test_command_verbs();
  test_cp();
  test_wire();
  test_run();
  test_small_verbs();
  test_lifecycle();
  test_template();
  test_snapshot();
  test_rollback_fork();
  dump(NULL);
  return done_testing();
}
