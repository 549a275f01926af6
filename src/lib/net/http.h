/* HTTP/1.x request heads as the egress gateway reads them (issue 8).
 *
 * hutch_http_parse reads one request head (request line, header fields,
 * empty line) from a bounded buffer and says where the request goes, or
 * refuses it with a reason.  It is stateless: call it again with the whole
 * buffer when more bytes arrive, until the result is not NEED_MORE.  The
 * gateway never needs more than HUTCH_HTTP_HEAD_MAX bytes.  The parser
 * borrows: every pointer in the result points into the caller's buffer.
 *
 * The rules are stricter than RFC 9112 wherever two reasonable readers of
 * the same bytes could disagree (a proxy that checks one thing while the
 * server acts on another is the bypass):
 *   - lines end in CRLF; a bare CR, a bare LF or a NUL anywhere is refused;
 *     empty lines (CRLF) before the request line are skipped;
 *   - request line: token SP target SP HTTP/1.0|HTTP/1.1, single spaces,
 *     at most HUTCH_HTTP_LINE_MAX bytes; the target printable ASCII
 *     without '#';
 *   - targets: origin-form "/path"; absolute-form "http://host[:port]/..."
 *     or "https://..." (no userinfo); authority-form "host:port" for CONNECT
 *     only, which needs it (a port 1..65535); asterisk-form is refused;
 *   - header names are tokens directly followed by ':'; a line starting
 *     with SP or HTAB (obs-fold) is refused; values may not hold control
 *     characters other than HTAB; at most HUTCH_HTTP_FIELDS_MAX fields;
 *   - Host: exactly one (required with HTTP/1.1, and with HTTP/1.0 unless
 *     the target names the host); no userinfo, no whitespace inside, a
 *     valid name (net/addr.h), IPv4 or [IPv6], optional port 1..65535;
 *     with an absolute-form or CONNECT target it must agree with the target
 *     (hutch_http_names_agree);
 *   - framing: Content-Length one header of digits only (no lists);
 *     Transfer-Encoding one header that is exactly "chunked", and not with
 *     HTTP/1.0; never both; header names that differ from Content-Length
 *     or Transfer-Encoding only by '_' for '-' are refused (CGI-style
 *     servers merge them). */
#ifndef HUTCH_NET_HTTP_H
#define HUTCH_NET_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/addr.h"

#define HUTCH_HTTP_HEAD_MAX 16384
#define HUTCH_HTTP_LINE_MAX 8192 /* the request line, without CRLF */
#define HUTCH_HTTP_FIELDS_MAX 100
#define HUTCH_AUTHORITY_MAX (HUTCH_NAME_MAX + 8) /* "name:65535" or "[v6]:65535" */

enum hutch_http_result { HUTCH_HTTP_OK = 0, HUTCH_HTTP_NEED_MORE, HUTCH_HTTP_BAD };
enum hutch_http_form { HUTCH_HTTP_ORIGIN = 1, HUTCH_HTTP_ABSOLUTE, HUTCH_HTTP_AUTHORITY };

struct hutch_http_field {
  const char *name, *value; /* value without surrounding whitespace */
  size_t name_len, value_len;
};

struct hutch_http_request {
  const char *method, *target;
  size_t method_len, target_len;
  enum hutch_http_form form;
  int minor;     /* HTTP/1.<minor>: 0 or 1 */
  bool connect;  /* method CONNECT */
  bool https;    /* absolute-form with the https scheme */
  size_t head_len; /* bytes through the empty line (with skipped leading CRLFs) */
  size_t n_fields;
  struct hutch_http_field fields[HUTCH_HTTP_FIELDS_MAX];
  /* Where the request goes: the target's authority (absolute-form,
   * CONNECT), else the Host header. */
  struct hutch_host host;
  uint16_t port;         /* explicit, or 80 (443 for https) */
  bool port_explicit;
  char authority[HUTCH_AUTHORITY_MAX + 1]; /* canonical "name:port" / "[v6]:port" */
  bool has_host_header;
  bool chunked;
  bool has_length;
  uint64_t content_length;
  bool upgrade;          /* an Upgrade header: after it the bytes may not be HTTP/1 (h2c) */
  const char *why;       /* BAD: a static message */
};

/* req is fully written (a few KiB: keep it off small stacks). */
enum hutch_http_result hutch_http_parse(const char *buf, size_t len, struct hutch_http_request *req);

/* An authority "host[:port]" (host a name, an IPv4 address or [IPv6]):
 * no userinfo, no whitespace, port 1..65535 without leading zeros, and
 * with need_port a port is required.  *port is 0 when absent.  0 or -1 with
 * *why. */
int hutch_http_authority(const char *s, size_t n, bool need_port, struct hutch_host *host, uint16_t *port,
                         const char **why);

/* Do the CONNECT target ("host:port"), the TLS SNI (a name) and the Host
 * header ("host[:port]") name the same destination?  Any of them may be
 * NULL (not seen); at least one must be given, and every one given must
 * parse.  Names compare after normalisation (case, one trailing dot; IP
 * addresses in canonical form).  Ports: a Host port must equal the CONNECT
 * port; a Host without a port agrees only with CONNECT port 80 or 443 (the
 * defaults it implies).  why (may be NULL) receives a static reason when
 * they do not agree. */
bool hutch_http_names_agree(const char *connect_host, const char *sni, const char *host_header, const char **why);

#endif
