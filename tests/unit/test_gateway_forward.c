/* What hutch-gateway changes in forwarded HTTP (src/lib/gateway/forward.c):
 * the request head sent upstream, response heads, and the request body's
 * extent (Content-Length, strict chunked: every malformed form next to the
 * valid one, and every split of a valid body). */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/forward.h"
#include "net/http.h"
#include "tap.h"

static struct hutch_http_request req;
static char out[HUTCH_HTTP_HEAD_MAX + GW_HEAD_REWRITE_EXTRA];

static const char *rewrite(const char *head) {
  if (hutch_http_parse(head, strlen(head), &req) != HUTCH_HTTP_OK) return "(parse failed)";
  size_t n = gw_http_rewrite_request(&req, out, sizeof out - 1);
  out[n] = 0;
  return n ? out : "(did not fit)";
}

static void test_request(void) {
  is_str(rewrite("GET http://Example.com/a?b=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n"
                 "Proxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\nKeep-Alive: 5\r\n"
                 "Proxy-Authorization: Basic eA==\r\nTE: trailers\r\n\r\n"),
         "GET /a?b=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\nConnection: close\r\n\r\n",
         "absolute-form to origin-form, hop-by-hop fields dropped, Connection: close");
  is_str(rewrite("GET http://example.com HTTP/1.1\r\nHost: example.com\r\n\r\n"),
         "GET / HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n", "no path: /");
  is_str(rewrite("GET http://example.com?q HTTP/1.1\r\nHost: example.com\r\n\r\n"),
         "GET /?q HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n", "a query without a path");
  is_str(rewrite("GET https://example.com:8443/x HTTP/1.1\r\nHost: example.com:8443\r\n\r\n"),
         "GET /x HTTP/1.1\r\nHost: example.com:8443\r\nConnection: close\r\n\r\n", "https absolute-form");
  is_str(rewrite("GET http://example.com:8080/x HTTP/1.0\r\n\r\n"),
         "GET /x HTTP/1.0\r\nHost: example.com:8080\r\nConnection: close\r\n\r\n",
         "HTTP/1.0 without Host: Host from the target");
  is_str(rewrite("GET http://[2001:db8::1]/x HTTP/1.0\r\n\r\n"),
         "GET /x HTTP/1.0\r\nHost: [2001:db8::1]\r\nConnection: close\r\n\r\n", "IPv6 Host in brackets");
  is_str(rewrite("POST /up HTTP/1.1\r\nHost: a.com\r\nContent-Length: 3\r\n\r\n"),
         "POST /up HTTP/1.1\r\nHost: a.com\r\nContent-Length: 3\r\nConnection: close\r\n\r\n",
         "origin-form kept, framing kept");
  is_str(rewrite("\r\nGET / HTTP/1.1\r\nHost: a.com\r\n\r\n"), "GET / HTTP/1.1\r\nHost: a.com\r\nConnection: close\r\n\r\n",
         "a leading empty line is not forwarded");
  is_str(rewrite("CONNECT a.com:443 HTTP/1.1\r\nHost: a.com:443\r\n\r\n"), "(did not fit)", "CONNECT is never forwarded");
  hutch_http_parse("GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", 56, &req);
  ok(gw_http_rewrite_request(&req, out, 20) == 0, "no room: 0");
}

static void test_response(void) {
  size_t hl = 0;
  int status = 0;
  const char *why = NULL;
  const char *r = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\nhi";
  ok(gw_http_response_head(r, strlen(r), &hl, &status, &why) == 1 && status == 200 && hl == strlen(r) - 2,
     "a response head");
  for (size_t i = 0; i < hl; i++)
    if (gw_http_response_head(r, i, &hl, &status, &why) != 0) {
      ok(0, "prefix %zu needs more", i);
      break;
    }
  gw_http_response_head(r, strlen(r), &hl, &status, &why);
  char o[512];
  size_t n = gw_http_rewrite_response(r, hl, o, sizeof o - 1);
  o[n] = 0;
  is_str(o, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n", "Connection: close in the response");
  ok(gw_http_response_head("HTTP/1.1 100 Continue\r\n\r\n", 25, &hl, &status, &why) == 1 && status == 100, "100");
  ok(gw_http_response_head("HTTP/1.0 204\r\n\r\n", 16, &hl, &status, &why) == 1 && status == 204, "no reason phrase");
  ok(gw_http_response_head("HTTP/1.1 200 OK\nX: y\r\n\r\n", 24, &hl, &status, &why) < 0, "bare LF");
  ok(gw_http_response_head("HTTP/1.1 200 OK\r\nX: y\rZ\r\n\r\n", 27, &hl, &status, &why) < 0, "bare CR");
  ok(gw_http_response_head("HTTP/2 200 OK\r\n\r\n", 17, &hl, &status, &why) < 0, "HTTP/2 status line");
  ok(gw_http_response_head("HTTP/1.1 2000 OK\r\n\r\n", 20, &hl, &status, &why) < 0, "four-digit status");
  ok(gw_http_response_head("HTTP/1.1 099 OK\r\n\r\n", 19, &hl, &status, &why) < 0, "status below 100");
  ok(gw_http_response_head("HTTP/1.1 200 OK\r\n folded\r\n\r\n", 28, &hl, &status, &why) < 0, "obs-fold");
  ok(gw_http_response_head("HTTP/1.1 200 OK\r\nno colon\r\n\r\n", 29, &hl, &status, &why) < 0, "a line without ':'");
  ok(gw_http_response_head("HTTP/1.1 200 OK\r\nA\0: b\r\n\r\n", 25, &hl, &status, &why) < 0, "NUL");
  char *big = malloc(HUTCH_HTTP_HEAD_MAX + 10);
  memcpy(big, "HTTP/1.1 200 OK\r\n", 17);
  memset(big + 17, 'a', HUTCH_HTTP_HEAD_MAX - 7);
  ok(gw_http_response_head(big, HUTCH_HTTP_HEAD_MAX + 10, &hl, &status, &why) < 0, "a head over 16 KiB");
  free(big);
}

/* Feed the whole input in pieces of `step` bytes; the body's length, or -1. */
static long feed(const char *head, const char *in, size_t len, size_t step, bool *done) {
  struct gw_body b;
  hutch_http_parse(head, strlen(head), &req);
  gw_body_init(&b, &req);
  size_t taken = 0;
  for (size_t i = 0; i < len && !b.done; i += step) {
    size_t n = len - i < step ? len - i : step;
    ssize_t k = gw_body_feed(&b, (const uint8_t *)in + i, n);
    if (k < 0) return -1;
    taken += (size_t)k;
    if ((size_t)k < n && !b.done) return -2;
  }
  *done = b.done;
  return (long)taken;
}

static const char *CHUNKED = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";

static bool chunked_bad(const char *body) {
  bool done = false;
  return feed(CHUNKED, body, strlen(body), 1, &done) == -1 && feed(CHUNKED, body, strlen(body), 4096, &done) == -1;
}

static void test_body(void) {
  bool done = false;
  const char *cl = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n";
  ok(feed(cl, "helloGET / HTTP/1.1", 19, 19, &done) == 5 && done, "Content-Length: exactly 5, the rest is not body");
  ok(feed(cl, "hel", 3, 1, &done) == 3 && !done, "Content-Length: incomplete");
  ok(feed("GET / HTTP/1.1\r\nHost: a\r\n\r\n", "GET /", 5, 5, &done) == 0 && done, "no body");
  ok(feed("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", "x", 1, 1, &done) == 0 && done,
     "Content-Length 0");

  const char *good = "5\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n000\r\nX-T: 1\r\n\r\nGET / HTTP/1.1\r\n";
  size_t body_len = strlen(good) - strlen("GET / HTTP/1.1\r\n");
  bool all = true;
  for (size_t step = 1; step <= strlen(good); step++) {
    long n = feed(CHUNKED, good, strlen(good), step, &done);
    if (n != (long)body_len || !done) {
      printf("#   step %zu: %ld\n", step, n);
      all = false;
    }
  }
  ok(all, "chunked with a trailer, every split: the body ends where it ends");
  ok(feed(CHUNKED, "0\r\n\r\n", 5, 1, &done) == 5 && done, "the empty chunked body");
  ok(feed(CHUNKED, "5\r\nhel", 6, 1, &done) == 6 && !done, "incomplete");

  ok(chunked_bad("5;ext=1\r\nhello\r\n0\r\n\r\n"), "chunk extension");
  ok(chunked_bad("5 \r\nhello\r\n0\r\n\r\n"), "whitespace after the size");
  ok(chunked_bad(" 5\r\nhello\r\n0\r\n\r\n"), "whitespace before the size");
  ok(chunked_bad("0x5\r\nhello\r\n0\r\n\r\n"), "0x prefix");
  ok(chunked_bad("-5\r\nhello\r\n0\r\n\r\n"), "a sign");
  ok(chunked_bad("\r\nhello\r\n0\r\n\r\n"), "no digits");
  ok(chunked_bad("5\nhello\r\n0\r\n\r\n"), "bare LF after the size");
  ok(chunked_bad("5\rhello\r\n0\r\n\r\n"), "bare CR after the size");
  ok(chunked_bad("5\r\nhelloX\r\n0\r\n\r\n"), "data longer than the size");
  ok(chunked_bad("5\r\nhello\n0\r\n\r\n"), "bare LF after the data");
  ok(chunked_bad("10000000000000000\r\n"), "17 hex digits");
  ok(chunked_bad("FFFFFFFFFFFFFFFF\r\n"), "a size a signed 64-bit reader sees as -1");
  ok(chunked_bad("80000000\r\n"), "2^31: over GW_CHUNK_MAX");
  ok(feed(CHUNKED, "7fffffff\r\nab", 13, 1, &done) == 13 && !done, "2^31-1 is accepted");
  ok(chunked_bad("0\r\nX-T: 1\n\r\n"), "bare LF in a trailer");
  ok(chunked_bad("0\r\n: v\r\n\r\n"), "a trailer without a name");
  ok(chunked_bad("0\r\n X: v\r\n\r\n"), "a folded trailer");
  ok(chunked_bad("0\r\nX: \x01\r\n\r\n"), "a control character in a trailer");
  ok(chunked_bad("0\r\n\rX"), "the final CRLF broken");
  bool done2 = false;
  const char *lz = "000000000000000A\r\n0123456789\r\n0\r\n\r\n";
  ok(feed(CHUNKED, lz, strlen(lz), 3, &done2) == (long)strlen(lz) && done2,
     "16 hex digits with leading zeros");
  char many[2048] = "0\r\n";
  for (int i = 0; i < 33; i++) strcat(many, "X: 1\r\n");
  strcat(many, "\r\n");
  ok(chunked_bad(many), "33 trailer fields");
}

int main(void) {
  test_request();
  test_response();
  test_body();
  return done_testing();
}
