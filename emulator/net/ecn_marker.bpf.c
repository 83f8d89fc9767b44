// SPDX-License-Identifier: GPL-2.0
/* ECN marking at a switch port's egress without RED (emulator/net/marking.py builds and attaches it). A tc
 * program cannot read a qdisc's backlog, and no hook runs when a qdisc releases a packet, so the program keeps
 * the port's queue itself: the port is an HTB class at a known rate with a burst, over a byte FIFO, so its
 * backlog less its unspent tokens falls at the rate (0 while the port is paused), down to minus the burst, and
 * rises by each packet queued.
 * The program runs at the port's clsact egress, before the packet is queued. A packet the FIFO is about to drop
 * (backlog + length > limit) is not counted, as the FIFO does not count it either. A packet arriving while the
 * backlog is at or above kmin is marked CE with a probability rising linearly from 0 to pmax at kmax, and always
 * from kmax on (kmin == kmax: DCTCP's step at K). On a lossless fabric a backlog passing xoff is reported once
 * on a ring buffer; the user space pauses the ports feeding this one and watches the backlog fall to xon.
 * A port that queues per traffic class (`classes`: HTB classes of equal rate and quantum, one per IP precedence)
 * keeps a backlog per class instead: what the port sends is shared equally among the classes holding packets and
 * not paused, as HTB's round robin shares it between busy classes (within two frames: HTB sends a class within its
 * guaranteed rate first), and the marks and the xoff report are the class's own (PFC pauses per priority).
 * The maps are pinned by name: the program on every port and the user space share them. A port is known by its
 * namespace's cookie (that of the switch daemon's socket that sent the packet) and its interface index, as
 * indexes repeat across namespaces. Kernels before 6.15 give tc programs no bpf_get_netns_cookie: built with
 * MPFT_NO_NETNS_COOKIE the cookie is 0, and the user space makes sure the ports' indexes do not repeat.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define TCLASSES 8

struct port {
    struct bpf_spin_lock lock;
    __u32 pmax;       /* probability at kmax, out of 2^32 - 1 */
    __s64 level;      /* bytes queued less tokens unspent, in [-burst, limit] */
    __u64 drained;    /* the port's drain (struct gate) when level was last brought up to date */
    __u64 burst;      /* its token bucket, bytes */
    __u64 limit;      /* the FIFO's limit, bytes */
    __u64 kmin;       /* marking starts at this backlog */
    __u64 kmax;       /* and is certain from this one */
    __u64 xoff;       /* lossless: a backlog above this asks for a pause (0: lossy) */
    __u32 classes;    /* 0: one FIFO (level); else a queue per traffic class (queued), level then only the tokens */
    __u32 pad;
    __u64 queued[TCLASSES];
};

/* How much the port has sent in all: `drained` bytes at `since`, and `rate` bytes per second from then on. The
 * user space alone changes the rate (a degraded link, a pause: 0) and folds the drain up to that moment in, so
 * the program's backlog stays exact across changes however far apart its packets come. */
struct gate {
    struct bpf_spin_lock lock;
    __u32 congested;  /* lossless: a bit per class (bit 0: the FIFO), set here above xoff, cleared by the user
                       * space once the backlog is at xon */
    __u64 drained;
    __u64 since;      /* ns, CLOCK_MONOTONIC */
    __u64 rate;
    __u32 paused;     /* a port queueing per class: a bit per class the user space holds paused */
    __u32 pad;
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

struct xoff_event {   /* a port's (class's) backlog passed xoff: the user space pauses the queues that feed it */
    __u32 slot;
    __u32 tclass;
    __u64 backlog;
    __u64 at;
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
    __type(value, struct gate);
    __uint(pinning, LIBBPF_PIN_BY_NAME);
} mpft_ecn_gate SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct counts);
    __uint(pinning, LIBBPF_PIN_BY_NAME);
} mpft_ecn_count SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 1 << 16);
    __uint(pinning, LIBBPF_PIN_BY_NAME);
} mpft_ecn_xoff SEC(".maps");

/* The user space's frames that only wake a paused port's qdisc (emulator/net/pause.py) carry this priority,
 * which HTB takes as the class that drops them: they are not queued, so not counted. On a port queueing per class
 * the user space sends one just before it pauses or resumes a class, so that what the port sent until then is
 * shared out as the classes were paused until then (however long before the port's next packet comes). */
#define KICK_PRIORITY 0x10002

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

/* A port queueing per class: `sent` bytes shared out among its classes that hold packets and are not paused, in
 * equal parts (a class with less than its part empties, and the rest is shared again among the others, up to
 * SHARES times: exact while at most SHARES classes hold packets at once); what no class took (the port ran dry,
 * or all it holds is paused) is returned, as unspent tokens. */
#define SHARES 3
static __always_inline __u64 share_out(struct port *p, __u32 paused, __u64 sent)
{
    /* Without branches (each one doubles what the verifier walks): queues stay far below 2^62 bytes, so a
     * difference's sign bit says which is less, and (q | -q) >> 63 whether q is not 0; dividing by 0 gives 0. */
#pragma unroll
    for (int round = 0; round < SHARES; round++) {
        __u64 open = 0;
#pragma unroll
        for (int c = 0; c < TCLASSES; c++)
            open += ((p->queued[c] | (0 - p->queued[c])) >> 63) & ~(paused >> c) & 1;
        __u64 part = sent / open;
#pragma unroll
        for (int c = 0; c < TCLASSES; c++) {
            __s64 less = (__s64)(p->queued[c] - part) >> 63;  /* all ones when the queue holds less than part */
            __u64 take = (part + ((p->queued[c] - part) & less)) & ~(0 - ((paused >> c) & 1));
            p->queued[c] -= take;
            sent -= take;
        }
    }
    return sent;
}

/* The port's drain up to `now`: rate x time in microseconds, split so the product stays within 64 bits. */
static __always_inline __u64 drain_at(struct gate *g, __u64 now)
{
    __u64 us = now > g->since ? (now - g->since) / 1000 : 0;
    return g->drained + (g->rate / 1000000) * us + (g->rate % 1000000) * us / 1000000;
}

#ifdef MPFT_NO_NETNS_COOKIE
#define NETNS_COOKIE(skb) 0
#else
#define NETNS_COOKIE(skb) bpf_get_netns_cookie(skb)
#endif

SEC("mpft/mark")
int mark(struct __sk_buff *skb)
{
    int kick = skb->priority == KICK_PRIORITY;
    struct intf key = {.netns = NETNS_COOKIE(skb), .ifindex = skb->ifindex};
    __u32 *slot = bpf_map_lookup_elem(&mpft_ecn_slot, &key);
    if (!slot)
        return TC_ACT_OK;
    struct port *p = bpf_map_lookup_elem(&mpft_ecn_port, slot);
    struct gate *g = bpf_map_lookup_elem(&mpft_ecn_gate, slot);
    struct counts *c = bpf_map_lookup_elem(&mpft_ecn_count, slot);
    if (!p || !g || !c)
        return TC_ACT_OK;
    __s64 len = skb->len;
    __u64 now = bpf_ktime_get_ns();
    __be16 word = ip_word0(skb);
    __u32 tclass = (bpf_ntohs(word) >> 5) & (TCLASSES - 1);  /* IP precedence, as the port's filters read it */
    __u32 chance = 0, draw = bpf_get_prandom_u32();
    __u64 peak = 0, backlog;
    int over = 0;

    bpf_spin_lock(&g->lock);
    __u64 drained = drain_at(g, now);
    __u32 paused = g->paused;
    bpf_spin_unlock(&g->lock);

    bpf_spin_lock(&p->lock);
    __u64 sent = drained > p->drained ? drained - p->drained : 0;
    __u64 most = (p->classes ? TCLASSES : 1) * p->limit + p->burst;
    if (sent > most)
        sent = most;  /* drains any queue; keeps the subtraction in range */
    if (p->classes)
        sent = share_out(p, paused, sent);  /* the rest, unspent, goes to the tokens */
    __s64 level = p->level - (__s64)sent;
    if (level < -(__s64)p->burst)
        level = -(__s64)p->burst;
    if (drained > p->drained)
        p->drained = drained;  /* another CPU may have come by with a later drain */
    if (kick) {
        p->level = level;
        bpf_spin_unlock(&p->lock);
        return TC_ACT_OK;
    }
    backlog = p->classes ? p->queued[tclass] : (level > 0 ? level : 0);
    int queued = backlog + len <= p->limit;  /* else the FIFO drops it */
    if (queued && p->classes) {
        __s64 spent = paused >> tclass & 1 || level >= 0 ? 0 : (-level < len ? -level : len);
        level += spent;  /* tokens send (part of) the packet at once */
        p->queued[tclass] += len - spent;
        peak = p->queued[tclass];
    } else if (queued) {
        level += len;
        peak = level > 0 ? level : 0;
    }
    if (queued) {
        if (backlog >= p->kmax)
            chance = 0xFFFFFFFF;
        else if (backlog >= p->kmin)
            chance = (__u32)(((__u64)p->pmax * (backlog - p->kmin)) / (p->kmax - p->kmin));
        over = p->xoff && peak > p->xoff;
    }
    p->level = level;
    bpf_spin_unlock(&p->lock);

    if (over) {  /* tell the user space once, until it finds the backlog back at xon */
        __u32 bit = 1U << (p->classes ? tclass : 0);
        bpf_spin_lock(&g->lock);
        over = !(g->congested & bit);
        g->congested |= bit;
        bpf_spin_unlock(&g->lock);
        if (over) {
            struct xoff_event e = {.slot = *slot, .tclass = p->classes ? tclass : 0, .backlog = peak, .at = now};
            bpf_ringbuf_output(&mpft_ecn_xoff, &e, sizeof(e), 0);
        }
    }
    if (queued)
        __sync_fetch_and_add(&c->seen, 1);
    if (peak > c->peak)
        c->peak = peak;  /* racy between CPUs, and only ever a little low */
    if (chance && word && draw <= chance && set_ce(skb, word))
        __sync_fetch_and_add(&c->marked, 1);
    return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
