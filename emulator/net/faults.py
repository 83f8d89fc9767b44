"""A study's faults (emulator.model.faults, plain data) applied to a running emulation: each action is the
Emulation method of the same name."""

from __future__ import annotations

from collections.abc import Callable

from emulator.model.faults import FAULTS, Fault
from emulator.net.emulation import Emulation


def action(fault: Fault) -> Callable[[Emulation], None]:
    """What the timeline calls on the running emulation, named as the run's events list it."""
    if fault.action not in FAULTS:
        raise ValueError(f"no fault {fault.action!r}")
    name, *args = fault.words()
    method = getattr(Emulation, name)

    def act(emu: Emulation) -> None:
        method(emu, *args)
    act.__name__ = " ".join([name, *args])
    return act
