"""Whether a run can be believed, from what it measured: a saturated machine, switch daemon or traffic process
(CPU-BOUND), or a fabric that did not do what the model says (UNFAITHFUL: a backlogged link below its rate,
packets lost where nothing counts or where the model has no queue). Such a run does not count toward an answer.
The thresholds and the one sentence every output uses live here; emulator.net.monitor measures.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

BUSY_THREAD = 0.90  # a forwarding thread above this share of one core is saturated
IDLE_FLOOR = 0.10   # a machine below this share free for the run (idle, or taken by lower-priority work) is saturated
LINK_FLOOR = 0.90   # a link whose median utilisation while backlogged is below this did not send at its rate
UNATTRIBUTED_CEILING = 0.001  # packets no counter explains, of those sent, above which a run is unfaithful
HIDDEN_CEILING = 1.0  # packet times a byte waits in the switch daemons' input on average (Little's law), above
# which the fabric queued where the model has no queue


class CpuFigures(Protocol):
    """What a CPU monitor measured (emulator.net.monitor.CpuReport)."""

    samples: int
    min_idle: float
    min_free: float  # idle plus what other work that yields to the run's processes took
    max_thread: float
    max_process: float

    def detail(self) -> str: ...


def cpu_bound(cpu: CpuFigures) -> bool:
    """A saturated machine, switch daemon or traffic process: any of them makes the results fiction. The machine
    is judged on what the run could have had: other work that yields to it does not saturate it."""
    return cpu.min_free < IDLE_FLOOR or cpu.max_thread > BUSY_THREAD or cpu.max_process > BUSY_THREAD


def cpu_verdict(run: str, cpu: CpuFigures, **known) -> str:
    """The verdict of one run a CPU monitor sampled (`known`: what else `verdict` takes)."""
    return verdict([run] if cpu_bound(cpu) else [], cpu.min_idle if cpu.samples else None, detail=cpu.detail(),
                   **known)


def unfaithful(worst_link: tuple[str, float] | None, unattributed: int | None, sent: int,
               unmodelled: int = 0, hidden: tuple[float, float] | None = None) -> list[str]:
    """Why a run that was not CPU-bound still did not emulate its fabric: a link that sent below LINK_FLOOR of its
    rate while backlogged (a faithful link with a queue sends at its rate), more than UNATTRIBUTED_CEILING of the
    packets lost where no counter says, or where the model has no queue (a switch daemon's input, a socket:
    emulator.net.ledger), or (`hidden`: LinkSampler.hidden_delay, and a packet time, in s) switch daemons whose
    input held bytes longer than HIDDEN_CEILING packet times on average: a daemon that falls behind delays packets
    where a real switch has no queue. Empty: faithful."""
    why = []
    if hidden is not None and hidden[0] > HIDDEN_CEILING * hidden[1]:
        why.append(f"the switch daemons' input held what they forwarded {hidden[0] * 1e3:.1f} ms on average, "
                   f"{hidden[0] / hidden[1]:.1f} packet times: queueing where the model has none")
    if worst_link is not None and worst_link[1] < LINK_FLOOR:
        why.append(f"{worst_link[0]} sent at {worst_link[1]:.0%} of its rate while backlogged (median)")
    if unattributed is not None and sent and unattributed > UNATTRIBUTED_CEILING * sent:
        why.append(f"{unattributed} of {sent} packets lost where no counter says ({unattributed / sent:.1%})")
    if sent and unmodelled > UNATTRIBUTED_CEILING * sent:
        why.append(f"{unmodelled} of {sent} packets lost where the model has no queue ({unmodelled / sent:.1%})")
    return why


def verdict(bound_in: Sequence[str], cpu_idle: float | None, *, cpu_bound: bool = False, links_sampled: bool = True,
            rate_ratio: float | None = None, timer_lateness_us_p99: float | None = None, detail: str = "",
            scope: str = "", unfaithful_in: Sequence[str] = ()) -> str:
    """The one fidelity sentence every output uses. It starts with CPU-BOUND when `cpu_bound` is set or
    `bound_in` names CPU-bound runs, else with UNFAITHFUL when `unfaithful_in` names runs (and why);
    `cpu_idle` None means the CPU was not sampled, and nothing else is known then; `rate_ratio` None with
    `links_sampled` means no link stayed backlogged."""
    if bound_in or cpu_bound:
        head = f"CPU-BOUND{' in ' + ', '.join(bound_in) if bound_in else ''}: results understate the fabric"
        if unfaithful_in:
            head += f"; UNFAITHFUL in {', '.join(unfaithful_in)}"
    elif unfaithful_in:
        head = f"UNFAITHFUL in {', '.join(unfaithful_in)}: results are not the fabric's"
    elif cpu_idle is None:
        return "CPU not sampled (run shorter than a second)"
    else:
        head = f"not CPU-bound{scope}"
    if cpu_idle is None:
        return head
    parts = [f"{head} ({detail or f'machine idle >= {cpu_idle:.0%}'})"]
    if links_sampled:
        parts.append("no link stayed backlogged" if rate_ratio is None else
                     f"backlogged links sent at >= {rate_ratio:.0%} of their rate")
    if timer_lateness_us_p99 is not None:
        parts.append(f"agent timers late <= {timer_lateness_us_p99 / 1e3:.1f} ms (p99)")
    return "; ".join(parts)
