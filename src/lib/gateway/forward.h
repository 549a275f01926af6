/* What hutch-gateway changes in the HTTP it forwards (issue 8).  Pure.
 *
 * One request per connection: the gateway forwards one request head
 * (rewritten here), exactly the body its framing announces (tracked by
 * gw_body), and the response, and then closes.  Bytes a client sends after
 * its request's body (a pipelined second request) are never forwarded: a
 * second request on the same upstream connection could name another Host
 * than the one checked.
 *
 * The request head sent upstream: the request line with the target in
 * origin-form ("/path?query"; absolute-form is rewritten), the client's
 * fields in their order minus the hop-by-hop ones (Connection,
 * Proxy-Connection, Keep-Alive, Proxy-Authorization, TE), the one Host
 * (added from the target when an HTTP/1.0 absolute-form request had none),
 * and "Connection: close".
 *
 * The response head sent back: the same treatment (minus Connection,
 * Keep-Alive, Proxy-Connection; plus "Connection: close"); 1xx interim
 * responses other than 101 pass unchanged. */
#ifndef HUTCH_GATEWAY_FORWARD_H
#define HUTCH_GATEWAY_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "net/http.h"

#define GW_HEAD_REWRITE_EXTRA 512 /* a rewritten head is at most this much longer */
#define GW_CHUNK_MAX 0x7fffffffu  /* the largest chunk accepted */

/* The head to send upstream for req (parsed from a buffer that is still
 * valid).  Returns its length, or 0 when it does not fit in cap. */
size_t gw_http_rewrite_request(const struct hutch_http_request *req, char *out, size_t cap);

/* A response head in buf[0..len): 1 complete (*head_len bytes through the
 * empty line, *status the code), 0 need more (only while len is below
 * HUTCH_HTTP_HEAD_MAX), -1 malformed (*why). */
int gw_http_response_head(const char *buf, size_t len, size_t *head_len, int *status, const char **why);
/* The complete head with the connection fields replaced by
 * "Connection: close"; its length, or 0 when it does not fit in cap. */
size_t gw_http_rewrite_response(const char *head, size_t head_len, char *out, size_t cap);

/* A request body's extent, from the framing the head announced. */
enum gw_body_kind { GW_BODY_NONE = 0, GW_BODY_LENGTH, GW_BODY_CHUNKED };

struct gw_body {
  enum gw_body_kind kind;
  bool done;
  uint64_t left;   /* LENGTH: bytes still to come; CHUNKED: of the current chunk's data */
  int st;          /* CHUNKED: parser state */
  unsigned digits; /* CHUNKED: hex digits of the size line so far */
  unsigned line;   /* CHUNKED: bytes of the current trailer line */
  unsigned trailers;
  const char *why; /* after -1 */
};

void gw_body_init(struct gw_body *b, const struct hutch_http_request *req);
/* How many of the n bytes at p belong to the body (the rest comes after
 * it, b->done is then set), or -1 when a chunked body is malformed.
 * Chunked is read strictly: 1 to 16 hex digits (leading zeros allowed), a
 * size of at most GW_CHUNK_MAX, no chunk extensions, no
 * whitespace, CRLF everywhere, trailer lines of printable ASCII (at most
 * 32 of at most 8 KiB). */
ssize_t gw_body_feed(struct gw_body *b, const uint8_t *p, size_t n);

#endif
