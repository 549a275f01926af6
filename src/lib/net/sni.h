/* The server name of a TLS ClientHello, for the transparent proxy (issue 8).
 *
 * hutch_sni_parse reads the first bytes a client sent on a connection (TLS
 * records carrying the handshake) and says what the gateway may rely on.
 * It is stateless: call it again with the whole buffer each time more bytes
 * arrive, until the result is not HUTCH_SNI_NEED_MORE.  The gateway never
 * needs to buffer more than HUTCH_SNI_INPUT_MAX bytes: beyond that the
 * result is MALFORMED, not NEED_MORE.
 *
 * Accepted: handshake records (type 22, version 3.x, 1..16384 bytes each)
 * that together carry exactly one ClientHello of at most
 * HUTCH_SNI_HELLO_MAX bytes, fragmented over any number of records, with
 * no other record type in between and nothing after it in its last record.
 * Refused (MALFORMED, with a reason): anything inconsistent in the records
 * or the ClientHello's structure, a duplicate extension, a server_name
 * extension with more than one entry, a name type other than host_name,
 * a name that is empty, an IP literal (RFC 6066 forbids them), or not a
 * valid host name (see net/addr.h: non-ASCII, NUL, numeric names, ...),
 * and encrypted_client_hello (0xfe0d) or its draft ancestor ESNI (0xffce):
 * with those the real name is hidden from the gateway.  Names come out
 * lowercase with a trailing dot stripped. */
#ifndef HUTCH_NET_SNI_H
#define HUTCH_NET_SNI_H

#include <stddef.h>
#include <stdint.h>

#include "net/addr.h"

#define HUTCH_SNI_HELLO_MAX 16384 /* the ClientHello body, bytes */
#define HUTCH_SNI_INPUT_MAX 20480 /* records and their headers, bytes */

enum hutch_sni_result {
  HUTCH_SNI_OK = 0,    /* host holds the name */
  HUTCH_SNI_NEED_MORE, /* consistent so far; read more and call again */
  HUTCH_SNI_NOT_TLS,   /* the first bytes are not a TLS handshake record */
  HUTCH_SNI_NONE,      /* a valid ClientHello without server_name */
  HUTCH_SNI_MALFORMED, /* refused: why says which rule */
};

struct hutch_sni {
  char host[HUTCH_NAME_MAX + 1]; /* OK only */
  const char *why;               /* MALFORMED (and NOT_TLS): a static message */
  size_t consumed;               /* OK and NONE: bytes of records that carried the ClientHello */
  uint16_t legacy_version;       /* OK and NONE: ClientHello.legacy_version */
};

enum hutch_sni_result hutch_sni_parse(const uint8_t *buf, size_t len, struct hutch_sni *out);
const char *hutch_sni_result_name(enum hutch_sni_result r);

#endif
