"""Report writer: every file appears, tables hold every method and cell, plots are real PNGs."""

from __future__ import annotations

import json

import pytest

from oscarkv.eval.report import write_report

pytest.importorskip("matplotlib")

METHODS = ("bf16", "naive", "oscar", "oscar+win")
TASKS = ("niah_single", "vt")
CONTEXTS = (1024, 4096)


def fake_records() -> list[dict]:
    acc = [{"method": m, "task": t, "context": c, "samples": 4, "accuracy": (i + j) / 8,
            "bpe": 16.0 if m == "bf16" else 2.5, "kv_bytes": 123}
           for i, m in enumerate(METHODS) for j, t in enumerate(TASKS) for c in CONTEXTS]
    ppl = [{"method": m, "task": "ppl", "context": c, "samples": 2, "perplexity": 10.0 + i, "bpe": 2.5}
           for i, m in enumerate(METHODS) for c in CONTEXTS]
    return acc + ppl


def test_writes_all_files(tmp_path):
    records, meta = fake_records(), {"model": "tiny", "samples": 4, "seed": 0, "contexts": [1024, 4096],
                                     "configs": {"oscar": {"sink": 64}}}
    write_report(records, tmp_path / "run", meta)
    out = tmp_path / "run"
    data = json.loads((out / "results.json").read_text())
    assert data == {"meta": meta, "records": records}
    md = (out / "results.md").read_text()
    for m in METHODS:
        assert md.count(f"| {m} |") == 1 + len(CONTEXTS) + 1  # summary, each context, perplexity
    for t in TASKS:
        assert t in md
    assert "| BPE |" in md and "16.00" in md and "2.50" in md
    assert "| 12.5 |" in md  # naive on vt: (1 + 1) / 8 as a percentage
    assert "11.000" in md  # naive perplexity
    assert "- model: tiny" in md and "contexts: 1024, 4096" in md
    for name in ("accuracy.png", "perplexity.png"):
        blob = (out / name).read_bytes()
        assert blob.startswith(b"\x89PNG") and len(blob) > 5000


def test_accuracy_only_and_empty(tmp_path):
    acc = [r for r in fake_records() if "accuracy" in r]
    write_report(acc, tmp_path, {})
    assert (tmp_path / "accuracy.png").exists() and not (tmp_path / "perplexity.png").exists()
    assert "Perplexity" not in (tmp_path / "results.md").read_text()
    write_report([], tmp_path / "empty", {"model": "x"})
    assert "No records." in (tmp_path / "empty" / "results.md").read_text()


def test_missing_cells_are_dashes(tmp_path):
    acc = [r for r in fake_records() if "accuracy" in r and not (r["method"] == "naive" and r["task"] == "vt")]
    write_report(acc, tmp_path, {})
    md = (tmp_path / "results.md").read_text()
    assert "| naive | 12.5 | – |" in md


def test_records_rebuilt_from_the_sample_log(tmp_path):
    """An interrupted run's samples.jsonl gives the same means as the tally that wrote it."""
    import io

    from oscarkv.eval.runner import Tally, records_from_log

    log = io.StringIO()
    tally, ppl = Tally(log), Tally(log)
    for i, (m, v) in enumerate([("bf16", 1.0), ("oscar", 0.0), ("oscar", 1.0), ("bf16", 1.0)]):
        tally.add((m, "niah_single", 4096, "eval", "forced"), v, 2.5 if m == "oscar" else 16.0, 1000 + i,
                  answer_nll=0.5 * i, place="window" if i == 2 else "history")
    ppl.add(("oscar", "ppl", 1024, "eval", "faithful"), 2.0, 2.5)
    rebuilt = records_from_log(log.getvalue().splitlines())
    want = tally.records("accuracy") + ppl.records("perplexity")
    key = lambda r: (r["method"], r["task"])  # noqa: E731
    assert sorted(rebuilt, key=key) == sorted(want, key=key)
    assert {r["method"]: r["answer_nll"] for r in want if "answer_nll" in r} == {"bf16": 0.75, "oscar": 0.75}
    oscar = next(r for r in want if r["method"] == "oscar")
    assert oscar["window"] == {"samples": 1, "accuracy": 1.0} and oscar["history"] == {"samples": 1, "accuracy": 0.0}


def test_free_running_beside_teacher_forced(tmp_path):
    """Both protocols and both haystacks get their own sections; the comparison table pairs
    them per method, a configuration the engine did not run is labelled not served, and the
    needle-place table splits history from window; the Pareto plot is a real PNG."""
    recs = []
    for h in ("eval", "gazetteer"):
        for protocol, methods in (("free", ("bf16", "oscar+win")), ("forced", ("bf16", "oscar+win", "oscar"))):
            for m in methods:
                acc = {"bf16": 1.0, "oscar+win": 0.5 if protocol == "free" else 0.75, "oscar": 0.25}[m]
                recs.append({"method": m, "task": "niah_single", "context": 4096, "haystack": h, "protocol": protocol,
                             "samples": 4, "accuracy": acc, "bpe": 16.0 if m == "bf16" else 2.5,
                             "history": {"samples": 3, "accuracy": acc}, "window": {"samples": 1, "accuracy": 1.0}})
    write_report(recs, tmp_path, {"model": "tiny"})
    md = (tmp_path / "results.md").read_text()
    assert md.count("## Accuracy (%): free-running") == 2 and md.count("## Accuracy (%): teacher-forced") == 2
    assert "| oscar+win | 50.0 / 75.0 | 50.0 / 75.0 |" in md
    assert "| oscar | not served / 25.0 | not served / 25.0 |" in md
    assert "| free | oscar+win | 50.0 (3) · 100.0 (1) |" in md
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_pareto_groups_the_single_needle_apart_from_the_multi_needle_mean(tmp_path):
    from oscarkv.eval.report import _pareto_points, task_group

    recs = [{"method": "oscar+win", "task": t, "context": 4096, "haystack": "eval", "protocol": "free", "samples": 4,
             "accuracy": a, "bpe": 3.5} for t, a in (("niah_single", 1.0), ("niah_multikey", 0.5), ("niah_multivalue", 0.0))]
    assert [task_group(r["task"]) for r in recs] == ["single needle", "multi-needle mean", "multi-needle mean"]
    multi = [r for r in recs if task_group(r["task"]) == "multi-needle mean"]
    assert _pareto_points(multi) == [(3.5, 25.0, "oscar+win", True)]
    write_report(recs + [dict(recs[0], context=8192)], tmp_path, {"model": "tiny"})  # 8K multi unmeasured: blank
    assert (tmp_path / "pareto.png").read_bytes()[:4] == b"\x89PNG"


def test_plots_carry_device_date_and_command():
    """A plot read on its own says where, when and how it was made (the run's meta)."""
    from oscarkv.eval.report import plot_title

    meta = {"model": "/x/SmolLM2.gguf", "device": "NVIDIA H100", "date": "2026-11-27",
            "command": "oscarkv eval --contexts 4096"}
    assert plot_title(meta) == "SmolLM2.gguf\nNVIDIA H100 · 2026-11-27 · oscarkv eval --contexts 4096"
    assert plot_title({"model": "m"}) == "m"


def test_eval_meta_records_provenance(monkeypatch):
    import types

    import torch

    from oscarkv.eval.runner import provenance

    monkeypatch.setattr("sys.argv", ["/venv/bin/oscarkv", "eval", "--samples", "2"])
    got = provenance(types.SimpleNamespace(model=torch.nn.Linear(1, 1)))
    assert got["command"] == "oscarkv eval --samples 2" and got["device"].startswith("CPU (")
    assert len(got["date"]) == 10 and got["date"][4] == "-"
