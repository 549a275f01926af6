/* DNS messages for hutch-gateway (issue 8): the responder's strict query
 * parser and answer encoder, and the resolver's query encoder and answer
 * parser.  Pure: no I/O, no allocation, bounded input.
 *
 * Queries (what a sandbox sends) are read strictly: a 12-byte header with
 * QR clear, exactly one question, no answer or authority records, at most
 * one additional record and only an EDNS OPT pseudo-record there, QCLASS
 * IN, a name of at most 255 bytes on the wire in uncompressed labels
 * (compression has no business in a query's question, so there is no loop
 * to follow), and nothing after the last record.
 *
 * Answers (what the upstream resolver sends) are checked against the
 * question that was asked: the same ID, QR set, opcode QUERY, exactly one
 * question equal to ours (name compared case-insensitively, type, class
 * IN).  Compression pointers are followed only backwards, at most 64 times
 * per name, within a 255-byte name.  A records are taken for the asked
 * name and for the names a CNAME chain of at most 8 links leads to. */
#ifndef HUTCH_GATEWAY_DNS_H
#define HUTCH_GATEWAY_DNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GW_DNS_HDR 12
#define GW_DNS_UDP_MAX 512     /* what the responder sends over UDP (no EDNS answers) */
#define GW_DNS_QUERY_MAX 1024  /* the longest query the responder reads (UDP or TCP) */
#define GW_DNS_NAME_MAX 253    /* presentation form, without the trailing dot */
#define GW_DNS_MAX_ADDRS 16    /* A records kept from an answer */
#define GW_DNS_MAX_TTL 30      /* TTL the responder gives, seconds */

#define GW_DNS_TYPE_A 1
#define GW_DNS_TYPE_CNAME 5
#define GW_DNS_TYPE_AAAA 28
#define GW_DNS_TYPE_OPT 41
#define GW_DNS_CLASS_IN 1

enum gw_dns_rcode {
  GW_DNS_NOERROR = 0,
  GW_DNS_FORMERR = 1,
  GW_DNS_SERVFAIL = 2,
  GW_DNS_NXDOMAIN = 3,
  GW_DNS_NOTIMP = 4,
  GW_DNS_REFUSED = 5,
};

enum gw_dns_parse {
  GW_DNS_QUERY_OK = 0,  /* q is filled */
  GW_DNS_QUERY_DROP,    /* not worth an answer: shorter than a header, or a response (QR set) */
  GW_DNS_QUERY_FORMERR, /* answer FORMERR (q->id is set) */
  GW_DNS_QUERY_NOTIMP,  /* an opcode other than QUERY: answer NOTIMP (q->id is set) */
};

struct gw_dns_query {
  uint16_t id;
  bool rd;                      /* recursion desired, echoed */
  uint16_t qtype, qclass;
  /* The name in presentation form, lowercase, no trailing dot ("" for the
   * root).  name_ok is false when a label holds a byte outside letters,
   * digits, '-' and '_' (such a name is never allowed; the query is still
   * well-formed and gets REFUSED). */
  char name[GW_DNS_NAME_MAX + 2];
  bool name_ok;
  size_t qlen;                  /* bytes of the question on the wire (name, type, class) */
  const char *why;              /* FORMERR/NOTIMP/DROP: a static reason */
};

enum gw_dns_parse gw_dns_parse_query(const uint8_t *msg, size_t len, struct gw_dns_query *q);

/* The responder's answer to q: its ID, QR, RD echoed, RA set, the rcode,
 * the question echoed, and for NOERROR n A records (4 bytes each, network
 * order) with the given TTL (capped at GW_DNS_MAX_TTL), as many as fit in
 * `cap` (records that do not fit are left out; TC is never set).  For an
 * unreadable question (rcode FORMERR with q->qlen 0) the header alone.
 * Returns the length, or 0 when not even the header fits. */
size_t gw_dns_build_answer(const uint8_t *query, const struct gw_dns_query *q, int rcode, const uint8_t (*addrs)[4],
                           size_t n, uint32_t ttl, uint8_t *out, size_t cap);

/* The resolver's query: id, RD set, one question (name in presentation
 * form, validated by the caller, at most GW_DNS_NAME_MAX), no EDNS.
 * Returns the length or 0 if it does not fit or the name is bad. */
size_t gw_dns_build_query(uint16_t id, const char *name, uint16_t qtype, uint8_t *out, size_t cap);

struct gw_dns_result {
  int rcode;
  bool truncated;        /* TC: ask again over TCP */
  size_t n;              /* A records for the name (after CNAMEs), at most GW_DNS_MAX_ADDRS */
  uint8_t addr[GW_DNS_MAX_ADDRS][4];
  uint32_t ttl;          /* the smallest TTL of the records used (0 when n is 0) */
  const char *why;       /* -1: why the answer was refused */
};

/* Check an upstream answer against the question (id, name, qtype) and take
 * its A records.  0, or -1 with res->why (the answer must then be ignored:
 * a wrong ID or question is somebody else's packet or a spoofing attempt). */
int gw_dns_parse_answer(const uint8_t *msg, size_t len, uint16_t id, const char *name, uint16_t qtype,
                        struct gw_dns_result *res);

#endif
