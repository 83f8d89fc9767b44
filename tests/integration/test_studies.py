"""Integration tier: every built-in study runs in --quick through `mpft run` on real fabrics, and its metrics
make sense: no message lost, no completion below the model's lower bound, the report and plots written."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time

import pytest

from emulator.model.records import from_dict
from emulator.net import features
from emulator.run.metrics import JobMetrics
from emulator.study import scenario
from emulator.study.metrics import StudyMetrics, slowdown
from tests.integration.helpers import REPO, leaks, snapshot
from tests.integration.metrics_keys import BASELINE, key_paths

pytestmark = pytest.mark.root
MPFT = [sys.executable, "-m", "emulator.cli"]
NOISE = 1.15  # run-to-run spread of one completion time on this shared 2-core machine (measured over seeds)
VOQ_MARGIN = 0.75  # the all-reduce beside the incast, per-class or per-queue-pair queues against one FIFO
PARITY_MARGIN = 0.97  # mpft / mpft-slow, paired per seed: two runs of one variant differ by up to 3 % here
COMPUTE_SPREAD = 0.2  # the all-to-all beside storage against alone (see _storage)


def _run_study(study: str, out) -> StudyMetrics:
    run = subprocess.run([*MPFT, "run", study, "--quick", "--out", str(out)], capture_output=True, text=True,
                         cwd=REPO, timeout=1200)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "report:" in run.stdout
    for name in ("report.html", "metrics.json", "scenario.json", "completion.png", "messages_cdf.png",
                 "links.png", "queues.png", "cpu.png"):
        assert (out / name).stat().st_size > 0, name
    raw = json.loads((out / "metrics.json").read_text())
    baseline = json.loads(BASELINE.read_text())[study]  # keys may be added, never dropped
    assert set(baseline) <= key_paths(raw), sorted(set(baseline) - key_paths(raw))[:10]
    metrics = StudyMetrics.from_dict(raw)
    with (out / "runs.csv").open() as f:  # one row per variant and seed, each naming its run's directory
        runs = list(csv.DictReader(f))
    assert sorted((r["variant"], r["dir"]) for r in runs) == sorted((name, run.dir) for name, run in metrics.runs())
    with (out / runs[0]["dir"] / "messages.csv").open() as f:
        first = next(csv.DictReader(f))
    assert (first["variant"], first["seed"]) == (runs[0]["variant"], runs[0]["seed"])
    return metrics


def _check_sanity(m: StudyMetrics) -> None:
    for name, v in m.variants.items():
        assert v.lost_messages == 0, name
        for run in v.runs:
            assert run.ratio_to_bound >= 0.95, (name, run)  # never faster than the model allows
            assert run.fidelity is not None and run.fidelity.verdict
    assert m.fidelity is not None and m.fidelity.verdict


def _done(m: StudyMetrics, variant: str, tag: str) -> float:
    """When a variant's `tag` traffic was done (median over seeds)."""
    done = m.variants[variant].by_tag[tag].completion_s
    assert done, (variant, tag)
    return done


# Each built-in study's answer, asserted on its --quick run with a margin beside the figure it was measured at
# (`sudo .venv/bin/python benchmarks/studies.py --quick`, benchmarks/RESULTS.md section studies-quick).
def _routing(m: StudyMetrics, out) -> None:
    """Spray and adaptive are not worse than ECMP on MoE + all-reduce, and beat it on large flows (measured in
    quick: ecmp, adaptive and static / spray 1.00, perm-ecmp / perm-spray 2.12 (2.00-2.84); NOISE is a
    completion's spread over seeds)."""
    v = m.variants
    assert len(m.seeds) >= 3
    for name in ("spray", "adaptive"):
        assert v[name].completion_s <= NOISE * v["ecmp"].completion_s, (name, m.comparisons)
    for name in ("perm-spray", "perm-adaptive"):  # large flows: ECMP's collisions cost, spraying has none
        assert v[name].completion_s <= NOISE * v["perm-ecmp"].completion_s, (name, m.comparisons)
    assert set(m.groups) == {"moe + ring-allreduce", "permutation"} and m.answer.startswith("on moe")


def _ordering(m: StudyMetrics, out) -> None:
    """The checker finds no flag before its data under psn, fence and release, and catches the unsafe mode."""
    v = m.variants
    assert all(v[name].ordering.violations == 0 for name in ("psn", "fence", "release"))
    assert v["unsafe"].ordering.violations > 0
    assert v["fence"].ordering.fence_wait_us_p99 > v["psn"].ordering.fence_wait_us_p99


def _failover(m: StudyMetrics, out) -> None:
    """Across a link cut, a switch failure and the repair: every message delivered exactly once, in order (the
    agents count duplicates and unexpected messages), and plane 1 kept going."""
    for v in m.variants.values():
        assert set(v.recovery_s) == {"0"} and v.plane_mbps["1"]["during"] > 0
        for run in v.runs:
            t = from_dict(JobMetrics, json.loads((out / run.dir / "traffic.json").read_text()))
            assert t.lost_messages == t.duplicate_or_unexpected == t.wrong_size == 0
            assert t.message_completion_s["count"] == t.messages_total
            assert [e["action"] for e in run.events] == ["fail_link p0l0 p0s0", "fail_switch p0s1", "restore"]


def _multiport(m: StudyMetrics, out) -> None:
    """One queue pair kept on one of two half-rate plane ports takes about twice as long as one sprayed."""
    assert m.comparisons["spray/fixed"].median < 0.7


def _cc(m: StudyMetrics, out) -> None:
    assert ("ecn" in m.skipped) != features.detect().ecn_marking  # run where switches can mark, else said why
    assert ("tcp-dctcp" in m.skipped) != ("dctcp" in features.detect().tcp_congestion)
    # pull's senders start with at most the queue over the fan-in (12 senders: one packet each) and the receiver
    # then grants at most one queue: nothing is resent and its standing queue is no longer than none's windows
    # (measured: p50 21-25 KiB against 32-34; both p99s are the run's start, where every sender begins at once)
    pull, none, rtt = m.variants["pull"], m.variants["none"], m.variants["rtt"]
    assert pull.lost_messages == 0 and pull.retransmits == 0
    assert pull.queue_p50_bytes <= none.queue_p50_bytes
    # at the study's MTU 1500 each sender sees the queue often enough for rtt to hold it well below none's windows
    # (measured: p50 6-9 KiB against 32-34; its p99, 37-39 KiB, is its start, as none's 35). The depths are read
    # between the link samples (20-41 backlogged reads a run): the link samples alone were 4 to 6 a run, and a
    # p99 that was their max said rtt held 13-27 KiB over 5 seeds, and 39 in one CI run. A read costs more on a busy
    # day (agent timers 15-20 ms late, p99): rtt's run, whose queue is often empty, had 7 and 10 in two suite runs
    # that evening and 14 alone (none's 14-16)
    assert "SPARSE FEEDBACK" not in m.fidelity.verdict
    assert all(run.queues["samples"] >= 5 for run in rtt.runs + none.runs)
    assert rtt.queue_p50_bytes < 0.5 * none.queue_p50_bytes


def _voq(m: StudyMetrics, out) -> None:
    """The all-reduce through the incast's port is done sooner with a queue per class or per queue pair than
    behind the incast in one FIFO (measured in quick: class / fifo 0.47, voq / fifo 0.49)."""
    ring = {name: _done(m, name, "ring-allreduce/allgather") for name in m.variants}
    for name in ("class", "voq"):
        assert ring[name] < VOQ_MARGIN * ring["fifo"], ring


def _parity(m: StudyMetrics, out) -> None:
    """The method sees a 10 % slower MPFT: slower in every seed (measured in quick: mpft / mpft-slow 0.92, 0.89 in
    an earlier run; at full length 0.90). mrft / mpft (1.08 in quick) is the paper issue's question, reported in
    the study's answer, not asserted here."""
    ratio = m.ratio("mpft", "mpft-slow")
    assert ratio is not None and ratio[2] < PARITY_MARGIN, m.comparisons  # the highest seed's ratio


def _storage(m: StudyMetrics, out) -> None:
    """Planes share no link: the all-to-all beside storage is done when it is alone, give or take what the
    storage plane's daemon and agents take from the same two cores (measured in quick: 0.99 and 1.00 on a faster
    machine, 1.054 beside a one-core busy loop; 1.02, 1.02, 1.07, 1.10 and 1.11 here on 2026-12-07, every run
    faithful, with or without the queue-depth reads between link samples; 1.165 in a suite run that evening), and
    storage reads beside
    the all-to-all when they are alone, give or take one least RTO: the storage leaf's queue drops reads in every
    variant (70-85 packets, 9-17 timeouts of 343 ms each), so
    one timeout more or less moves them (measured: 1.20 and 0.99 of alone, 261 ms later and 16 ms sooner)."""
    ratio = _done(m, "both", "moe/combine") / _done(m, "compute-only", "moe/combine")
    assert abs(ratio - 1) < COMPUTE_SPREAD, ratio
    beside, alone = _done(m, "both", "storage/read"), _done(m, "storage-only", "storage/read")
    rto_s = from_dict(JobMetrics, json.loads((out / m.variants["both"].runs[0].dir / "traffic.json").read_text())
                      ).transport.min_rto_ms / 1e3
    assert abs(beside - alone) < rto_s + COMPUTE_SPREAD * alone, (beside, alone, rto_s)


def _asymmetry(m: StudyMetrics, out) -> None:
    """With p0l0-p0s0 at a quarter from the start, the adaptive app's end-to-end weights beat ECMP on the
    permutation and spraying on the all-to-all (measured: 2.4x and 1.7x); the slowed link is in place before
    the first packet (the sanity check holds every run to the slowed fabric's LP bound)."""
    v = m.variants
    assert v["perm-adaptive"].completion_s * 1.3 < v["perm-ecmp"].completion_s
    assert v["a2a-adaptive"].completion_s < v["a2a-spray"].completion_s
    for run in v["perm-adaptive"].runs:
        assert [(e["action"], e["ran_at_s"]) for e in run.events] == [("degrade_link p0l0 p0s0 0.25 both", 0.0)]


def _lossless(m: StudyMetrics, out) -> None:
    """The lossy fabric drops and resends, the lossless ones pause instead and resend nothing; the pauses hold
    the victim flow behind the incast (head-of-line blocking), which endpoint congestion control avoids
    (measured in quick: the victim at 4.1x its lower bound alone under lossless, 1.2-1.3x under rtt and pull), and
    so do per-class pauses, the victim being in a class of its own."""
    v = m.variants
    assert v["lossy"].retransmits > 0 and not v["lossy"].pauses
    lossless = [name for name in ("lossless", "lossless-class", "lossless-dcqcn") if name in v]
    for name in lossless:
        assert v[name].retransmits == 0 and v[name].pauses > 0 and v[name].lost_messages == 0
    victim = {name: slowdown(x.by_tag["flow"]) for name, x in v.items()}
    assert victim["lossless"] > 2 * min(victim["rtt"], victim["pull"]), victim
    assert victim["lossless"] > 2 * victim["lossless-class"], victim
    assert m.focus == "flow" and m.answer.startswith("the flow traffic takes")


CHECKS = {"routing": _routing, "asymmetry": _asymmetry, "lossless": _lossless, "ordering": _ordering,
          "failover": _failover, "multiport": _multiport, "cc": _cc, "voq": _voq, "parity": _parity,
          "storage": _storage}


def test_every_builtin_study_has_a_check():
    assert set(CHECKS) == set(scenario.builtin_names())


@pytest.mark.parametrize("name", scenario.builtin_names())
def test_every_builtin_study_answers_its_question_on_a_quick_run(tmp_path, name):
    """A study whose answer fails its check while the verdict rejected one of its runs (CPU-BOUND or UNFAITHFUL:
    not the fabric's answer) is asked once more, and its second answer must hold (the storage study once met
    switch daemons that held packets 2.2 packet times, in a suite run, and its all-to-all took 1.35x alone)."""
    before = snapshot()
    m = _run_study(name, tmp_path)
    try:
        _check_sanity(m)
        CHECKS[name](m, tmp_path)
    except AssertionError:
        if not (m.fidelity.cpu_bound or m.fidelity.unfaithful):
            raise
        again = tmp_path / "again"
        m = _run_study(name, again)
        _check_sanity(m)
        CHECKS[name](m, again)
    assert leaks(before, snapshot()) == {}


BROKEN = """
[topology]
planes = 1
nodes = 4
leaves = 2
spines = 2
[[traffic]]
pattern = "permutation"
params = { size = 20000 }
[[variants]]
name = "fine"
app = "ecmp"
[[variants]]
name = "broken"
app = "broken.py"
"""


def test_a_study_that_fails_mid_way_says_so_in_one_line_and_leaves_nothing(tmp_path):
    (tmp_path / "broken.py").write_text("raise RuntimeError('this app is broken')\n")
    (tmp_path / "s.toml").write_text(BROKEN)
    before = snapshot()
    run = subprocess.run([*MPFT, "run", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert run.returncode == 2, run.stderr
    assert len(run.stderr.strip().splitlines()[-1:]) == 1 and "controller exited" in run.stderr
    assert (tmp_path / "out" / "fine-seed1" / "traffic.json").exists()  # the first variant ran
    # and what finished is kept: metrics, runs.csv and the report of that run, marked incomplete
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert list(metrics["variants"]) == ["fine"] and metrics["incomplete"].startswith("stopped after 1 of 2 runs")
    assert "incomplete study" in metrics["answer"]
    assert (tmp_path / "out" / "runs.csv").read_text().count("fine-seed1") == 1
    assert (tmp_path / "out" / "report.html").exists()
    assert leaks(before, snapshot()) == {}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_a_study_tears_it_down(tmp_path, sig):
    before = snapshot()
    proc = subprocess.Popen([*MPFT, "run", "routing", "--quick", "--out", str(tmp_path)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("*/agent.json")) and time.monotonic() < deadline:
        time.sleep(0.1)  # wait until agents are being started in the first run
    assert list(tmp_path.glob("*/agent.json"))
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert leaks(before, snapshot()) == {}, err[-2000:]
