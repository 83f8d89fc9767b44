"""The faults a study can put on its timeline, as plain data: each action names the scenario keys it takes, in
the order the Emulation method of the same name takes them (emulator.net.faults applies them). The scenario
checker and the schema read this table, so a new fault is one entry here plus its Emulation method (and a
checker in emulator.study.scenario for a new kind of argument)."""

from __future__ import annotations

from dataclasses import dataclass

# "link" is two node names, "switch" one, "plane" a plane number, "rate_fraction" a number in (0, 1], "direction"
# both, a_to_b or b_to_a (the scenario checker gives the default, both)
FAULTS: dict[str, tuple[str, ...]] = {
    "fail_link": ("link",),  # cut the link between two nodes
    "fail_switch": ("switch",),  # cut every link of a switch
    "fail_plane": ("plane",),  # freeze a plane's switch daemon (a hung chassis)
    "degrade_link": ("link", "rate_fraction", "direction"),  # slow a link down
    "restore": (),  # repair every link cut or degraded so far
}
ARGUMENTS = tuple(sorted({a for args in FAULTS.values() for a in args}))


@dataclass(frozen=True)
class Fault:
    """At `at_s` after traffic starts: fail_link (`link`), fail_switch (`switch`), fail_plane (`plane`),
    degrade_link (`link`, `rate_fraction`, `direction`) or restore."""

    at_s: float
    action: str
    link: tuple[str, str] | None
    switch: str | None
    plane: int | None = None
    rate_fraction: float | None = None
    direction: str | None = None

    def words(self) -> list[str]:
        """The action and its arguments as the run's events list them (and the Emulation method takes them)."""
        values = [getattr(self, a) for a in FAULTS[self.action]]
        return [self.action, *(str(w) for v in values for w in (v if isinstance(v, tuple) else (v,)))]
