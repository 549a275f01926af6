/* hutch-init internals shared by its source files.
 *
 *   main.c     the channel to hutch-shim (fd 3), the poll loop, dispatch
 *   command.c  commands: spawn (pipes or a PTY), stdin, output with or without
 *              flow control, timeouts, signals, exit reports
 *   files.c    file operations (FS_*), every path resolved with openat2
 *
 * Everything runs on the one thread of the poll loop; nothing here is
 * reentrant and nothing needs to be.
 */
#ifndef HUTCH_INIT_H
#define HUTCH_INIT_H

#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent/proto.h"

#define CHANNEL_FD 3

/* Write one frame to hutch-shim.  Blocks while the shim does not read (that
 * is the flow control of non-FLOW output); exits init if the shim is gone. */
void init_send(uint16_t type, uint32_t id, const void *p, size_t n);
/* ERROR frame with ERRNO and MESSAGE. */
void init_send_error(uint32_t id, int errnum, const char *msg);
uint64_t init_mono_ms(void);

/* The umask commands get (init's own is 0 so that file operations create
 * exactly the modes they are asked for). */
extern mode_t init_cmd_umask;

/* command.c */
#define MAX_COMMANDS 1024
#define CMD_POLLFDS 3 /* pollfd slots per command */
void cmd_spawn(uint32_t id, const unsigned char *payload, size_t len);
void cmd_stdin(uint32_t id, const unsigned char *p, size_t len);
void cmd_stdin_close(uint32_t id);
void cmd_signal(uint32_t id, const unsigned char *p, size_t len);
void cmd_credit(uint32_t id, const unsigned char *p, size_t len);
void cmd_resize(uint32_t id, const unsigned char *p, size_t len);
/* Reap every child (orphans included) after SIGCHLD. */
void cmd_reap(void);
/* Fill CMD_POLLFDS slots per command slot into pfd (MAX_COMMANDS *
 * CMD_POLLFDS entries); lowers *timeout_ms to the next deadline. */
size_t cmd_poll_fill(struct pollfd *pfd, int *timeout_ms);
/* Handle the events of the slots cmd_poll_fill filled, then timeouts and
 * exit reports. */
void cmd_poll_handle(const struct pollfd *pfd, size_t n);
/* The channel is gone: kill every command (and, as PID 1, everything). */
void cmd_kill_all(void);

/* files.c */
void fs_init(void);
void fs_handle(uint16_t type, uint32_t id, const unsigned char *p, size_t len);

#endif
