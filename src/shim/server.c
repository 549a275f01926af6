/* hutch-shim's event loop: one thread, poll(2), non-blocking clients.
 *
 * The shim keeps every command of the sandbox, named by the id hutchd gave
 * it (cmd_…), with its exit status and one ring buffer per output stream.
 * Clients (hutchd connections) start commands, attach to them (each attach
 * reads the rings at its own cursor), write stdin, signal, resize, wait and
 * list.  Output from hutch-init always goes into the rings at once, so the
 * channel to init is never blocked by a slow client; the rings bound memory.
 * FLOW commands are the exception that loses nothing: init may only read
 * their output as their first attached client drains it (CREDIT frames).
 *
 * File requests (types 32–40) are forwarded to hutch-init with their id
 * remapped; init resolves paths inside the sandbox.
 */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent/proto.h"
#include "agent/ring.h"
#include "common/log.h"
#include "common/util.h"
#include "shim.h"

#define MAX_CLIENTS 256
#define MAX_CMDS 1024
#define MAX_FINISHED 256
#define MAX_ATTACH 1024
#define MAX_FSREQ 256
#define MAX_STDINREQ 256
#define OUT_HIGH (256u << 10) /* pull more stream data for a client below this */
#define OUT_MAX (16u << 20)   /* a client that lets this much pile up is dropped */
#define CHUNK (64u << 10)

struct client {
  int fd;
  struct hutch_frame_decoder dec;
  struct hutch_buf out;
  size_t out_off;
};

struct cmd {
  bool used;
  char name[64];
  char *tag;
  json_t *argv;
  uint32_t gid;
  uint32_t flags;
  pid_t pid;
  bool started, exited, timed_out;
  int exit_code, signo;
  char *spawn_error;
  uint64_t started_at, finished_at;
  struct hutch_ring ring[2]; /* stdout, stderr */
  uint64_t credit;           /* FLOW: total output credit granted to init */
  bool stdin_closed;
  int spawn_client;
  uint32_t spawn_req;
  bool had_primary;
  bool abandoned; /* FLOW command whose primary reader left: read freely now */
};

struct attach {
  bool used;
  int client;
  uint32_t req;
  int cmd;
  uint64_t cur[2];
  bool want_output;
  bool primary;
};

struct fsreq {
  bool used;
  uint32_t gid;
  int client;
  uint32_t req;
};

struct stdinreq {
  bool used;
  int cmd;
  int client;
  uint32_t req;
};

static struct shim_config *C;
static struct client clients[MAX_CLIENTS];
static struct cmd cmds[MAX_CMDS];
static struct attach attaches[MAX_ATTACH];
static struct fsreq fsreqs[MAX_FSREQ];
static struct stdinreq stdinreqs[MAX_STDINREQ];
static uint32_t next_gid = 0;

/* Channel-wide command ids.  They start at a random point: a hutch-init
 * restored from a memory checkpoint still knows the commands of the shim
 * that checkpointed it, and a new shim counting from 1 again would collide. */
static uint32_t new_gid(void) {
  while (next_gid == 0) {
    uint32_t r = 0;
    if (hutch_random_bytes(&r, sizeof r) < 0) r = (uint32_t)getpid() << 12;
    next_gid = (r & 0x3fffffffu) | 1u;
  }
  uint32_t g = next_gid++;
  if (next_gid == 0) next_gid = 1;
  return g;
}

/* ---- clients ---------------------------------------------------------- */

static void drop_client(int ci);

static void client_queue(int ci, uint16_t type, uint32_t id, const void *p, size_t n) {
  if (ci < 0 || clients[ci].fd < 0) return;
  unsigned char hdr[HUTCH_FRAME_HDR];
  struct hutch_frame_hdr h = {.len = (uint32_t)n, .type = type, .id = id};
  hutch_frame_hdr_encode(&h, hdr);
  hutch_buf_append(&clients[ci].out, hdr, sizeof hdr);
  hutch_buf_append(&clients[ci].out, p, n);
  if (clients[ci].out.len - clients[ci].out_off > OUT_MAX) {
    hutch_log(LOG_WARN, "client.dropped", "reason", "output backlog over limit", NULL);
    drop_client(ci);
  }
}

static void client_flush(int ci) {
  struct client *c = &clients[ci];
  while (c->fd >= 0 && c->out_off < c->out.len) {
    ssize_t w = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return;
      drop_client(ci);
      return;
    }
    c->out_off += (size_t)w;
  }
  if (c->fd >= 0 && c->out_off == c->out.len) {
    hutch_buf_reset(&c->out);
    c->out_off = 0;
  }
}

static size_t client_pending(int ci) { return clients[ci].out.len - clients[ci].out_off; }

static void client_error(int ci, uint32_t id, int errnum, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void client_error(int ci, uint32_t id, int errnum, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_ERRNO, (uint32_t)errnum);
  hutch_tlv_put_str(&b, HUTCH_TAG_MESSAGE, msg);
  client_queue(ci, HUTCH_MSG_ERROR, id, b.data, b.len);
  hutch_buf_free(&b);
}

static void init_send(uint16_t type, uint32_t id, const void *p, size_t n) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_frame_write(C->inst->channel_fd, type, id, p, n, &err) < 0) {
    hutch_log(LOG_ERROR, "channel.write_failed", "reason", err.msg, NULL);
    shim_shutdown_and_exit(C, 1);
  }
}

/* ---- commands --------------------------------------------------------- */

static int find_cmd(const char *name) {
  for (int i = 0; i < MAX_CMDS; i++)
    if (cmds[i].used && !strcmp(cmds[i].name, name)) return i;
  return -1;
}

static int find_cmd_gid(uint32_t gid) {
  for (int i = 0; i < MAX_CMDS; i++)
    if (cmds[i].used && cmds[i].gid == gid) return i;
  return -1;
}

static void free_cmd(int i) {
  struct cmd *c = &cmds[i];
  free(c->tag);
  free(c->spawn_error);
  json_decref(c->argv);
  hutch_ring_free(&c->ring[0]);
  hutch_ring_free(&c->ring[1]);
  memset(c, 0, sizeof *c);
}

/* A free slot, evicting the oldest finished command when only finished
 * ones remain beyond MAX_FINISHED. */
static int alloc_cmd(void) {
  int finished = 0, oldest = -1, free_slot = -1;
  for (int i = 0; i < MAX_CMDS; i++) {
    if (!cmds[i].used) {
      if (free_slot < 0) free_slot = i;
      continue;
    }
    if (cmds[i].exited) {
      finished++;
      if (oldest < 0 || cmds[i].finished_at < cmds[oldest].finished_at) oldest = i;
    }
  }
  if (finished >= MAX_FINISHED && oldest >= 0) {
    bool attached = false;
    for (int a = 0; a < MAX_ATTACH; a++)
      if (attaches[a].used && attaches[a].cmd == oldest) attached = true;
    if (!attached) {
      free_cmd(oldest);
      return oldest;
    }
  }
  return free_slot;
}

static json_t *cmd_json(const struct cmd *c) {
  char s[32], f[32];
  iso8601(c->started_at, s);
  iso8601(c->finished_at, f);
  json_t *o = json_pack("{s:s, s:I, s:s?, s:O, s:b, s:s, s:o, s:o, s:b, s:s, s:o, s:{s:I, s:I}, s:{s:I, s:I}}",
                        "id", c->name, "pid", (json_int_t)c->pid, "tag", c->tag, "argv", c->argv, "pty",
                        (c->flags & HUTCH_SPAWN_PTY) != 0, "state", c->exited ? "exited" : "running", "exit_code",
                        c->exited && !c->signo ? json_integer(c->exit_code) : json_null(), "signal",
                        c->signo ? json_integer(c->signo) : json_null(), "timed_out", c->timed_out, "started_at",
                        s, "finished_at", c->exited ? json_string(f) : json_null(), "output_bytes", "stdout",
                        (json_int_t)c->ring[0].end, "stderr", (json_int_t)c->ring[1].end, "dropped", "stdout",
                        (json_int_t)c->ring[0].start, "stderr", (json_int_t)c->ring[1].start);
  if (o && c->spawn_error) json_object_set_new(o, "error", json_string(c->spawn_error));
  return o;
}

static void exit_payload(const struct cmd *c, struct hutch_buf *b) {
  if (c->spawn_error) {
    hutch_tlv_put_u32(b, HUTCH_TAG_ERRNO, ENOENT);
    hutch_tlv_put_str(b, HUTCH_TAG_MESSAGE, c->spawn_error);
    return;
  }
  struct hutch_exit e = {.exit_code = c->exit_code, .signo = c->signo, .timed_out = c->timed_out};
  hutch_exit_encode(b, &e);
}

/* ---- attaches ----------------------------------------------------------- */

static int add_attach(int ci, uint32_t req, int cmd, bool replay, bool want_output) {
  for (int a = 0; a < MAX_ATTACH; a++) {
    if (attaches[a].used) continue;
    struct cmd *c = &cmds[cmd];
    bool primary = want_output && !c->had_primary && (c->flags & HUTCH_SPAWN_FLOW);
    attaches[a] = (struct attach){.used = true, .client = ci, .req = req, .cmd = cmd, .want_output = want_output,
                                  .primary = primary};
    if (primary) c->had_primary = true;
    for (int s = 0; s < 2; s++) attaches[a].cur[s] = replay ? c->ring[s].start : c->ring[s].end;
    if (want_output) {
      struct hutch_buf b;
      hutch_buf_init(&b);
      hutch_tlv_put_str(&b, HUTCH_TAG_NAME, c->name);
      hutch_tlv_put_u64(&b, HUTCH_TAG_DROPPED_OUT, replay ? c->ring[0].start : 0);
      hutch_tlv_put_u64(&b, HUTCH_TAG_DROPPED_ERR, replay ? c->ring[1].start : 0);
      client_queue(ci, HUTCH_MSG_ATTACHED, req, b.data, b.len);
      hutch_buf_free(&b);
    }
    return a;
  }
  client_error(ci, req, EAGAIN, "too many attached clients");
  return -1;
}

/* Move a FLOW command's credit so init may fill the rings up to what its
 * primary client has not read yet.  Without a primary (never attached, or
 * gone), only the first ring's worth is granted. */
static void update_credit(int ci_cmd) {
  struct cmd *c = &cmds[ci_cmd];
  if (!(c->flags & HUTCH_SPAWN_FLOW) || c->exited) return;
  uint64_t consumed = 0;
  for (int a = 0; a < MAX_ATTACH; a++)
    if (attaches[a].used && attaches[a].cmd == ci_cmd && attaches[a].primary)
      consumed = attaches[a].cur[0] + attaches[a].cur[1];
  /* Once its reader left (and the command was killed), nobody paces it any
   * more: let init drain the pipes so the exit can be reported. */
  if (c->abandoned) consumed = c->ring[0].end + c->ring[1].end + 4 * (uint64_t)C->ring_bytes;
  uint64_t target = consumed + C->ring_bytes;
  if (target > c->credit) {
    uint64_t grant = target - c->credit;
    if (grant > UINT32_MAX) grant = UINT32_MAX;
    struct hutch_buf b;
    hutch_buf_init(&b);
    hutch_tlv_put_u32(&b, HUTCH_TAG_BYTES, (uint32_t)grant);
    init_send(HUTCH_MSG_CREDIT, c->gid, b.data, b.len);
    hutch_buf_free(&b);
    c->credit += grant;
  }
}

static void signal_cmd(struct cmd *c, int sig) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_SIGNO, (uint32_t)sig);
  init_send(HUTCH_MSG_SIGNAL, c->gid, b.data, b.len);
  hutch_buf_free(&b);
}

static void release_attach(int a) {
  struct attach *at = &attaches[a];
  struct cmd *c = &cmds[at->cmd];
  /* A FLOW command lives for its primary reader (a sync exec, a tar
   * download): when that reader goes away early, the command is killed
   * rather than left blocked on a full pipe forever. */
  if (at->primary && c->used && !c->exited) {
    signal_cmd(c, SIGKILL);
    c->abandoned = true;
  }
  at->used = false;
}

/* Push ring data and, at the end, the exit to one attached client. */
static void pump_attach(int a) {
  struct attach *at = &attaches[a];
  struct cmd *c = &cmds[at->cmd];
  if (clients[at->client].fd < 0) {
    release_attach(a);
    return;
  }
  static unsigned char buf[CHUNK];
  if (at->want_output) {
    for (int s = 0; s < 2 && client_pending(at->client) < OUT_HIGH; s++) {
      uint64_t missed;
      size_t n;
      while (client_pending(at->client) < OUT_HIGH &&
             (n = hutch_ring_read(&c->ring[s], &at->cur[s], buf, sizeof buf, &missed)) > 0) {
        if (missed) {
          struct hutch_buf b;
          hutch_buf_init(&b);
          hutch_tlv_put_str(&b, HUTCH_TAG_NAME, c->name);
          hutch_tlv_put_u64(&b, s == 0 ? HUTCH_TAG_DROPPED_OUT : HUTCH_TAG_DROPPED_ERR, missed);
          client_queue(at->client, HUTCH_MSG_ATTACHED, at->req, b.data, b.len);
          hutch_buf_free(&b);
        }
        client_queue(at->client, s == 0 ? HUTCH_MSG_STDOUT : HUTCH_MSG_STDERR, at->req, buf, n);
        if (clients[at->client].fd < 0) return;
      }
    }
  }
  bool drained = !at->want_output || (at->cur[0] >= c->ring[0].end && at->cur[1] >= c->ring[1].end);
  if (c->exited && drained) {
    struct hutch_buf b;
    hutch_buf_init(&b);
    exit_payload(c, &b);
    client_queue(at->client, c->spawn_error ? HUTCH_MSG_ERROR : HUTCH_MSG_EXIT, at->req, b.data, b.len);
    hutch_buf_free(&b);
    at->used = false;
  }
}

static void drop_client(int ci) {
  if (clients[ci].fd < 0) return;
  close(clients[ci].fd);
  clients[ci].fd = -1;
  hutch_decoder_free(&clients[ci].dec);
  hutch_buf_free(&clients[ci].out);
  clients[ci].out_off = 0;
  for (int a = 0; a < MAX_ATTACH; a++)
    if (attaches[a].used && attaches[a].client == ci) release_attach(a);
  for (int f = 0; f < MAX_FSREQ; f++)
    if (fsreqs[f].used && fsreqs[f].client == ci) fsreqs[f].client = -1; /* answer is discarded */
  for (int s = 0; s < MAX_STDINREQ; s++)
    if (stdinreqs[s].used && stdinreqs[s].client == ci) stdinreqs[s].used = false;
  for (int i = 0; i < MAX_CMDS; i++)
    if (cmds[i].used && cmds[i].spawn_client == ci) cmds[i].spawn_client = -1;
}

/* ---- requests from clients --------------------------------------------- */

static int cmd_by_name(int ci, uint32_t req, const unsigned char *p, size_t n) {
  cleanup_free char *name = hutch_tlv_find_str(p, n, HUTCH_TAG_NAME);
  if (!name) {
    client_error(ci, req, EINVAL, "request without a command name");
    return -1;
  }
  int i = find_cmd(name);
  if (i < 0) client_error(ci, req, ESRCH, "command `%.80s` not found", name);
  return i;
}

static void req_spawn(int ci, uint32_t req, const unsigned char *p, size_t n) {
  cleanup_free char *name = hutch_tlv_find_str(p, n, HUTCH_TAG_NAME);
  if (!name || !*name || strlen(name) >= 64) {
    client_error(ci, req, EINVAL, "SPAWN needs a command name of 1-63 bytes");
    return;
  }
  if (find_cmd(name) >= 0) {
    client_error(ci, req, EEXIST, "command `%s` exists", name);
    return;
  }
  hutch_err err = HUTCH_ERR_INIT;
  struct hutch_spawn sp;
  if (hutch_spawn_decode(p, n, &sp, &err) < 0) {
    client_error(ci, req, EINVAL, "%s", err.msg);
    return;
  }
  int i = alloc_cmd();
  if (i < 0) {
    hutch_spawn_free(&sp);
    client_error(ci, req, EAGAIN, "too many commands in this sandbox");
    return;
  }
  struct cmd *c = &cmds[i];
  memset(c, 0, sizeof *c);
  c->used = true;
  snprintf(c->name, sizeof c->name, "%s", name);
  c->tag = hutch_tlv_find_str(p, n, HUTCH_TAG_TAG);
  c->argv = json_array();
  for (size_t k = 0; k < sp.argc; k++) json_array_append_new(c->argv, json_string(sp.argv[k]));
  c->flags = sp.flags;
  hutch_spawn_free(&sp);
  c->gid = new_gid();
  c->started_at = now_ms();
  c->spawn_client = ci;
  c->spawn_req = req;
  hutch_ring_init(&c->ring[0], C->ring_bytes);
  hutch_ring_init(&c->ring[1], C->ring_bytes);
  init_send(HUTCH_MSG_SPAWN, c->gid, p, n);
  if (c->flags & HUTCH_SPAWN_ATTACH) add_attach(ci, req, i, true, true);
  update_credit(i);
}

static void req_stdin(int ci, const struct hutch_frame_hdr *h, const unsigned char *p) {
  int i = cmd_by_name(ci, h->id, p, h->len);
  if (i < 0) return;
  struct cmd *c = &cmds[i];
  if (c->exited) {
    client_error(ci, h->id, EPIPE, "command `%s` has finished", c->name);
    return;
  }
  if (!(c->flags & (HUTCH_SPAWN_STDIN | HUTCH_SPAWN_PTY))) {
    client_error(ci, h->id, EPIPE, "command `%s` was started without stdin", c->name);
    return;
  }
  if (c->stdin_closed) {
    client_error(ci, h->id, EPIPE, "stdin of command `%s` is closed", c->name);
    return;
  }
  const unsigned char *data = NULL;
  uint32_t dl = 0;
  if (h->type == HUTCH_MSG_STDIN && hutch_tlv_find(p, h->len, HUTCH_TAG_DATA, &data, &dl) != 1) {
    client_error(ci, h->id, EINVAL, "STDIN without DATA");
    return;
  }
  if (h->type == HUTCH_MSG_STDIN_CLOSE) {
    c->stdin_closed = true;
    init_send(HUTCH_MSG_STDIN_CLOSE, c->gid, NULL, 0);
    client_queue(ci, HUTCH_MSG_ACK, h->id, NULL, 0);
    return;
  }
  int s = -1;
  for (int k = 0; k < MAX_STDINREQ; k++)
    if (!stdinreqs[k].used) {
      s = k;
      break;
    }
  if (s < 0) {
    client_error(ci, h->id, EAGAIN, "too many stdin writes in flight");
    return;
  }
  stdinreqs[s] = (struct stdinreq){.used = true, .cmd = i, .client = ci, .req = h->id};
  init_send(HUTCH_MSG_STDIN, c->gid, data, dl);
}

static void req_list(int ci, uint32_t req, const unsigned char *p, size_t n) {
  cleanup_free char *name = hutch_tlv_find_str(p, n, HUTCH_TAG_NAME);
  json_t *out;
  if (name) {
    int i = find_cmd(name);
    if (i < 0) {
      client_error(ci, req, ESRCH, "command `%.80s` not found", name);
      return;
    }
    out = cmd_json(&cmds[i]);
  } else {
    out = json_array();
    /* Oldest first. */
    bool taken[MAX_CMDS] = {0};
    for (;;) {
      int best = -1;
      for (int i = 0; i < MAX_CMDS; i++)
        if (cmds[i].used && !taken[i] && (best < 0 || cmds[i].started_at < cmds[best].started_at)) best = i;
      if (best < 0) break;
      taken[best] = true;
      json_array_append_new(out, cmd_json(&cmds[best]));
    }
  }
  char *text = json_dumps(out, JSON_COMPACT);
  json_decref(out);
  if (!text) {
    client_error(ci, req, ENOMEM, "list");
    return;
  }
  client_queue(ci, HUTCH_MSG_LIST, req, text, strlen(text));
  free(text);
}

static void req_fs(int ci, const struct hutch_frame_hdr *h, const unsigned char *p) {
  for (int f = 0; f < MAX_FSREQ; f++) {
    if (fsreqs[f].used) continue;
    fsreqs[f] = (struct fsreq){.used = true, .gid = new_gid(), .client = ci, .req = h->id};
    init_send(h->type, fsreqs[f].gid, p, h->len);
    return;
  }
  client_error(ci, h->id, EAGAIN, "too many file requests in flight");
}

static void handle_client_frame(int ci, const struct hutch_frame_hdr *h, const unsigned char *p) {
  int i;
  if (h->type >= HUTCH_MSG_FS_FIRST && h->type <= HUTCH_MSG_FS_LAST) {
    req_fs(ci, h, p);
    return;
  }
  switch (h->type) {
    case HUTCH_MSG_SPAWN: req_spawn(ci, h->id, p, h->len); return;
    case HUTCH_MSG_STDIN:
    case HUTCH_MSG_STDIN_CLOSE: req_stdin(ci, h, p); return;
    case HUTCH_MSG_ATTACH: {
      if ((i = cmd_by_name(ci, h->id, p, h->len)) < 0) return;
      uint32_t flags = 1;
      hutch_tlv_find_u32(p, h->len, HUTCH_TAG_FLAGS, &flags);
      if (add_attach(ci, h->id, i, flags & 1, true) >= 0) update_credit(i);
      return;
    }
    case HUTCH_MSG_WAIT:
      if ((i = cmd_by_name(ci, h->id, p, h->len)) >= 0) add_attach(ci, h->id, i, false, false);
      return;
    case HUTCH_MSG_SIGNAL: {
      if ((i = cmd_by_name(ci, h->id, p, h->len)) < 0) return;
      uint32_t sig = 0;
      if (hutch_tlv_find_u32(p, h->len, HUTCH_TAG_SIGNO, &sig) != 1 || sig == 0 || sig >= 65) {
        client_error(ci, h->id, EINVAL, "invalid signal");
        return;
      }
      if (cmds[i].exited) {
        client_error(ci, h->id, EPIPE, "command `%s` has finished", cmds[i].name);
        return;
      }
      signal_cmd(&cmds[i], (int)sig);
      client_queue(ci, HUTCH_MSG_ACK, h->id, NULL, 0);
      return;
    }
    case HUTCH_MSG_RESIZE: {
      if ((i = cmd_by_name(ci, h->id, p, h->len)) < 0) return;
      uint32_t rows = 0, cols = 0;
      if (!(cmds[i].flags & HUTCH_SPAWN_PTY)) {
        client_error(ci, h->id, ENOTTY, "command `%s` has no terminal", cmds[i].name);
        return;
      }
      if (cmds[i].exited) {
        client_error(ci, h->id, EPIPE, "command `%s` has finished", cmds[i].name);
        return;
      }
      if (hutch_tlv_find_u32(p, h->len, HUTCH_TAG_ROWS, &rows) != 1 ||
          hutch_tlv_find_u32(p, h->len, HUTCH_TAG_COLS, &cols) != 1 || rows == 0 || cols == 0 || rows > 65535 ||
          cols > 65535) {
        client_error(ci, h->id, EINVAL, "RESIZE needs ROWS and COLS of 1 to 65535");
        return;
      }
      struct hutch_buf b;
      hutch_buf_init(&b);
      hutch_tlv_put_u32(&b, HUTCH_TAG_ROWS, rows);
      hutch_tlv_put_u32(&b, HUTCH_TAG_COLS, cols);
      init_send(HUTCH_MSG_RESIZE, cmds[i].gid, b.data, b.len);
      hutch_buf_free(&b);
      client_queue(ci, HUTCH_MSG_ACK, h->id, NULL, 0);
      return;
    }
    case HUTCH_MSG_LIST: req_list(ci, h->id, p, h->len); return;
    case HUTCH_MSG_PING: client_queue(ci, HUTCH_MSG_PONG, h->id, NULL, 0); return;
    case HUTCH_MSG_INFO: {
      struct hutch_buf b;
      hutch_buf_init(&b);
      hutch_tlv_put_u32(&b, HUTCH_TAG_INIT_PID, (uint32_t)C->inst->init_pid);
      hutch_tlv_put_u32(&b, HUTCH_TAG_SHIM_PID, (uint32_t)getpid());
      client_queue(ci, HUTCH_MSG_INFO, h->id, b.data, b.len);
      hutch_buf_free(&b);
      return;
    }
    case HUTCH_MSG_SHUTDOWN: {
      /* Answer after the sandbox is gone, then exit. */
      if (C->inst->init_pid > 0) {
        kill(C->inst->init_pid, SIGKILL);
        waitpid(C->inst->init_pid, NULL, 0);
        C->inst->init_pid = -1;
      }
      hutch_err err = HUTCH_ERR_INIT;
      if (C->rt->destroy(C->spec, &err) < 0)
        hutch_log(LOG_ERROR, "shim.destroy_failed", "reason", err.msg, NULL);
      hutch_frame_write(clients[ci].fd, HUTCH_MSG_SHUTDOWN, h->id, NULL, 0, &err);
      shim_shutdown_and_exit(C, 0);
    }
    default: client_error(ci, h->id, EPROTO, "unexpected frame type %u", h->type); return;
  }
}

/* ---- frames from hutch-init -------------------------------------------- */

static void handle_init_frame(const struct hutch_frame_hdr *h, const unsigned char *p) {
  if (h->type == HUTCH_MSG_PONG || h->type == HUTCH_MSG_HELLO) return;
  if (h->type == HUTCH_MSG_FS_RESULT || h->type == HUTCH_MSG_FS_DATA ||
      (h->type == HUTCH_MSG_ERROR && find_cmd_gid(h->id) < 0)) {
    for (int f = 0; f < MAX_FSREQ; f++) {
      if (!fsreqs[f].used || fsreqs[f].gid != h->id) continue;
      client_queue(fsreqs[f].client, h->type, fsreqs[f].req, p, h->len);
      fsreqs[f].used = false;
      return;
    }
    if (h->type == HUTCH_MSG_ERROR) hutch_log(LOG_WARN, "init.error", "id", C->spec->id, NULL);
    return;
  }
  int i = find_cmd_gid(h->id);
  if (i < 0) return;
  struct cmd *c = &cmds[i];
  switch (h->type) {
    case HUTCH_MSG_STARTED: {
      uint32_t pid = 0;
      hutch_tlv_find_u32(p, h->len, HUTCH_TAG_PID, &pid);
      c->pid = (pid_t)pid;
      c->started = true;
      client_queue(c->spawn_client, HUTCH_MSG_STARTED, c->spawn_req, p, h->len);
      return;
    }
    case HUTCH_MSG_STDOUT:
    case HUTCH_MSG_STDERR: hutch_ring_write(&c->ring[h->type == HUTCH_MSG_STDERR], p, h->len); return;
    case HUTCH_MSG_EXIT: {
      struct hutch_exit e;
      hutch_exit_decode(p, h->len, &e);
      c->signo = e.signo;
      c->exit_code = e.exit_code;
      c->timed_out = e.timed_out;
      c->exited = true;
      c->finished_at = now_ms();
      for (int s = 0; s < MAX_STDINREQ; s++)
        if (stdinreqs[s].used && stdinreqs[s].cmd == i) {
          client_error(stdinreqs[s].client, stdinreqs[s].req, EPIPE, "command `%s` has finished", c->name);
          stdinreqs[s].used = false;
        }
      return;
    }
    case HUTCH_MSG_STDIN_WRITTEN:
      for (int s = 0; s < MAX_STDINREQ; s++)
        if (stdinreqs[s].used && stdinreqs[s].cmd == i) {
          client_queue(stdinreqs[s].client, HUTCH_MSG_STDIN_WRITTEN, stdinreqs[s].req, p, h->len);
          stdinreqs[s].used = false;
        }
      return;
    case HUTCH_MSG_ERROR: {
      uint32_t en = 0;
      hutch_tlv_find_u32(p, h->len, HUTCH_TAG_ERRNO, &en);
      if (!c->started) {
        /* The command never ran. */
        char *msg = hutch_tlv_find_str(p, h->len, HUTCH_TAG_MESSAGE);
        c->spawn_error = msg ? msg : xstrdup("the command could not start");
        c->exited = true;
        c->exit_code = en == ENOENT ? 127 : 126;
        c->finished_at = now_ms();
        client_queue(c->spawn_client, HUTCH_MSG_ERROR, c->spawn_req, p, h->len);
        for (int a = 0; a < MAX_ATTACH; a++)
          if (attaches[a].used && attaches[a].cmd == i && attaches[a].client == c->spawn_client &&
              attaches[a].req == c->spawn_req)
            attaches[a].used = false; /* the spawner already has its answer */
        return;
      }
      /* stdin trouble of a running command: tell whoever is writing.  Other
       * errors (a bad RESIZE or CREDIT) were validated away by the shim and
       * are only logged. */
      if (en != EPIPE && en != ENOBUFS) {
        hutch_log(LOG_WARN, "init.command_error", "id", c->name, NULL);
        return;
      }
      for (int s = 0; s < MAX_STDINREQ; s++)
        if (stdinreqs[s].used && stdinreqs[s].cmd == i) {
          client_queue(stdinreqs[s].client, HUTCH_MSG_ERROR, stdinreqs[s].req, p, h->len);
          stdinreqs[s].used = false;
        }
      return;
    }
    default: return;
  }
}

/* ---- the loop ----------------------------------------------------------- */

static void accept_client(void) {
  int cfd = accept4(C->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (cfd < 0) return;
  for (int i = 0; i < MAX_CLIENTS; i++)
    if (clients[i].fd < 0) {
      clients[i].fd = cfd;
      hutch_decoder_init(&clients[i].dec);
      hutch_buf_init(&clients[i].out);
      clients[i].out_off = 0;
      return;
    }
  close(cfd);
}

static void read_client(int ci) {
  static unsigned char buf[65536];
  ssize_t r = read(clients[ci].fd, buf, sizeof buf);
  if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
    drop_client(ci);
    return;
  }
  if (r < 0) return;
  hutch_decoder_feed(&clients[ci].dec, buf, (size_t)r);
  struct hutch_frame_hdr h;
  const unsigned char *p;
  hutch_err err = HUTCH_ERR_INIT;
  int pr = 0;
  while (clients[ci].fd >= 0 && (pr = hutch_decoder_pop(&clients[ci].dec, &h, &p, &err)) == 1) {
    handle_client_frame(ci, &h, p);
    if (clients[ci].fd >= 0) hutch_decoder_consume(&clients[ci].dec, &h);
  }
  if (clients[ci].fd >= 0 && pr < 0) drop_client(ci);
}

static void read_init(struct hutch_frame_decoder *dec) {
  static unsigned char buf[65536];
  ssize_t r = read(C->inst->channel_fd, buf, sizeof buf);
  if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
    hutch_log(LOG_ERROR, "channel.closed", "id", C->spec->id, NULL);
    shim_shutdown_and_exit(C, 1);
  }
  if (r < 0) return;
  hutch_decoder_feed(dec, buf, (size_t)r);
  struct hutch_frame_hdr h;
  const unsigned char *p;
  hutch_err err = HUTCH_ERR_INIT;
  int pr;
  while ((pr = hutch_decoder_pop(dec, &h, &p, &err)) == 1) {
    handle_init_frame(&h, p);
    hutch_decoder_consume(dec, &h);
  }
  if (pr < 0) {
    hutch_log(LOG_ERROR, "channel.protocol_error", "reason", err.msg, NULL);
    shim_shutdown_and_exit(C, 1);
  }
}

static void handle_signals(void) {
  struct signalfd_siginfo si;
  while (read(C->signal_fd, &si, sizeof si) == (ssize_t)sizeof si) {
    if (si.ssi_signo != SIGCHLD) shim_shutdown_and_exit(C, 0);
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
      if (p == C->inst->init_pid) {
        hutch_log(LOG_ERROR, "sandbox.init_died", "id", C->spec->id, NULL);
        C->inst->init_pid = -1;
        shim_shutdown_and_exit(C, 1);
      }
    }
  }
}

void shim_serve(struct shim_config *cfg) {
  C = cfg;
  for (int i = 0; i < MAX_CLIENTS; i++) clients[i].fd = -1;
  set_nonblock(C->inst->channel_fd, false);
  struct hutch_frame_decoder idec;
  hutch_decoder_init(&idec);
  static struct pollfd pfd[3 + MAX_CLIENTS];
  for (;;) {
    /* Move data toward clients before sleeping. */
    for (int a = 0; a < MAX_ATTACH; a++)
      if (attaches[a].used) pump_attach(a);
    for (int i = 0; i < MAX_CMDS; i++)
      if (cmds[i].used && (cmds[i].flags & HUTCH_SPAWN_FLOW)) update_credit(i);
    for (int ci = 0; ci < MAX_CLIENTS; ci++)
      if (clients[ci].fd >= 0 && client_pending(ci)) client_flush(ci);

    size_t n = 0;
    pfd[n++] = (struct pollfd){.fd = C->signal_fd, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = C->inst->channel_fd, .events = POLLIN};
    pfd[n++] = (struct pollfd){.fd = C->listen_fd, .events = POLLIN};
    for (int ci = 0; ci < MAX_CLIENTS; ci++)
      pfd[n++] = (struct pollfd){.fd = clients[ci].fd,
                                 .events = (short)(POLLIN | (clients[ci].fd >= 0 && client_pending(ci) ? POLLOUT : 0))};
    if (poll(pfd, n, -1) < 0) {
      if (errno == EINTR) continue;
      hutch_log(LOG_ERROR, "shim.poll_failed", NULL);
      shim_shutdown_and_exit(C, 1);
    }
    if (pfd[0].revents & POLLIN) handle_signals();
    if (pfd[1].revents & (POLLIN | POLLHUP | POLLERR)) read_init(&idec);
    if (pfd[2].revents & POLLIN) accept_client();
    for (int ci = 0; ci < MAX_CLIENTS; ci++) {
      if (clients[ci].fd < 0) continue;
      short re = pfd[3 + ci].revents;
      if (re & POLLOUT) client_flush(ci);
      if (clients[ci].fd >= 0 && (re & (POLLIN | POLLHUP | POLLERR))) read_client(ci);
    }
  }
}
