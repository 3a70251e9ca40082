"""Paired comparison against the reference: pooled over haystacks, sample for sample, with the
cheapest configuration holding 95% picked per task group and context."""

from __future__ import annotations

import io
import json

import pytest

from oscarkv.eval import paired
from oscarkv.eval.report import REFERENCES, markdown, task_group
from oscarkv.eval.runner import Tally, records_from_log


def _rec(method, task, haystack, values, bpe, context=4096):
    return {"method": method, "task": task, "context": context, "haystack": haystack, "protocol": "free",
            "samples": len(values), "bpe": bpe, "accuracy": sum(values) / len(values), "values": values}


def test_pooled_share_and_paired_difference():
    acc = [_rec("bf16", "niah_single", "eval", [1, 1, 1, 0], 16.0), _rec("bf16", "niah_single", "gazetteer", [1, 1, 0, 0], 16.0),
           _rec("a", "niah_single", "eval", [1, 0, 1, 0], 4.0), _rec("a", "niah_single", "gazetteer", [1, 1, 0, 0], 5.0),
           _rec("b", "niah_single", "eval", [1, 1, 1, 0], 3.0), _rec("b", "niah_single", "gazetteer", [1, 1, 1, 0], 3.0)]
    rows = {p.method: p for p in paired.compare(acc, task_group, REFERENCES)}
    a, b = rows["a"], rows["b"]
    assert a.samples == 8 and a.accuracy == pytest.approx(4 / 8) and a.bpe == pytest.approx(4.5)
    assert a.share == pytest.approx(4 / 5) and a.diff == pytest.approx(-12.5)
    d = [0, -100, 0, 0, 0, 0, 0, 0]
    m = sum(d) / 8
    assert a.se == pytest.approx((sum((x - m) ** 2 for x in d) / 7 / 8) ** 0.5)
    assert b.share == pytest.approx(6 / 5) and rows["bf16"].reference and not b.reference
    best = paired.cheapest_holding(list(rows.values()))
    assert best[("single needle", 4096)].method == "b"  # a keeps only 80%


def test_unmatched_samples_are_not_paired():
    acc = [_rec("bf16", "niah_single", "eval", [1, 1, 1, 0], 16.0), _rec("a", "niah_single", "eval", [1, 0, 1], 4.0)]
    assert [p.method for p in paired.compare(acc, task_group, REFERENCES)] == ["bf16"]


def test_the_log_round_trip_keeps_the_sample_order_and_the_report_shows_the_section():
    log = io.StringIO()
    tally = Tally(log)
    for v_ref, v in ((1, 1), (1, 0), (0, 0), (1, 1)):
        tally.add(("fp32", "niah_multikey", 4096, "eval", "free"), v_ref, 32.0)
        tally.add(("oscar+win", "niah_multikey", 4096, "eval", "free"), v, 3.0)
    rebuilt = records_from_log(log.getvalue().splitlines())
    assert [r["values"] for r in rebuilt] == [[1, 1, 0, 1], [1, 0, 0, 1]] == [r["values"] for r in tally.records("accuracy")]
    text = markdown(rebuilt, [], {})
    assert "## Against the reference on the same samples" in text
    assert "| multi-needle mean | 4096 | oscar+win | 4 | 50.0 | 3.00 | 66.7% | -25.0 ± 25.0 |" in text
    json.dumps(rebuilt)  # results.json stays plain JSON
