// SPDX-License-Identifier: GPL-2.0
/* ECN marking at a switch port's egress without RED (emulator/net/marking.py builds and attaches it). A tc
 * program cannot read a qdisc's backlog, and no hook runs when a qdisc releases a packet, so the program keeps
 * the port's queue itself: the port is an HTB class at a known rate with a burst, over a byte FIFO, so its
 * backlog less its unspent tokens falls at the rate, down to minus the burst, and rises by each packet queued.
 * The program runs at the port's clsact egress, before the packet is queued. A packet the FIFO is about to drop
 * (backlog + length > limit) is not counted, as the FIFO does not count it either. A packet arriving while the
 * backlog is at or above kmin is marked CE with a probability rising linearly from 0 to pmax at kmax, and always
 * from kmax on (kmin == kmax: DCTCP's step at K). The maps are pinned by name: the program on every port and the
 * user space share them. A port is known by its namespace's cookie (that of the switch daemon's socket that sent
 * the packet) and its interface index, as indexes repeat across namespaces.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

struct port {
    struct bpf_spin_lock lock;
    __u32 pmax;       /* probability at kmax, out of 2^32 - 1 */
    __s64 level;      /* bytes queued less tokens unspent, in [-burst, limit] */
    __u64 updated;    /* when level was last brought up to date (ns, CLOCK_MONOTONIC) */
    __u64 rate;       /* the port's rate, bytes per second */
    __u64 burst;      /* its token bucket, bytes */
    __u64 limit;      /* the FIFO's limit, bytes */
    __u64 kmin;       /* marking starts at this backlog */
    __u64 kmax;       /* and is certain from this one */
};

struct counts {       /* apart from the port, which the user space rewrites when the rate changes */
    __u64 marked;     /* packets marked CE */
    __u64 seen;       /* packets counted into the queue */
    __u64 peak;       /* the deepest backlog seen */
};

struct intf {
    __u64 netns;      /* the namespace's cookie (SO_NETNS_COOKIE) */
    __u32 ifindex;
    __u32 pad;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, struct intf);
    __type(value, __u32);  /* the port's slot */
    __uint(pinning, LIBBPF_PIN_BY_NAME);
} mpft_ecn_slot SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct port);
    __uint(pinning, LIBBPF_PIN_BY_NAME);
} mpft_ecn_port SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct counts);
    __uint(pinning, LIBBPF_PIN_BY_NAME);
} mpft_ecn_count SEC(".maps");

#define IP_WORD0 ETH_HLEN       /* version, header length and TOS: the 16-bit word holding the ECN field */
#define IP_CHECK (ETH_HLEN + 10) /* the header checksum */

/* The first word of an IPv4 header (ECN in its low bits), or 0 for any other packet. The ethertype is read
 * from the frame: a switch daemon's packet socket leaves skb->protocol unset, which is also why the kernel's
 * bpf_skb_ecn_set_ce cannot be used here. */
static __always_inline __be16 ip_word0(struct __sk_buff *skb)
{
    __be16 proto, word;
    if (bpf_skb_load_bytes(skb, 12, &proto, 2) || proto != bpf_htons(ETH_P_IP) ||
        bpf_skb_load_bytes(skb, IP_WORD0, &word, 2))
        return 0;
    return word;
}

/* Set CE on an ECN-capable packet (ECT(0) or ECT(1)); whether it was set. */
static __always_inline int set_ce(struct __sk_buff *skb, __be16 word)
{
    __u8 ecn = bpf_ntohs(word) & 3;
    if (ecn != 1 && ecn != 2)
        return 0;
    __be16 marked = word | bpf_htons(3);
    return !bpf_l3_csum_replace(skb, IP_CHECK, word, marked, sizeof(marked)) &&
           !bpf_skb_store_bytes(skb, IP_WORD0, &marked, sizeof(marked), 0);
}

SEC("mpft/mark")
int mark(struct __sk_buff *skb)
{
    struct intf key = {.netns = bpf_get_netns_cookie(skb), .ifindex = skb->ifindex};
    __u32 *slot = bpf_map_lookup_elem(&mpft_ecn_slot, &key);
    if (!slot)
        return TC_ACT_OK;
    struct port *p = bpf_map_lookup_elem(&mpft_ecn_port, slot);
    struct counts *c = bpf_map_lookup_elem(&mpft_ecn_count, slot);
    if (!p || !c)
        return TC_ACT_OK;
    __s64 len = skb->len;
    __u64 now = bpf_ktime_get_ns();
    __be16 word = ip_word0(skb);
    __u32 chance = 0, draw = bpf_get_prandom_u32();
    __u64 peak = 0;

    bpf_spin_lock(&p->lock);
    __u64 elapsed_us = (now - p->updated) / 1000;
    if (elapsed_us > 1000000)
        elapsed_us = 1000000;  /* a second drains any queue here; keeps the product below 2^63 */
    __s64 level = p->level - (__s64)(elapsed_us * p->rate / 1000000);
    if (level < -(__s64)p->burst)
        level = -(__s64)p->burst;
    __u64 backlog = level > 0 ? level : 0;
    int queued = backlog + len <= p->limit;  /* else the FIFO drops it */
    if (queued) {
        level += len;
        peak = level > 0 ? level : 0;
        if (backlog >= p->kmax)
            chance = 0xFFFFFFFF;
        else if (backlog >= p->kmin)
            chance = (__u32)(((__u64)p->pmax * (backlog - p->kmin)) / (p->kmax - p->kmin));
    }
    p->level = level;
    p->updated = now;
    bpf_spin_unlock(&p->lock);

    if (queued)
        __sync_fetch_and_add(&c->seen, 1);
    if (peak > c->peak)
        c->peak = peak;  /* racy between CPUs, and only ever a little low */
    if (chance && word && draw <= chance && set_ce(skb, word))
        __sync_fetch_and_add(&c->marked, 1);
    return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
