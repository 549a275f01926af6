/* The local terminal for `hutch exec -t`: raw mode and its window size. */
#ifndef HUTCH_CLI_TTY_H
#define HUTCH_CLI_TTY_H

#include <stdbool.h>

/* Puts fd (a terminal) into raw mode, remembering its settings; returns -1
 * when fd is not a terminal.  With output_only, only output processing is
 * turned off (a remote PTY already sends "\r\n"; keys and Ctrl-C keep
 * working locally).  The settings are restored by hutch_tty_restore (also
 * registered with atexit). */
int hutch_tty_raw(int fd, bool output_only);
/* Restores the terminal if hutch_tty_raw changed it; async-signal-safe and
 * idempotent. */
void hutch_tty_restore(void);
/* The window size of the first of stdin, stdout, stderr that is a
 * terminal; false (and 24x80) when none is. */
bool hutch_tty_size(unsigned *rows, unsigned *cols);

#endif
