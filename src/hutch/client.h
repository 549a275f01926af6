/* HTTP client for hutchd's API (docs/api.md): libcurl over the unix socket
 * or TCP, JSON bodies via jansson, streamed bodies through callbacks.  One
 * client, one thread (hutch_client_dup gives another thread its own). */
#ifndef HUTCH_CLI_CLIENT_H
#define HUTCH_CLI_CLIENT_H

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/err.h"

/* Largest response body accepted, checked before the buffer grows.  The
 * CLI never raises exec's max_output_bytes (default 1 MiB per stream), so
 * an exec reply is at most ~2 x 6 MiB even when every byte is escaped as
 * \u00XX; a caller that asks for more output must raise this. */
#define HUTCH_CLIENT_MAX_RESPONSE (64u << 20)

typedef struct hutch_client {
  CURL *curl;
  char *base;   /* "http://hutch" over the socket, else the URL without a trailing '/' */
  char *socket; /* unix socket path; NULL over TCP */
  char *where;  /* the socket path or URL, for messages */
  char *auth;   /* "Authorization: Bearer ..." (TCP only), or NULL */
  /* When set and nonzero, a request in flight is abandoned within about a
   * second and fails with err->code "interrupted" (used by `hutch run` to
   * react to SIGINT/SIGTERM).  Written from a signal handler. */
  volatile sig_atomic_t *abort_flag;
} hutch_client;

typedef struct hutch_response {
  long status;
  char *body; /* NUL-terminated; never NULL after a successful request */
  size_t len;
  json_t *json; /* the body parsed as JSON (NULs allowed in strings), or NULL */
} hutch_response;

/* socket_path or url (exactly one non-NULL).  api_key is sent as a bearer
 * token over TCP only.  Returns -1 (err: usage-style message) for a URL
 * that is not http(s). */
int hutch_client_init(hutch_client *c, const char *socket_path, const char *url,
                      const char *api_key, hutch_err *err);
void hutch_client_free(hutch_client *c);
/* A second client for the same hutchd (its own connection), for another
 * thread.  abort_flag is not copied. */
int hutch_client_dup(const hutch_client *src, hutch_client *dst, hutch_err *err);

/* One request; `path` starts with '/' and is already escaped; `body` may be
 * NULL.  Returns 0 whenever an HTTP response arrived, whatever its status
 * (resp then owns body/json: free with hutch_response_free), or -1 on a
 * transport failure, with a message naming the socket or URL. */
int hutch_request(hutch_client *c, const char *method, const char *path, json_t *body,
                  hutch_response *resp, hutch_err *err);

/* Streamed bodies.  A sink receives a 2xx response body as it arrives (a
 * non-2xx body is kept in the response, bounded, for the error message); a
 * source produces the request body.  Both return -1 with err filled to stop
 * the transfer, which then fails with that error. */
typedef int (*hutch_sink_fn)(void *ctx, const char *data, size_t n, hutch_err *err);
/* Returns the bytes put into buf (at most n), 0 at the end, or -1. */
typedef ssize_t (*hutch_source_fn)(void *ctx, char *buf, size_t n, hutch_err *err);

typedef struct hutch_xfer {
  const char *method;
  const char *path; /* starts with '/', already escaped */
  /* At most one body: JSON, raw bytes, or a streamed source. */
  json_t *json;
  const void *data; /* raw body of len bytes (sent even when len is 0) */
  size_t len;
  bool raw;
  hutch_source_fn source; /* streamed body (PUT, or POST for snapshot import) */
  void *source_ctx;
  long long source_size;    /* -1: unknown, sent chunked */
  const char *content_type; /* raw/streamed body (default application/octet-stream) */
  hutch_sink_fn sink;       /* NULL: the body is buffered into the response */
  void *sink_ctx;
  const char *accept; /* default application/json */
} hutch_xfer;

/* Like hutch_request, for any of the bodies above.  With a sink, a 2xx
 * response has an empty body and no JSON in resp. */
int hutch_transfer(hutch_client *c, const hutch_xfer *x, hutch_response *resp, hutch_err *err);

/* For a non-2xx response: "<message> (HTTP <status>)", the message taken
 * from {"error":{"code","message"}} when the body has one.  Returns -1 and
 * fills err for non-2xx, 0 otherwise. */
int hutch_response_check(const hutch_response *resp, hutch_err *err);

void hutch_response_free(hutch_response *resp);

#endif
