/* hutch-init: PID 1 inside a sandbox, the guest agent.
 *
 * It owns fd 3, a byte stream to hutch-shim carrying the framed protocol of
 * docs/protocol.md (version 2).  It spawns commands on request (each in its
 * own session and process group, on pipes or on a new PTY), relays their
 * output (as fast as it comes, or as CREDIT allows for FLOW commands), feeds
 * their stdin and reports when it reached the pipe, enforces timeouts by
 * killing the whole process group, reaps every orphan in the sandbox,
 * reports each command's exit status or signal, and serves file operations
 * with every path resolved inside the sandbox's root.
 *
 * Single-threaded poll loop; statically linked so it runs in any rootfs.
 * When the channel closes (the shim is gone) init exits, and the kernel
 * kills everything else in the sandbox's pid namespace.
 *
 * This file: the channel, the loop, dispatch.  command.c: commands.
 * files.c: file operations.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "init.h"

mode_t init_cmd_umask = 022;

uint64_t init_mono_ms(void) { return mono_us() / 1000; }

void init_send(uint16_t type, uint32_t id, const void *p, size_t n) {
  hutch_err err = HUTCH_ERR_INIT;
  if (hutch_frame_write(CHANNEL_FD, type, id, p, n, &err) < 0) {
    /* The shim is gone: nothing in this sandbox has anyone to report to. */
    cmd_kill_all();
    _exit(1);
  }
}

void init_send_error(uint32_t id, int errnum, const char *msg) {
  struct hutch_buf b;
  hutch_buf_init(&b);
  hutch_tlv_put_u32(&b, HUTCH_TAG_ERRNO, (uint32_t)errnum);
  hutch_tlv_put_str(&b, HUTCH_TAG_MESSAGE, msg);
  init_send(HUTCH_MSG_ERROR, id, b.data, b.len);
  hutch_buf_free(&b);
}

static void handle_frame(const struct hutch_frame_hdr *h, const unsigned char *p) {
  switch (h->type) {
    case HUTCH_MSG_SPAWN: cmd_spawn(h->id, p, h->len); break;
    case HUTCH_MSG_STDIN: cmd_stdin(h->id, p, h->len); break;
    case HUTCH_MSG_STDIN_CLOSE: cmd_stdin_close(h->id); break;
    case HUTCH_MSG_SIGNAL: cmd_signal(h->id, p, h->len); break;
    case HUTCH_MSG_CREDIT: cmd_credit(h->id, p, h->len); break;
    case HUTCH_MSG_RESIZE: cmd_resize(h->id, p, h->len); break;
    case HUTCH_MSG_PING: init_send(HUTCH_MSG_PONG, h->id, NULL, 0); break;
    default:
      if (h->type >= HUTCH_MSG_FS_FIRST && h->type <= HUTCH_MSG_FS_LAST) fs_handle(h->type, h->id, p, h->len);
      /* other types are not for init: ignored, so both sides can grow */
      break;
  }
}

/* A command's stdio is dup'ed onto 0-2 right before exec; if init itself
 * started without them, a pipe could land on 0-2 and dup2() onto itself
 * would keep its close-on-exec flag.  Keep 0-2 occupied. */
static void occupy_stdio(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) >= 0) continue;
    int n = open("/dev/null", O_RDWR);
    if (n >= 0 && n != fd) {
      dup2(n, fd);
      close(n);
    }
  }
}

/* --stdio-channel (the gvisor runtime): runsc hands its own stdin, stdout
 * and stderr to the container's PID 1; stdin and stdout are one end of the
 * shim's socket.  Move it to CHANNEL_FD and point 0, 1 and 2 at /dev/null,
 * so everything after this sees the fds it has under `native`.
 *
 * 2 is the shim's log on the host: under gVisor a process of the sandbox
 * can open /proc/1/fd/<n> of init (the non-dumpable shield native relies
 * on does not cover it; sockets, such as the channel, cannot be reopened
 * that way, a log file can), so init keeps no file of the host's but the
 * channel.  init writes nothing to stderr.
 *
 * gVisor imports each donated fd as its own file, and releasing one that is
 * a socket shuts the host socket down (shutdown(2), for every holder): fd
 * 1's file must stay open as long as init runs, so a close-on-exec copy of
 * it is parked above the low fds and never closed.  (fd 0's file is the
 * channel itself.) */
static int stdio_channel(void) {
  if (dup2(0, CHANNEL_FD) < 0) return -1;
  if (fcntl(1, F_DUPFD_CLOEXEC, 64) < 0) return -1;
  int n = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (n < 0) return -1;
  if (dup2(n, 0) < 0 || dup2(n, 1) < 0 || dup2(n, 2) < 0) return -1;
  close(n);
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--stdio-channel")) {
      if (stdio_channel() < 0) return 1;
    } else {
      return 2;
    }
  }
  /* hutch-init holds the channel to the shim: nothing in the sandbox may
   * ptrace it or read its memory.  Sandbox root lacks CAP_SYS_PTRACE, so a
   * non-dumpable init is out of its reach (commands it starts are dumpable
   * again after their exec). */
  prctl(PR_SET_DUMPABLE, 0);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGPIPE);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sigfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd < 0) return 1;
  if (set_cloexec(CHANNEL_FD) < 0) return 1;
  occupy_stdio();
  init_cmd_umask = umask(0);
  fs_init();

  struct hutch_buf hello;
  hutch_buf_init(&hello);
  hutch_tlv_put_u32(&hello, HUTCH_TAG_VERSION, HUTCH_PROTO_VERSION);
  hutch_tlv_put_u32(&hello, HUTCH_TAG_PID, (uint32_t)getpid());
  init_send(HUTCH_MSG_HELLO, 0, hello.data, hello.len);
  hutch_buf_free(&hello);

  struct hutch_frame_decoder dec;
  hutch_decoder_init(&dec);
  set_nonblock(CHANNEL_FD, false);

  static struct pollfd pfd[2 + CMD_POLLFDS * MAX_COMMANDS];
  static unsigned char rbuf[65536];
  for (;;) {
    pfd[0] = (struct pollfd){.fd = CHANNEL_FD, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = sigfd, .events = POLLIN};
    int timeout = -1;
    size_t n = cmd_poll_fill(pfd + 2, &timeout);
    int pr = poll(pfd, 2 + n, timeout);
    if (pr < 0 && errno != EINTR) return 1;
    if (pr < 0) continue;

    if (pfd[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
        /* SIGTERM etc. to PID 1 from inside are ignored by design; the shim
         * stops the sandbox with SIGKILL from outside. */
      }
      cmd_reap();
    }
    cmd_poll_handle(pfd + 2, n);

    if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(CHANNEL_FD, rbuf, sizeof rbuf);
      if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        /* The shim is gone; end the sandbox. */
        cmd_kill_all();
        return 0;
      }
      if (r > 0) {
        hutch_decoder_feed(&dec, rbuf, (size_t)r);
        struct hutch_frame_hdr h;
        const unsigned char *payload;
        hutch_err err = HUTCH_ERR_INIT;
        int pr2;
        while ((pr2 = hutch_decoder_pop(&dec, &h, &payload, &err)) == 1) {
          handle_frame(&h, payload);
          hutch_decoder_consume(&dec, &h);
        }
        if (pr2 < 0) {
          init_send_error(0, EPROTO, err.msg);
          cmd_kill_all();
          return 1;
        }
      }
    }
  }
}
