/* hutch-gateway's TLS: hutch's CA (created on first start), leaf
 * certificates minted per server name and cached, the server context that
 * terminates sandboxes' TLS and the client context that verifies upstream.
 *
 * The CA: EC P-256, 10 years, CN "hutch egress CA", ca.key (0600, PKCS#8
 * PEM) and ca.crt (PEM) in --ca-dir.  Leaves: one EC P-256 key made at
 * start (in memory only), a certificate per name (SAN DNS:name, serverAuth,
 * valid from an hour ago for 7 days), at most LEAF_CACHE of them, the
 * oldest replaced first and each re-minted after a day. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "gateway.h"

#define LEAF_CACHE 1024
#define LEAF_MAX_AGE_MS (24ull * 3600 * 1000)
#define LEAF_DAYS 7

static EVP_PKEY *ca_key, *leaf_key;
static X509 *ca_cert;
static SSL_CTX *server_ctx, *client_ctx;
static int app_idx = -1;

struct leaf {
  char name[HUTCH_NAME_MAX + 1];
  X509 *cert;
  uint64_t made;
};
static struct leaf leaves[LEAF_CACHE];
static size_t leaf_next;

static int ssl_fail(hutch_err *err, const char *what) {
  unsigned long e = ERR_get_error();
  char buf[256] = "unknown error";
  if (e) ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return hutch_err_sys(err, 0, "%s: %s", what, buf);
}

static int add_ext(X509 *cert, X509 *issuer, int nid, const char *value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, NULL, NULL, 0);
  X509_EXTENSION *ex = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
  if (!ex) return -1;
  int r = X509_add_ext(cert, ex, -1);
  X509_EXTENSION_free(ex);
  return r == 1 ? 0 : -1;
}

static int random_serial(X509 *x) {
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) return -1;
  b[0] &= 0x7f; /* positive */
  b[0] |= 0x01; /* and not zero */
  BIGNUM *bn = BN_bin2bn(b, sizeof b, NULL);
  if (!bn) return -1;
  ASN1_INTEGER *ai = BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(x));
  BN_free(bn);
  return ai ? 0 : -1;
}

/* ---- the CA ---- */

static int write_new_file(const char *path, const char *data, size_t n, mode_t mode, hutch_err *err) {
  cleanup_free char *tmp = xasprintf("%s.tmp", path);
  unlink(tmp);
  cleanup_close int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) return hutch_err_sys(err, errno, "create `%s`", tmp);
  if (write_full(fd, data, n) < 0 || fsync(fd) < 0) {
    int e = errno;
    unlink(tmp);
    return hutch_err_sys(err, e, "write `%s`", tmp);
  }
  if (rename(tmp, path) < 0) {
    int e = errno;
    unlink(tmp);
    return hutch_err_sys(err, e, "rename `%s`", tmp);
  }
  return 0;
}

static char *pem_of(int (*fn)(BIO *, void *), void *obj, size_t *n) {
  BIO *b = BIO_new(BIO_s_mem());
  if (!b) return NULL;
  char *out = NULL;
  if (fn(b, obj) == 1) {
    char *p;
    long len = BIO_get_mem_data(b, &p);
    if (len > 0) {
      out = xstrndup(p, (size_t)len);
      *n = (size_t)len;
    }
  }
  BIO_free(b);
  return out;
}

static int pem_key(BIO *b, void *k) { return PEM_write_bio_PrivateKey(b, k, NULL, NULL, 0, NULL, NULL); }
static int pem_cert(BIO *b, void *c) { return PEM_write_bio_X509(b, c); }

static int ca_create(const char *key_path, const char *crt_path, hutch_err *err) {
  EVP_PKEY *key = EVP_EC_gen("P-256");
  if (!key) return ssl_fail(err, "generate the CA key");
  X509 *x = X509_new();
  X509_NAME *nm = X509_NAME_new();
  int ok = x && nm && X509_set_version(x, 2) == 1 && random_serial(x) == 0 &&
           X509_gmtime_adj(X509_getm_notBefore(x), -3600) && X509_time_adj_ex(X509_getm_notAfter(x), 3650, 0, NULL) &&
           X509_NAME_add_entry_by_txt(nm, "O", MBSTRING_ASC, (const unsigned char *)"hutch", -1, -1, 0) == 1 &&
           X509_NAME_add_entry_by_txt(nm, "CN", MBSTRING_ASC, (const unsigned char *)"hutch egress CA", -1, -1, 0) == 1 &&
           X509_set_subject_name(x, nm) == 1 && X509_set_issuer_name(x, nm) == 1 && X509_set_pubkey(x, key) == 1 &&
           add_ext(x, x, NID_basic_constraints, "critical,CA:TRUE,pathlen:0") == 0 &&
           add_ext(x, x, NID_key_usage, "critical,keyCertSign,cRLSign") == 0 &&
           add_ext(x, x, NID_subject_key_identifier, "hash") == 0 && X509_sign(x, key, EVP_sha256()) > 0;
  X509_NAME_free(nm);
  if (!ok) {
    X509_free(x);
    EVP_PKEY_free(key);
    return ssl_fail(err, "make the CA certificate");
  }
  size_t kn = 0, cn = 0;
  cleanup_free char *kp = pem_of(pem_key, key, &kn);
  cleanup_free char *cp = pem_of(pem_cert, x, &cn);
  int r = -1;
  if (!kp || !cp)
    ssl_fail(err, "encode the CA");
  else if (write_new_file(key_path, kp, kn, 0600, err) == 0 && write_new_file(crt_path, cp, cn, 0644, err) == 0)
    r = 0;
  if (kp) OPENSSL_cleanse(kp, kn);
  if (r == 0) {
    ca_key = key;
    ca_cert = x;
    hutch_log(LOG_INFO, "ca.created", "cert", crt_path, NULL);
  } else {
    X509_free(x);
    EVP_PKEY_free(key);
  }
  return r;
}

static int ca_load(const char *key_path, const char *crt_path, hutch_err *err) {
  struct stat st;
  cleanup_close int kfd = open(key_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (kfd < 0) return hutch_err_sys(err, errno, "open `%s`", key_path);
  if (fstat(kfd, &st) < 0) return hutch_err_sys(err, errno, "stat `%s`", key_path);
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) || st.st_uid != geteuid())
    return hutch_err_sys(err, 0, "`%s` must be a regular file of ours with mode 0600", key_path);
  FILE *kf = fdopen(steal_fd(&kfd), "r");
  if (!kf) return hutch_err_sys(err, errno, "fdopen `%s`", key_path);
  ca_key = PEM_read_PrivateKey(kf, NULL, NULL, NULL);
  fclose(kf);
  if (!ca_key) return ssl_fail(err, "read the CA key");
  FILE *cf = fopen(crt_path, "re");
  if (!cf) return hutch_err_sys(err, errno, "open `%s`", crt_path);
  ca_cert = PEM_read_X509(cf, NULL, NULL, NULL);
  fclose(cf);
  if (!ca_cert) return ssl_fail(err, "read the CA certificate");
  if (X509_check_private_key(ca_cert, ca_key) != 1) return ssl_fail(err, "the CA key does not match ca.crt");
  return 0;
}

/* ---- leaves ---- */

static X509 *leaf_mint(const char *name) {
  X509 *x = X509_new();
  X509_NAME *nm = X509_NAME_new();
  char san[HUTCH_NAME_MAX + 8];
  snprintf(san, sizeof san, "DNS:%s", name);
  int ok = x && nm && X509_set_version(x, 2) == 1 && random_serial(x) == 0 &&
           X509_gmtime_adj(X509_getm_notBefore(x), -3600) &&
           X509_time_adj_ex(X509_getm_notAfter(x), LEAF_DAYS, 0, NULL) &&
           X509_NAME_add_entry_by_txt(nm, "O", MBSTRING_ASC, (const unsigned char *)"hutch egress", -1, -1, 0) == 1 &&
           (strlen(name) > 64 ||
            X509_NAME_add_entry_by_txt(nm, "CN", MBSTRING_ASC, (const unsigned char *)name, -1, -1, 0) == 1) &&
           X509_set_subject_name(x, nm) == 1 && X509_set_issuer_name(x, X509_get_subject_name(ca_cert)) == 1 &&
           X509_set_pubkey(x, leaf_key) == 1 && add_ext(x, ca_cert, NID_basic_constraints, "critical,CA:FALSE") == 0 &&
           add_ext(x, ca_cert, NID_key_usage, "critical,digitalSignature") == 0 &&
           add_ext(x, ca_cert, NID_ext_key_usage, "serverAuth") == 0 &&
           add_ext(x, ca_cert, NID_subject_alt_name, san) == 0 &&
           add_ext(x, ca_cert, NID_authority_key_identifier, "keyid") == 0 && X509_sign(x, ca_key, EVP_sha256()) > 0;
  X509_NAME_free(nm);
  if (!ok) {
    X509_free(x);
    return NULL;
  }
  return x;
}

static X509 *leaf_get(const char *name) {
  uint64_t now = gw_now();
  for (size_t i = 0; i < LEAF_CACHE; i++) {
    if (!leaves[i].cert || strcmp(leaves[i].name, name) != 0) continue;
    if (now - leaves[i].made < LEAF_MAX_AGE_MS) return leaves[i].cert;
    X509_free(leaves[i].cert);
    leaves[i].cert = NULL;
  }
  X509 *x = leaf_mint(name);
  if (!x) return NULL;
  struct leaf *l = &leaves[leaf_next];
  leaf_next = (leaf_next + 1) % LEAF_CACHE;
  X509_free(l->cert);
  snprintf(l->name, sizeof l->name, "%s", name);
  l->cert = x;
  l->made = now;
  return x;
}

/* ---- contexts ---- */

/* The ClientHello's name (and that of any later ClientHello: a
 * HelloRetryRequest makes the client send another) must be the one the
 * gateway checked. */
static int servername_cb(SSL *ssl, int *alert, void *arg) {
  const char *want = gw_tls_expected_name(SSL_get_ex_data(ssl, app_idx));
  const char *got = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  if (!want || !got || strcasecmp(want, got) != 0) {
    *alert = SSL_AD_UNRECOGNIZED_NAME;
    return SSL_TLSEXT_ERR_ALERT_FATAL;
  }
  return SSL_TLSEXT_ERR_OK;
}

/* HTTP/1.1 only (the gateway reads HTTP/1 requests inside). */
static int alpn_cb(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
                   unsigned int inlen, void *arg) {
  static const unsigned char h11[] = "\x08http/1.1";
  unsigned char *sel = NULL;
  if (SSL_select_next_proto(&sel, outlen, h11, sizeof h11 - 1, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

int gw_tls_init(const char *ca_dir, const char *upstream_ca, hutch_err *err) {
  if (mkdir_p(ca_dir, 0700, err) < 0) return hutch_err_wrap(err, "CA directory");
  cleanup_free char *kp = xasprintf("%s/ca.key", ca_dir);
  cleanup_free char *cp = xasprintf("%s/ca.crt", ca_dir);
  bool hk = access(kp, F_OK) == 0, hc = access(cp, F_OK) == 0;
  if (hk != hc)
    return hutch_err_sys(err, 0, "`%s` without `%s`: remove the one left to make a new CA", hk ? kp : cp, hk ? cp : kp);
  if ((hk ? ca_load(kp, cp, err) : ca_create(kp, cp, err)) < 0) return -1;
  leaf_key = EVP_EC_gen("P-256");
  if (!leaf_key) return ssl_fail(err, "generate the leaf key");

  app_idx = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
  server_ctx = SSL_CTX_new(TLS_server_method());
  if (!server_ctx) return ssl_fail(err, "server context");
  SSL_CTX_set_min_proto_version(server_ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(server_ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_TICKET | SSL_OP_NO_COMPRESSION |
                                      SSL_OP_CIPHER_SERVER_PREFERENCE);
  SSL_CTX_set_session_cache_mode(server_ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_tlsext_servername_callback(server_ctx, servername_cb);
  SSL_CTX_set_alpn_select_cb(server_ctx, alpn_cb, NULL);

  client_ctx = SSL_CTX_new(TLS_client_method());
  if (!client_ctx) return ssl_fail(err, "client context");
  SSL_CTX_set_min_proto_version(client_ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(client_ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
  SSL_CTX_set_verify(client_ctx, SSL_VERIFY_PEER, NULL);
  if (SSL_CTX_load_verify_locations(client_ctx, upstream_ca, NULL) != 1) {
    ssl_fail(err, "load the upstream CA bundle");
    return hutch_err_wrap(err, "`%s`", upstream_ca);
  }
  return 0;
}

static SSL *with_bios(SSL *ssl) {
  BIO *r = BIO_new(BIO_s_mem()), *w = BIO_new(BIO_s_mem());
  if (!r || !w) {
    BIO_free(r);
    BIO_free(w);
    SSL_free(ssl);
    return NULL;
  }
  BIO_set_mem_eof_return(r, -1);
  BIO_set_mem_eof_return(w, -1);
  SSL_set_bio(ssl, r, w);
  return ssl;
}

SSL *gw_tls_server(const char *name, void *app, hutch_err *err) {
  X509 *leaf = leaf_get(name);
  if (!leaf) {
    ssl_fail(err, "mint a certificate");
    return NULL;
  }
  SSL *ssl = SSL_new(server_ctx);
  if (!ssl || SSL_use_certificate(ssl, leaf) != 1 || SSL_use_PrivateKey(ssl, leaf_key) != 1 ||
      SSL_set_ex_data(ssl, app_idx, app) != 1) {
    SSL_free(ssl);
    ssl_fail(err, "server TLS");
    return NULL;
  }
  SSL_set_accept_state(ssl);
  return with_bios(ssl);
}

SSL *gw_tls_client(const char *name, hutch_err *err) {
  SSL *ssl = SSL_new(client_ctx);
  static const unsigned char h11[] = "\x08http/1.1";
  if (!ssl || SSL_set_tlsext_host_name(ssl, name) != 1 || SSL_set1_host(ssl, name) != 1 ||
      SSL_set_alpn_protos(ssl, h11, sizeof h11 - 1) != 0) {
    SSL_free(ssl);
    ssl_fail(err, "client TLS");
    return NULL;
  }
  SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  SSL_set_connect_state(ssl);
  return with_bios(ssl);
}
