"""The faults a study can put on its timeline: one entry each, naming the scenario keys it takes and the
Emulation method that does it. The scenario checker and the study's timeline read this table, so a new fault is
one entry here plus its method (and a checker in emulator.study.scenario for a new kind of argument)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from emulator.net.emulation import Emulation


@dataclass(frozen=True)
class FaultKind:
    """`args` are scenario keys in the method's order: "link" is two node names, "switch" one, "plane" a plane
    number, "rate_fraction" a number in (0, 1], "direction" both, a_to_b or b_to_a (the scenario checker
    gives the default, both)."""

    args: tuple[str, ...]
    method: Callable[..., None]


FAULTS: dict[str, FaultKind] = {
    "fail_link": FaultKind(("link",), Emulation.fail_link),  # cut the link between two nodes
    "fail_switch": FaultKind(("switch",), Emulation.fail_switch),  # cut every link of a switch
    "fail_plane": FaultKind(("plane",), Emulation.fail_plane),  # freeze a plane's switch daemon (a hung chassis)
    "degrade_link": FaultKind(("link", "rate_fraction", "direction"), Emulation.degrade_link),  # slow a link down
    "restore": FaultKind((), Emulation.restore),  # repair every link cut or degraded so far
}
ARGUMENTS = tuple(sorted({a for kind in FAULTS.values() for a in kind.args}))


def action(name: str, values: dict[str, str | int | float | tuple[str, ...]]) -> Callable[[Emulation], None]:
    """What the timeline calls on the running emulation, named as the run's events list it."""
    method = FAULTS[name].method
    words = [str(w) for a in FAULTS[name].args for w in (values[a] if isinstance(values[a], tuple) else (values[a],))]

    def act(emu: Emulation) -> None:
        method(emu, *words)
    act.__name__ = " ".join([name, *words])
    return act
