"""The study report from a synthetic run directory: the printed table, the HTML page and its plots.

Every number below is an invented fixture (2 variants x 2 seeds), not a measurement.
"""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest

from emulator.study.metrics import StudyMetrics
from emulator.study.report import format_table, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("completion.png", "messages_cdf.png", "links.png", "queues.png", "cpu.png")
SERIES_PLOTS = ("links.png", "queues.png", "cpu.png")
VARIANTS = ("ecmp", "spray")
SEEDS = (1, 2)


def _fidelity(cpu_bound: bool = False) -> dict:
    verdict = "CPU-BOUND: idle 3 %" if cpu_bound else "not CPU-bound (fixture)"
    return {"cpu_bound": cpu_bound, "rate_ratio": 0.97, "cpu_idle": 0.03 if cpu_bound else 0.35,
            "timer_lateness_us_p99": 900.0, "verdict": verdict}


def _run(variant: str, seed: int) -> dict:
    completion = 1.9 if variant == "ecmp" else 1.2
    return {"seed": seed, "dir": f"{variant}-seed{seed}", "completion_s": completion, "goodput_bps": 2.1e7,
            "lower_bound_s": 1.2, "lost_messages": 0, "ratio_to_bound": round(completion / 1.2, 2),
            "by_tag": {"dispatch": {"completion_s": 0.8}}, "fidelity": _fidelity()}


METRICS = {
    "scenario": "fixture-study",
    "question": "does <spray> beat ecmp & friends?",
    "seeds": list(SEEDS),
    "variants": {
        "ecmp": {"completion_s": 1.9, "goodput_bps": 2.1e7, "lower_bound_s": 1.2, "lost_messages": 0,
                 "ratio_to_bound": 1.58, "message_p99_s": 0.4, "out_of_order_fraction": 0.0, "retransmits": 3,
                 "range": {"completion_s": [1.7, 2.3], "ratio_to_bound": [1.4, 1.9]},
                 "runs": [_run("ecmp", s) for s in SEEDS]},
        "spray": {"completion_s": 1.2, "goodput_bps": 3.3e7, "lower_bound_s": 1.2, "lost_messages": 0,
                  "ratio_to_bound": 1.0, "message_p99_s": 0.25, "out_of_order_fraction": 0.1, "retransmits": 0,
                  "range": {"completion_s": [1.2, 1.3], "ratio_to_bound": [1.0, 1.08]},
                  "runs": [_run("spray", s) for s in SEEDS]},
    },
    "comparisons": {"ecmp/spray": {"median": 1.5, "range": [1.2, 1.9]}},
    "fidelity": _fidelity(),
}


def _write_messages(path: Path, completions: list[float | None]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "src", "dst", "bytes", "tag", "qp", "posted_s", "delivered_s", "acked_s", "retransmits",
                    "completion_s"])
        for i, c in enumerate(completions):
            w.writerow([i, "h0", "h1", 1000, "dispatch", 1, 0.0, "" if c is None else c, "", 0,
                        "" if c is None else c])


def _write_timeseries(path: Path) -> None:
    rows = []
    for step in range(4):
        t = step * 0.5
        for k in range(5):  # five interfaces, so the plot has to pick the top four
            rows.append([t, "link_util", f"s1-eth{k}", 0.1 * k + 0.05 * step])
            rows.append([t, "queue_bytes", f"s1-eth{k}", 1024 * k * step])
        rows += [[t, "cpu_idle", "machine", 0.5 - 0.1 * step], [t, "vswitchd_thread", "busiest", 0.2 * step]]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["t_s", "kind", "name", "value"])
        w.writerows(rows)


def _make_outdir(root: Path, metrics: dict = METRICS, timeseries: bool = True) -> Path:
    out = root / "out"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps(metrics))
    (out / "scenario.json").write_text(json.dumps({"name": metrics["scenario"], "seeds": list(SEEDS)}))
    for variant in VARIANTS:
        for seed in SEEDS:
            run = out / f"{variant}-seed{seed}"
            run.mkdir()
            scale = 1.0 if variant == "ecmp" else 0.6
            _write_messages(run / "messages.csv", [0.1 * scale, 0.2 * seed * scale, None])
            if timeseries:
                _write_timeseries(run / "timeseries.csv")
    return out


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str]:
    out = _make_outdir(tmp_path_factory.mktemp("report"))
    path = write_report(out)
    return out, path.read_text(encoding="utf-8")


def test_report_html_names_the_study_and_every_variant(report):
    out, page = report
    assert (out / "report.html").is_file()
    assert "<title>fixture-study</title>" in page
    for variant in VARIANTS:
        assert variant in page
        assert f'href="{variant}-seed1/"' in page
    assert 'class="banner good"' in page
    assert "not CPU-bound (fixture)" in page
    assert str(out) not in page  # images and links are relative
    # the answer under the question, before the tables
    assert page.index('class="question"') < page.index("spray finishes 1.50x sooner than ecmp") < \
        page.index("<h2>Variants</h2>")


def test_report_escapes_text(report):
    _, page = report
    assert "does &lt;spray&gt; beat ecmp &amp; friends?" in page
    assert "<spray>" not in page


@pytest.mark.parametrize("name", PLOTS)
def test_every_plot_is_a_png(report, name):
    out, page = report
    data = (out / name).read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > len(PNG_MAGIC)
    assert f'<img src="{name}"' in page


def test_cpu_bound_is_shouted(tmp_path):
    metrics = copy.deepcopy(METRICS)
    metrics["fidelity"] = _fidelity(cpu_bound=True)
    page = write_report(_make_outdir(tmp_path, metrics)).read_text()
    assert 'class="banner bad"' in page
    assert format_table(StudyMetrics.from_dict(metrics)).splitlines()[-1].startswith("CPU-BOUND")


def test_a_cpu_bound_run_is_shouted_even_if_the_summary_is_not():
    metrics = copy.deepcopy(METRICS)
    metrics["variants"]["spray"]["runs"][1]["fidelity"] = _fidelity(cpu_bound=True)
    assert format_table(StudyMetrics.from_dict(metrics)).splitlines()[-1] == \
        "CPU-BOUND in spray-seed2: results understate the fabric"


def test_no_fidelity_is_not_shown_as_good(tmp_path):
    metrics = copy.deepcopy(METRICS)
    del metrics["fidelity"]
    for v in metrics["variants"].values():
        for run in v["runs"]:
            run["fidelity"] = None
    page = write_report(_make_outdir(tmp_path, metrics)).read_text()
    assert 'class="banner unknown"' in page
    assert format_table(StudyMetrics.from_dict(metrics)).splitlines()[-1].startswith("fidelity unknown")


def test_missing_timeseries_skips_those_plots_and_says_so(tmp_path):
    out = _make_outdir(tmp_path, timeseries=False)
    (out / "links.png").write_bytes(PNG_MAGIC)  # a stale plot from an earlier report
    page = write_report(out).read_text()
    for name in SERIES_PLOTS:
        assert not (out / name).exists()
        assert f'src="{name}"' not in page
    assert page.count("not drawn") == len(SERIES_PLOTS)
    assert "timeseries.csv missing" in page
    assert (out / "completion.png").is_file() and (out / "messages_cdf.png").is_file()


def test_none_values_render_as_dash(tmp_path):
    metrics = copy.deepcopy(METRICS)
    ecmp = metrics["variants"]["ecmp"]
    ecmp.update(completion_s=None, ratio_to_bound=None, message_p99_s=None, lost_messages=3,
                range={"completion_s": [1.7, None], "ratio_to_bound": [None, None]})
    ecmp["runs"][0].update(completion_s=None, ratio_to_bound=None, lost_messages=3, fidelity=None)
    metrics["comparisons"]["ecmp/spray"] = {"median": None, "range": [None, None]}
    row = next(line for line in format_table(StudyMetrics.from_dict(metrics)).splitlines() if line.startswith("ecmp "))
    cells = row.split()
    assert cells[1:4] == ["-", "-", "1200.0"]  # completion, range, bound
    assert cells[4] == "-" and cells[6] == "3" and cells[7] == "-"
    assert "median -, range -" in format_table(StudyMetrics.from_dict(metrics))
    page = write_report(_make_outdir(tmp_path, metrics)).read_text()
    assert "<td>-</td>" in page
    assert (tmp_path / "out" / "completion.png").is_file()  # spray still has a ratio


def test_format_table_shows_the_metrics_numbers():
    answer, *lines = format_table(StudyMetrics.from_dict(METRICS)).splitlines()
    assert answer == "answer: spray finishes 1.50x sooner than ecmp (1.20-1.90 over seeds), at 1.00x its lower bound"
    assert lines[0].split()[0] == "variant"
    ecmp = lines[1].split()
    assert ecmp == ["ecmp", "1900.0", "1700.0..2300.0", "1200.0", "1.58", "21.00", "0", "400.0"]
    assert lines[2].split()[4] == "1.00"
    assert lines[3] == "ecmp/spray completion-time ratio: median 1.50, range 1.20..1.90 over seeds"
    assert lines[4] == "not CPU-bound (fixture)"
