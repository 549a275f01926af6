#include "isolate/netns.h"

#include <errno.h>
#include <net/if.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

int hutch_netns_loopback_up(hutch_err *err) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return hutch_err_sys(err, errno, "socket for loopback setup");
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  strcpy(ifr.ifr_name, "lo");
  int r = ioctl(s, SIOCGIFFLAGS, &ifr);
  if (r == 0) {
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    r = ioctl(s, SIOCSIFFLAGS, &ifr);
  }
  int e = errno;
  close(s);
  if (r < 0) return hutch_err_sys(err, e, "bring loopback up");
  return 0;
}
