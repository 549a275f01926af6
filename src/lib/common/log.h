/* Structured logging: one line per event on stderr, key=value pairs.
 *   ts=2026-11-30T05:40:00.123Z level=info event=sandbox.created id=sb_x dur_ms=8
 * Values containing spaces, quotes or '=' are double-quoted with escapes. */
#ifndef HUTCH_LOG_H
#define HUTCH_LOG_H

enum hutch_log_level { HUTCH_LOG_DEBUG, HUTCH_LOG_INFO, HUTCH_LOG_WARN, HUTCH_LOG_ERROR };

void hutch_log_set_level(enum hutch_log_level lvl);
void hutch_log_set_component(const char *name); /* adds comp=NAME to each line */

/* `kv` is a NULL-terminated list of alternating keys and values (const char *). */
void hutch_log_kv(enum hutch_log_level lvl, const char *event, const char *const *kv);

/* hutch_log(INFO, "sandbox.created", "id", id, "dur_ms", buf, NULL) */
void hutch_log(enum hutch_log_level lvl, const char *event, ...) __attribute__((sentinel));

#define LOG_DEBUG HUTCH_LOG_DEBUG
#define LOG_INFO HUTCH_LOG_INFO
#define LOG_WARN HUTCH_LOG_WARN
#define LOG_ERROR HUTCH_LOG_ERROR

#endif
