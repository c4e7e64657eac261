/*
 * Two network namespaces joined by a veth pair, for tests that need two
 * hosts' networks on one machine (iproute2 does the setup).  Names carry the
 * creating process's pid, so parallel runs do not collide and what a crashed
 * run left behind (its pid is gone) is removed by the next one.
 */
#ifndef FERRY_TEST_NETNS_PAIR_H
#define FERRY_TEST_NETNS_PAIR_H

#include <stddef.h>
#include <stdint.h>

#define NETNS_PAIR_PREFIX "ferrytest-" /* namespaces: ferrytest-<pid>-a, -b */
#define NETNS_VETH_PREFIX "fty"        /* veth ends: fty<pid>a, fty<pid>b */

typedef struct netns_pair {
    char ns[2][40];      /* namespace names (/run/netns/<name>) */
    char ifname[2][16];  /* veth end in ns[i] (at most 15 characters) */
    char ip[2][16];      /* its IPv4 address, on one /30 */
    int root_net;        /* namespaces of the creator: `ip` always runs there */
    int root_mnt;
    int made;            /* namespaces created (ns[0] first) */
} netns_pair_t;

enum {
    NETNS_OK = 0,
    NETNS_UNAVAILABLE = 1, /* not on this machine (why says so): skip */
    NETNS_FAILED = -1,     /* a step after the namespaces existed failed */
};

/* Remove stale pairs of dead creators, then make one: lo and the veth up
 * in each namespace, each end addressed.  Anything but NETNS_OK leaves
 * nothing behind and puts the reason in why.  Call it from the machine's
 * own namespaces. */
int netns_pair_create(netns_pair_t *pair, char *why, size_t why_len);
/* Remove the veth and both namespaces (each bounded); safe to call twice. */
void netns_pair_destroy(netns_pair_t *pair);

/* Join namespace `name` as `ip netns exec` does: its network for this
 * thread (and threads it starts), a private mount namespace with a sysfs of
 * that network on /sys (UCX finds network devices in /sys/class/net).
 * 0, or -1 with errno set. */
int netns_enter(const char *name);

/* Bytes received and sent by interface ifname of namespace ns, from that
 * namespace's /proc/net/dev (read by a thread that joins it, so the caller
 * may be anywhere).  0, or -1. */
int netns_link_bytes(const char *ns, const char *ifname, uint64_t *rx_p, uint64_t *tx_p);

#endif
