"""Integration tier: switch egress queues per traffic class and per queue pair (the paper's virtual output
queues). The emulator builds and verifies them at bring-up; two senders into one receiver land in separate
queues of the receiver's leaf port, split by traffic class or by queue pair."""

from __future__ import annotations

import json
import subprocess

import pytest

from emulator.model import topologies
from emulator.model.schedule import Message
from emulator.net import shaping
from emulator.net.emulation import Emulation
from emulator.run.agents import transfer

pytestmark = pytest.mark.root
SIZE = 200_000


def _bytes_per_queue(intf: str) -> dict[str, int]:
    """Bytes each leaf queue under our HTB has sent, keyed by its parent class."""
    out = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", intf], capture_output=True, text=True,
                         check=True).stdout
    return {q["parent"]: q["bytes"] for q in json.loads(out) if q.get("parent", "").startswith("1:")}


@pytest.mark.parametrize("queueing", ["class", "voq"])
def test_two_senders_into_one_port_use_their_own_queues(tmp_path, queueing):
    fabric = topologies.build("mpft", planes=1, nodes=4, leaves=2, spines=2, queueing=queueing)
    messages = [Message(0, 0.0, "n0g0", "n2g0", SIZE, tclass=0, qp=1),
                Message(1, 0.0, "n1g0", "n2g0", SIZE, tclass=3, qp=2)]
    with Emulation(fabric, app="ecmp", quiet=True) as emu:
        port = fabric.intf(fabric.nic_on_plane("n2g0", 0), "n2g0")
        before = _bytes_per_queue(port)
        m = transfer(emu, messages, tmp_path, quiet=True)
        sent = {k: v - before.get(k, 0) for k, v in _bytes_per_queue(port).items()}
    assert m.lost_messages == 0
    first, second = ((shaping.CLASS_BASE, shaping.CLASS_BASE + 3) if queueing == "class"
                     else (shaping.VOQ_BASE + 1, shaping.VOQ_BASE + 2))
    for minor in (first, second):
        assert sent[f"1:{minor:x}"] > SIZE, sent  # each message through its own queue, headers included
    assert sum(sent.values()) < 2.2 * SIZE, sent  # and nothing else of size through the port
