/* The HTTP API: libmicrohttpd glue, routing, and one handler file per
 * resource (health.c, sandboxes.c, operations.c, keys.c).  See docs/api.md. */
#ifndef HUTCH_API_H
#define HUTCH_API_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "lifecycle/daemon.h"

struct MHD_Connection;

struct hutch_req {
  struct hutch_ctx *ctx;
  struct MHD_Connection *conn;
  const char *method;
  const char *path;
  const char *params[4]; /* path parameters captured by the router */
  const char *body;      /* NUL-terminated */
  size_t body_len;
  bool tcp;              /* arrived over TCP (API-key authenticated) */
};

struct hutch_resp {
  int status;
  json_t *json; /* owned; NULL for an empty body */
  const char *allow; /* Allow header for 405 */
};

typedef void (*hutch_handler)(struct hutch_req *req, struct hutch_resp *resp);

/* Fill resp with the error convention's body from err. */
void hutch_api_error(struct hutch_resp *resp, const hutch_err *err);
void hutch_api_errorf(struct hutch_resp *resp, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Query string value or NULL. */
const char *hutch_api_query(struct hutch_req *req, const char *key);
/* Every value of a repeated query key; returns the count (at most max). */
size_t hutch_api_query_all(struct hutch_req *req, const char *key, const char **out, size_t max);
/* ?wait=true|1 */
bool hutch_api_wait(struct hutch_req *req);
/* Parse the body as a JSON object (400 on anything else). */
json_t *hutch_api_body_object(struct hutch_req *req, hutch_err *err);

/* Handlers */
void hutch_h_health(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_create(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_delete(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_sandbox_exec(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_operation_get(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_key_create(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_key_list(struct hutch_req *req, struct hutch_resp *resp);
void hutch_h_key_delete(struct hutch_req *req, struct hutch_resp *resp);

/* Server */
struct hutch_server;
int hutch_server_start(struct hutch_ctx *ctx, struct hutch_server **out, hutch_err *err);
void hutch_server_stop(struct hutch_server *s);

#endif
