/* The local terminal; see tty.h. */
#include "tty.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

static struct termios saved;
static int saved_fd = -1;
static volatile sig_atomic_t is_raw;

int hutch_tty_raw(int fd, bool output_only) {
  struct termios t;
  if (!isatty(fd) || tcgetattr(fd, &t) < 0) return -1;
  static bool registered;
  saved = t;
  saved_fd = fd;
  if (!registered) {
    atexit(hutch_tty_restore);
    registered = true;
  }
  if (output_only) {
    t.c_oflag &= ~(tcflag_t)OPOST;
  } else {
    cfmakeraw(&t);
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
  }
  if (tcsetattr(fd, TCSANOW, &t) < 0) return -1;
  is_raw = 1;
  return 0;
}

void hutch_tty_restore(void) {
  if (!is_raw) return;
  is_raw = 0;
  tcsetattr(saved_fd, TCSANOW, &saved);
}

bool hutch_tty_size(unsigned *rows, unsigned *cols) {
  for (int fd = 0; fd <= 2; fd++) {
    struct winsize ws;
    if (isatty(fd) && ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
      *rows = ws.ws_row;
      *cols = ws.ws_col;
      return true;
    }
  }
  *rows = 24;
  *cols = 80;
  return false;
}
