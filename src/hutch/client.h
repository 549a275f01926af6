/* HTTP client for hutchd's API (docs/api.md): libcurl over the unix socket
 * or TCP, JSON bodies via jansson.  One client, one thread. */
#ifndef HUTCH_CLI_CLIENT_H
#define HUTCH_CLI_CLIENT_H

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

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

/* One request; `path` starts with '/' and is already escaped; `body` may be
 * NULL.  Returns 0 whenever an HTTP response arrived, whatever its status
 * (resp then owns body/json: free with hutch_response_free), or -1 on a
 * transport failure, with a message naming the socket or URL. */
int hutch_request(hutch_client *c, const char *method, const char *path, json_t *body,
                  hutch_response *resp, hutch_err *err);

/* For a non-2xx response: "<message> (HTTP <status>)", the message taken
 * from {"error":{"code","message"}} when the body has one.  Returns -1 and
 * fills err for non-2xx, 0 otherwise. */
int hutch_response_check(const hutch_response *resp, hutch_err *err);

void hutch_response_free(hutch_response *resp);

#endif
