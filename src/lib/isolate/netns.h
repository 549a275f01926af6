/* Network namespace setup from inside a fresh netns: loopback only. */
#ifndef HUTCH_NETNS_H
#define HUTCH_NETNS_H

#include "common/err.h"

int hutch_netns_loopback_up(hutch_err *err);

#endif
