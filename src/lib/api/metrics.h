/* Counters hutchd keeps for GET /metrics (api/metrics.c) that other modules
 * feed.  Thread-safe and cheap (one atomic add): call from any thread. */
#ifndef HUTCH_API_METRICS_H
#define HUTCH_API_METRICS_H

/* A command was started in a sandbox (hutch_commands_started_total). */
void hutch_metrics_command_started(void);

#endif
