/* HTTP/1.x request heads for the gateway (src/lib/net/http.c): target
 * forms, Host, framing headers, the smuggling and fronting forms that must
 * be refused (each next to the legitimate form, accepted), incremental
 * input, limits, and hutch_http_names_agree. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "net/http.h"
#include "tap.h"

static struct hutch_http_request req;

static enum hutch_http_result parse(const char *s) { return hutch_http_parse(s, strlen(s), &req); }

/* The request is accepted and goes to `authority`. */
static bool goes(const char *s, const char *authority) {
  enum hutch_http_result r = parse(s);
  bool ok_ = r == HUTCH_HTTP_OK && !strcmp(req.authority, authority);
  if (!ok_) printf("#   result %d (%s), authority '%s', expected '%s'\n", r, req.why ? req.why : "-", req.authority, authority);
  return ok_;
}

/* The request is refused with a reason containing `why`. */
static bool refused(const char *s, const char *why) {
  enum hutch_http_result r = parse(s);
  bool ok_ = r == HUTCH_HTTP_BAD && req.why && strstr(req.why, why);
  if (!ok_) printf("#   result %d (%s), expected refusal: %s\n", r, req.why ? req.why : "-", why);
  return ok_;
}

static void test_forms(void) {
  ok(goes("GET /index.html?q=1 HTTP/1.1\r\nHost: Example.COM\r\nAccept: */*\r\n\r\n", "example.com:80"), "origin-form");
  ok(req.form == HUTCH_HTTP_ORIGIN && req.minor == 1 && !req.port_explicit && req.has_host_header, "its fields");
  ok(req.method_len == 3 && !memcmp(req.method, "GET", 3) && req.target_len == 15, "method and target");
  ok(req.n_fields == 2 && req.fields[1].value_len == 3 && !memcmp(req.fields[1].value, "*/*", 3), "fields");
  ok(req.head_len == strlen("GET /index.html?q=1 HTTP/1.1\r\nHost: Example.COM\r\nAccept: */*\r\n\r\n"), "head_len");
  ok(goes("GET / HTTP/1.1\r\nHost: example.com:8080\r\n\r\n", "example.com:8080") && req.port_explicit, "Host with a port");
  ok(goes("GET / HTTP/1.1\r\nHost: example.com.\r\n\r\n", "example.com:80"), "Host with a trailing dot");
  ok(goes("GET / HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n", "10.0.0.1:80") && req.host.kind == HUTCH_HOST_IP, "Host an IPv4 address");
  ok(goes("GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n", "[::1]:8080"), "Host an IPv6 address");
  ok(goes("GET / HTTP/1.0\r\nHost: example.com\r\n\r\n", "example.com:80") && req.minor == 0, "HTTP/1.0 with Host");
  ok(goes("GET http://example.com/a?b HTTP/1.1\r\nHost: example.com\r\n\r\n", "example.com:80") &&
         req.form == HUTCH_HTTP_ABSOLUTE,
     "absolute-form");
  ok(goes("GET HTTP://Example.com:8080 HTTP/1.1\r\nHost: example.com:8080\r\n\r\n", "example.com:8080"),
     "absolute-form, scheme in capitals, no path, a port");
  ok(goes("GET https://example.com/ HTTP/1.1\r\nHost: example.com:443\r\n\r\n", "example.com:443") && req.https,
     "absolute-form https; Host with the default port spelled out");
  ok(goes("GET http://example.com/ HTTP/1.0\r\n\r\n", "example.com:80"), "HTTP/1.0 absolute-form without Host");
  ok(goes("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", "example.com:443") && req.connect &&
         req.form == HUTCH_HTTP_AUTHORITY,
     "CONNECT");
  ok(goes("CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n", "[2001:db8::1]:443"),
     "CONNECT to an IPv6 address");
  ok(goes("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", "example.com:443"),
     "CONNECT with Host without a port (443 implied)");
  ok(goes("CONNECT example.com:443 HTTP/1.0\r\n\r\n", "example.com:443"), "HTTP/1.0 CONNECT without Host");
  ok(goes("\r\n\r\nGET / HTTP/1.1\r\nHost: a.com\r\n\r\n", "a.com:80") && req.head_len == 4 + strlen("GET / HTTP/1.1\r\nHost: a.com\r\n\r\n"),
     "empty lines before the request line are skipped");
  ok(goes("POST /x HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5\r\n\r\nhello", "a.com:80") && req.has_length &&
         req.content_length == 5 && req.head_len == strlen("POST /x HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5\r\n\r\n"),
     "Content-Length; the body is not part of the head");
  ok(goes("POST /x HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: chunked\r\n\r\n", "a.com:80") && req.chunked,
     "Transfer-Encoding: chunked");
  ok(goes("GET / HTTP/1.1\r\nhOsT:\t a.com \t\r\n\r\n", "a.com:80"), "header names any case, OWS around values");
  ok(goes("GET / HTTP/1.1\r\nHost: a.com\r\nX-Name: caf\xc3\xa9\r\n\r\n", "a.com:80"), "obs-text in another value");
  ok(goes("GET / HTTP/1.1\r\nHost: a.com\r\nUpgrade: h2c\r\n\r\n", "a.com:80") && req.upgrade, "Upgrade is reported");
  ok(goes("GET / HTTP/1.1\r\nHost: a.com\r\nX_Custom: 1\r\n\r\n", "a.com:80"), "underscores in other header names");
}

static void test_refusals(void) {
  /* Host */
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n", "duplicate Host"), "duplicate Host");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nhost: a.com\r\n\r\n", "duplicate Host"), "duplicate Host, same value");
  ok(refused("GET / HTTP/1.1\r\n\r\n", "without a Host"), "HTTP/1.1 without Host");
  ok(refused("GET / HTTP/1.0\r\n\r\n", "no Host header"), "HTTP/1.0 origin-form without Host");
  ok(refused("GET / HTTP/1.1\r\nHost:\r\n\r\n", "empty Host"), "empty Host");
  ok(refused("GET / HTTP/1.1\r\nHost: user@a.com\r\n\r\n", "userinfo"), "Host with userinfo");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com:80@b.com\r\n\r\n", "userinfo"), "Host with userinfo and port");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com b.com\r\n\r\n", "whitespace"), "Host with a space inside");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\tb.com\r\n\r\n", "whitespace"), "Host with a tab inside");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com:0\r\n\r\n", "invalid port"), "Host port 0");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com:65536\r\n\r\n", "invalid port"), "Host port 65536");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com:\r\n\r\n", "invalid port"), "Host with an empty port");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com:080\r\n\r\n", "invalid port"), "Host port with a leading zero");
  ok(refused("GET / HTTP/1.1\r\nHost: 127.1\r\n\r\n", "numeric name"), "Host 127.1");
  ok(refused("GET / HTTP/1.1\r\nHost: 0x7f.0.0.1\r\n\r\n", "numeric name"), "Host 0x7f.0.0.1");
  ok(refused("GET / HTTP/1.1\r\nHost: 2130706433\r\n\r\n", "numeric name"), "Host 2130706433");
  ok(refused("GET / HTTP/1.1\r\nHost: ::1\r\n\r\n", "without brackets"), "Host IPv6 without brackets");
  ok(refused("GET / HTTP/1.1\r\nHost: [127.0.0.1]\r\n\r\n", "brackets hold only"), "Host IPv4 in brackets");
  ok(refused("GET / HTTP/1.1\r\nHost: [fe80::1%25eth0]\r\n\r\n", "invalid"), "Host with an IPv6 zone");
  ok(refused("GET / HTTP/1.1\r\nHost: a%2ecom\r\n\r\n", "invalid character"), "percent-encoded Host");
  ok(refused("GET / HTTP/1.1\r\nHost: b\xc3\xbc" "cher.de\r\n\r\n", "IDNA"), "non-ASCII Host");
  ok(goes("GET / HTTP/1.1\r\nHost: a.com\r\nX-Forwarded-Host: b.com\r\n\r\n", "a.com:80"),
     "positive control: other headers naming hosts are not Host");
  /* absolute-form against Host */
  ok(refused("GET http://allowed.com/ HTTP/1.1\r\nHost: denied.com\r\n\r\n", "different hosts"),
     "absolute-form whose host differs from Host");
  ok(refused("GET http://allowed.com/ HTTP/1.1\r\nHost: allowed.com:8080\r\n\r\n", "different ports"),
     "absolute-form whose port differs from Host's");
  ok(refused("GET http://allowed.com:8080/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n", "different ports"),
     "absolute-form with a port, Host without");
  ok(refused("GET https://allowed.com/ HTTP/1.1\r\nHost: allowed.com:80\r\n\r\n", "different ports"),
     "https absolute-form, Host port 80");
  ok(refused("GET http://allowed.com/ HTTP/1.1\r\n\r\n", "without a Host"), "HTTP/1.1 absolute-form without Host");
  ok(refused("GET http://user@allowed.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n", "userinfo"), "userinfo in the target");
  ok(refused("GET http://allowed.com:80@denied.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n", "userinfo"),
     "userinfo that looks like host:port");
  ok(refused("GET http://allowed.com\\@denied.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n", "userinfo"),
     "backslash before @ (a WHATWG parser's path)");
  ok(refused("GET http://denied.com\\.allowed.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n", "invalid character"),
     "backslash in the host");
  ok(refused("GET http://denied.com#@allowed.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n", "fragment"), "fragment");
  ok(refused("GET http:///x HTTP/1.1\r\nHost: a.com\r\n\r\n", "without a host"), "absolute-form without a host");
  ok(refused("GET ftp://a.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n", "unsupported request target"), "ftp scheme");
  ok(refused("GET a.com/ HTTP/1.1\r\nHost: a.com\r\n\r\n", "unsupported request target"), "a target without scheme or /");
  ok(refused("OPTIONS * HTTP/1.1\r\nHost: a.com\r\n\r\n", "asterisk-form"), "asterisk-form");
  /* CONNECT */
  ok(refused("CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", "no port"), "CONNECT without a port");
  ok(refused("CONNECT example.com:0 HTTP/1.1\r\nHost: example.com:0\r\n\r\n", "invalid port"), "CONNECT port 0");
  ok(refused("CONNECT example.com:65536 HTTP/1.1\r\nHost: example.com\r\n\r\n", "invalid port"), "CONNECT port 65536");
  ok(refused("CONNECT example.com:99999999999 HTTP/1.1\r\nHost: example.com\r\n\r\n", "invalid port"),
     "CONNECT port that overflows");
  ok(refused("CONNECT example.com:-443 HTTP/1.1\r\nHost: example.com\r\n\r\n", "invalid port"), "CONNECT negative port");
  ok(refused("CONNECT example.com: HTTP/1.1\r\nHost: example.com\r\n\r\n", "invalid port"), "CONNECT empty port");
  ok(refused("CONNECT example.com:443 HTTP/1.1\r\nHost: other.com:443\r\n\r\n", "differs from the CONNECT target"),
     "CONNECT with a different Host");
  ok(refused("CONNECT example.com:8443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", "port differs"),
     "CONNECT with a different Host port");
  ok(refused("CONNECT example.com:443 HTTP/1.1\r\n\r\n", "without a Host"), "HTTP/1.1 CONNECT without Host");
  ok(refused("CONNECT user@example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", "userinfo"), "CONNECT with userinfo");
  ok(refused("CONNECT 2001:db8::1:443 HTTP/1.1\r\nHost: a.com\r\n\r\n", "without brackets"), "CONNECT IPv6 without brackets");
  ok(refused("CONNECT /path HTTP/1.1\r\nHost: a.com\r\n\r\n", "no port"), "CONNECT with origin-form");
  ok(refused("GET example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", "unsupported request target"),
     "authority-form without CONNECT");
  ok(refused("connect example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", "unsupported request target"),
     "lowercase connect is another method (methods are case-sensitive)");
  /* framing */
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "both"),
     "Content-Length with Transfer-Encoding");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", "both"),
     "Transfer-Encoding with Content-Length");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", "multiple Content-Length"),
     "two Content-Length headers (even equal)");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5, 5\r\n\r\n", "multiple Content-Length values"),
     "a Content-Length list");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: +5\r\n\r\n", "not a number"), "Content-Length +5");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 0x5\r\n\r\n", "not a number"), "Content-Length 0x5");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5 5\r\n\r\n", "not a number"), "Content-Length 5 5");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: \r\n\r\n", "empty Content-Length"), "empty Content-Length");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 1234567890123456789\r\n\r\n", "too large"),
     "a 19-digit Content-Length");
  ok(goes("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 123456789012345678\r\n\r\n", "a.com:80") &&
         req.content_length == 123456789012345678ull,
     "positive control: 18 digits");
  static const char *const te[] = {"Chunked", "chunked, chunked", "gzip, chunked", "chunked,", "identity", "chunked;x=1",
                                   "\"chunked\"", "chunked\x0b", "xchunked", ""};
  for (size_t i = 0; i < sizeof te / sizeof *te; i++) {
    char *s = xasprintf("POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: %s\r\n\r\n", te[i]);
    ok(parse(s) == HUTCH_HTTP_BAD, "Transfer-Encoding `%s` refused (%s)", te[i], req.why);
    free(s);
  }
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
             "multiple Transfer-Encoding"),
     "two Transfer-Encoding headers");
  ok(refused("POST / HTTP/1.0\r\nHost: a.com\r\nTransfer-Encoding: chunked\r\n\r\n", "HTTP/1.0"), "Transfer-Encoding in HTTP/1.0");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nContent_Length: 5\r\n\r\n", "look-alike"), "Content_Length");
  ok(refused("POST / HTTP/1.1\r\nHost: a.com\r\nTransfer_Encoding: chunked\r\n\r\n", "look-alike"), "Transfer_Encoding");
  ok(goes("POST / HTTP/1.1\r\nHost: a.com\r\nContent-Length: 5\r\n\r\n", "a.com:80"), "positive control: Content-Length");
  /* lines and bytes */
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nX-A: 1\r\n  folded\r\n\r\n", "obs-fold"), "obs-fold with spaces");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nX-A: 1\r\n\tfolded\r\n\r\n", "obs-fold"), "obs-fold with a tab");
  ok(refused("GET / HTTP/1.1\r\n Host: b.com\r\nHost: a.com\r\n\r\n", "obs-fold"), "a first header line that is folded");
  ok(refused("GET / HTTP/1.1\nHost: a.com\r\n\r\n", "bare LF"), "bare LF after the request line");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\n\r\n", "bare LF"), "bare LF after a header");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\n\n", "bare LF"), "bare LF as the empty line");
  ok(refused("\nGET / HTTP/1.1\r\nHost: a.com\r\n\r\n", "bare LF"), "a leading bare LF");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\rX-A: b\r\n\r\n", "bare CR"), "bare CR between headers");
  ok(refused("GET / HTTP/1.1\r\nX-A: a\rb\r\nHost: a.com\r\n\r\n", "bare CR"), "bare CR inside a value");
  ok(refused("GET / HTTP/1.1\r\r\nHost: a.com\r\n\r\n", "bare CR"), "CR CR LF");
  {
    static const char nul[] = "GET / HTTP/1.1\r\nHost: a.com\0.evil.com\r\n\r\n";
    ok(hutch_http_parse(nul, sizeof nul - 1, &req) == HUTCH_HTTP_BAD && strstr(req.why, "NUL"), "NUL in Host");
    static const char nul2[] = "GET /\0 HTTP/1.1\r\nHost: a.com\r\n\r\n";
    ok(hutch_http_parse(nul2, sizeof nul2 - 1, &req) == HUTCH_HTTP_BAD && strstr(req.why, "NUL"), "NUL in the target");
  }
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nX-A: a\x01" "b\r\n\r\n", "control character"), "control character in a value");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nX-A: a\x7f\r\n\r\n", "control character"), "DEL in a value");
  ok(refused("GET / HTTP/1.1\r\nHost : a.com\r\n\r\n", "invalid character in header name"), "space before the colon");
  ok(refused("GET / HTTP/1.1\r\nHo\"st: a.com\r\n\r\n", "invalid character in header name"), "quote in a header name");
  ok(refused("GET / HTTP/1.1\r\nX(A): b\r\nHost: a.com\r\n\r\n", "invalid character in header name"), "parenthesis");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\n: b\r\n\r\n", "empty header name"), "empty header name");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nNoColon\r\n\r\n", "without `:`"), "a header line without a colon");
  ok(refused("GET / HTTP/1.1\r\nHost: a.com\r\nX-\xc3\xa9: b\r\n\r\n", "invalid character in header name"),
     "non-ASCII header name");
  /* request line */
  ok(refused("GET  / HTTP/1.1\r\nHost: a.com\r\n\r\n", "empty request target"), "two spaces");
  ok(refused("GET / HTTP/1.1 \r\nHost: a.com\r\n\r\n", "unsupported HTTP version"), "trailing space");
  ok(refused("GET\t/ HTTP/1.1\r\nHost: a.com\r\n\r\n", "without a version"), "a tab as separator");
  ok(refused("GET / HTTP/2.0\r\nHost: a.com\r\n\r\n", "unsupported HTTP version"), "HTTP/2.0");
  ok(refused("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "unsupported HTTP version"), "the HTTP/2 preface");
  ok(refused("GET / http/1.1\r\nHost: a.com\r\n\r\n", "unsupported HTTP version"), "lowercase version");
  ok(refused("GET / HTTP/1.10\r\nHost: a.com\r\n\r\n", "unsupported HTTP version"), "HTTP/1.10");
  ok(refused("GET /\x80 HTTP/1.1\r\nHost: a.com\r\n\r\n", "invalid character in request target"), "non-ASCII target");
  ok(refused("GET /a#b HTTP/1.1\r\nHost: a.com\r\n\r\n", "fragment"), "fragment in origin-form");
  ok(refused("G(T / HTTP/1.1\r\nHost: a.com\r\n\r\n", "invalid character in method"), "method not a token");
  ok(refused(" GET / HTTP/1.1\r\nHost: a.com\r\n\r\n", "empty method"), "a leading space");
  ok(refused("GET\r\nHost: a.com\r\n\r\n", "without spaces"), "a request line without spaces");
  ok(refused("GET /\r\nHost: a.com\r\n\r\n", "without a version"), "HTTP/0.9");
}

static void test_incremental(void) {
  static const char full[] = "GET http://example.com/ HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n";
  size_t bad = 0;
  for (size_t n = 0; n < sizeof full - 1; n++)
    if (hutch_http_parse(full, n, &req) != HUTCH_HTTP_NEED_MORE) bad++;
  ok(bad == 0, "every proper prefix needs more bytes (%zu did not)", bad);
  ok(hutch_http_parse(full, sizeof full - 1, &req) == HUTCH_HTTP_OK, "the whole head parses");
  ok(hutch_http_parse("GET / HTTP/1.1\nHo", 18, &req) == HUTCH_HTTP_BAD, "a bare LF is refused before the head ends");
  ok(hutch_http_parse("GET / HTTP/1.1\r\nHost: a\0", 24, &req) == HUTCH_HTTP_BAD, "so is a NUL");
  ok(hutch_http_parse("GET / HTTP/1.1\r", 15, &req) == HUTCH_HTTP_NEED_MORE, "a CR at the end waits for its LF");

  /* limits */
  static char big[HUTCH_HTTP_HEAD_MAX + 4096];
  size_t n = (size_t)snprintf(big, sizeof big, "GET /");
  memset(big + n, 'a', HUTCH_HTTP_LINE_MAX - n - 9);
  n = HUTCH_HTTP_LINE_MAX - 9;
  n += (size_t)snprintf(big + n, sizeof big - n, " HTTP/1.1\r\nHost: a.com\r\n\r\n");
  ok(hutch_http_parse(big, n, &req) == HUTCH_HTTP_OK && req.target_len == HUTCH_HTTP_LINE_MAX - 13,
     "a request line of exactly %d bytes", HUTCH_HTTP_LINE_MAX);
  memmove(big + 5 + 1, big + 5, n - 5);
  big[5] = 'a';
  ok(hutch_http_parse(big, n + 1, &req) == HUTCH_HTTP_BAD && strstr(req.why, "request line too long"),
     "one byte more is refused");
  ok(hutch_http_parse(big, HUTCH_HTTP_LINE_MAX + 2, &req) == HUTCH_HTTP_BAD, "... as soon as it cannot end in time");
  ok(hutch_http_parse(big, HUTCH_HTTP_LINE_MAX, &req) == HUTCH_HTTP_NEED_MORE, "positive control: still in time");
  /* a head that never ends */
  n = (size_t)snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: a.com\r\n");
  while (n + 20 < sizeof big) n += (size_t)snprintf(big + n, sizeof big - n, "X-Pad: %010zu\r\n", n);
  ok(hutch_http_parse(big, HUTCH_HTTP_HEAD_MAX - 1, &req) == HUTCH_HTTP_NEED_MORE, "under 16 KiB: need more");
  ok(hutch_http_parse(big, n, &req) == HUTCH_HTTP_BAD && strstr(req.why, "larger than 16 KiB"), "16 KiB without an end: refused");
  /* too many fields */
  n = (size_t)snprintf(big, sizeof big, "GET / HTTP/1.1\r\nHost: a.com\r\n");
  for (int i = 1; i < HUTCH_HTTP_FIELDS_MAX; i++) n += (size_t)snprintf(big + n, sizeof big - n, "X-%d: 1\r\n", i);
  snprintf(big + n, sizeof big - n, "\r\n");
  ok(hutch_http_parse(big, n + 2, &req) == HUTCH_HTTP_OK && req.n_fields == HUTCH_HTTP_FIELDS_MAX, "%d fields",
     HUTCH_HTTP_FIELDS_MAX);
  snprintf(big + n, sizeof big - n, "X-Last: 1\r\n\r\n");
  ok(hutch_http_parse(big, strlen(big), &req) == HUTCH_HTTP_BAD && strstr(req.why, "too many"), "one more refused");
}

static void test_agree(void) {
  const char *why = NULL;
  ok(hutch_http_names_agree("example.com:443", "example.com", "example.com", &why), "all three the same");
  ok(hutch_http_names_agree("Example.COM.:443", "EXAMPLE.com", "example.com.:443", &why), "case, trailing dots, port");
  ok(hutch_http_names_agree("example.com:443", NULL, NULL, &why), "CONNECT alone");
  ok(hutch_http_names_agree(NULL, "example.com", "example.com:8443", &why), "SNI and Host (no CONNECT port to compare)");
  ok(hutch_http_names_agree("example.com:80", NULL, "example.com", &why), "Host without a port and CONNECT port 80");
  ok(hutch_http_names_agree("[2001:db8::1]:443", NULL, "[2001:DB8:0::1]", &why), "IPv6 literals compared canonically");
  ok(hutch_http_names_agree("10.0.0.1:443", NULL, "10.0.0.1:443", &why), "IPv4 literals");
  ok(!hutch_http_names_agree("allowed.com:443", "denied.com", NULL, &why) && strstr(why, "SNI differs"),
     "CONNECT allowed, SNI denied");
  ok(!hutch_http_names_agree(NULL, "allowed.com", "denied.com", &why) && strstr(why, "Host differs from SNI"),
     "SNI allowed, Host denied");
  ok(!hutch_http_names_agree("allowed.com:443", "allowed.com", "denied.com", &why) && strstr(why, "Host differs"),
     "CONNECT and SNI agree, Host does not");
  ok(!hutch_http_names_agree("allowed.com:443", NULL, "allowed.com:8443", &why) && strstr(why, "port"),
     "Host names another port");
  ok(!hutch_http_names_agree("allowed.com:8443", NULL, "allowed.com", &why) && strstr(why, "port"),
     "Host without a port means 80 or 443, not 8443");
  ok(!hutch_http_names_agree("allowed.com:443", "sub.allowed.com", NULL, &why), "a subdomain is another name");
  ok(!hutch_http_names_agree("allowed.com:443", "allowed.com.evil.net", NULL, &why), "so is a longer name");
  ok(!hutch_http_names_agree("127.0.0.1:443", NULL, "127.1", &why) && strstr(why, "invalid Host"),
     "an ambiguous numeric Host never agrees");
  ok(!hutch_http_names_agree("example.com", NULL, NULL, &why) && strstr(why, "invalid CONNECT"), "CONNECT needs a port");
  ok(!hutch_http_names_agree("example.com:443", "example.com:443", NULL, &why) && strstr(why, "invalid SNI"),
     "an SNI with a port is invalid");
  ok(!hutch_http_names_agree(NULL, "10.0.0.1", "10.0.0.1", &why) && strstr(why, "SNI is an IP"), "SNI an IP");
  ok(!hutch_http_names_agree("a.com:443", NULL, "user@a.com", &why), "Host with userinfo");
  ok(!hutch_http_names_agree("a.com:443", NULL, "a.com ", &why), "Host with trailing whitespace");
  ok(!hutch_http_names_agree(NULL, NULL, NULL, &why) && strstr(why, "no name"), "nothing to compare");
  ok(!hutch_http_names_agree("10.0.0.1:443", NULL, "[::ffff:10.0.0.1]:443", NULL),
     "an IPv4 address and its mapped form are written differently: no agreement");
}

int main(void) {
  test_forms();
  test_refusals();
  test_incremental();
  test_agree();
  return done_testing();
}
