"""What the agents' hot path does on made-up clocks, as JSON: run with and without the compiled build
(tests/unit/test_hotpath.py), the two outputs must be the same to the nanosecond.

    python -m tests.unit.hotpath_trace DIR
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from pathlib import Path

from emulator.model import wire
from emulator.model.schedule import Message
from tests.unit.test_agent_pacing import LINE_NS, T0, _agent, _run
from tests.unit.test_transport import Fate, Pair, RecvConnection, _sender, simulate
from traffic import hotpath, rdma


def agent_trace(tmp: Path) -> list:
    """Five queue pairs to two peers, one over NVLink, sharing lanes under a window of 3 with no ACKs."""
    size = 7 * wire.payload_per_packet(9000)
    messages = [Message(q, q * 1e-5, "a", "bc"[q % 2], size, qp=q + 1) for q in range(5)]
    agent = _agent(tmp, messages, window=3, nvlink=True)
    wakes = _run(agent, T0 + 60 * LINE_NS)
    return [wakes, [(t, ip, p.dqpn, p.psn, n) for t, ip, p, n in agent.wire]]


def transport_trace() -> list:
    """Three queue pairs through a network that drops, delays and duplicates (seeded), ACKs coalesced in pairs."""
    rng = random.Random(7)
    pairs = {}
    for qp in (1, 2, 3):
        pairs[qp] = pair = Pair(_sender(window=8, cc="rtt" if qp == 2 else "none", qp=qp),
                                RecvConnection(ack_every=2))
        for i in range(3):
            pair.post(10 * qp + i, rng.randrange(1, 4000))
    fates = [Fate(drop=rng.random() < 0.1, copies=1 + (rng.random() < 0.05), extra_ns=rng.randrange(3_000_000))
             for _ in range(400)]
    sent: Counter = Counter()
    clock = simulate(pairs, fates, sent=sent)
    return [clock, dict(sent), {qp: [(d.msg_id, d.delivered_ns) for d in p.delivered] for qp, p in pairs.items()},
            {qp: dict(p.snd.stats) for qp, p in pairs.items()}]


if __name__ == "__main__":
    out = {"code": hotpath.loaded(rdma), "agent": agent_trace(Path(sys.argv[1])), "transport": transport_trace()}
    print(json.dumps(out))
