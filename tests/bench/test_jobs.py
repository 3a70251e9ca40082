"""``bench jobs``: the job times computed from a measured run (waves of the concurrency, (n − 1) decode steps
per wave at the step time of its batch), checked against the recorded H100 run."""

import json
from pathlib import Path

import pytest

from oscarkv.bench.jobs import format_table, project

ROOT = Path(__file__).resolve().parents[2]


def test_project_waves_and_bound():
    run = dict(total_s=100.0, prefill_s=90.0, decode_s=10.0, decode_step_ms={3: 20.0, 2: 10.0})
    jobs = project(run, 3, 2.5, 32, (11, 101))
    assert jobs[0]["measured"] and jobs[0]["total_s"] == 100.0  # the run itself
    dec = 100 * (10 * 0.020 + 1 * 0.010)  # 10 waves of 3, one of 2
    assert jobs[1]["decode_s"] == pytest.approx(dec) and jobs[1]["total_s"] == pytest.approx(90.0 + dec)
    assert jobs[1]["bound_jobs_per_s"] == pytest.approx(32 / (32 * 2.5 + dec))


def test_recorded_run_reproduces():
    """The committed JSON's computed rows follow from its own measured run."""
    rows = json.loads((ROOT / "lab/bench_gpu/jobs_h100.json").read_text())["rows"]
    for r in rows:
        step = {int(b): ms for b, ms in r["run"]["decode_step_ms"].items()}
        got = project(dict(r["run"], decode_step_ms=step), r["concurrency"], r["ttft_s"], 32,
                      tuple(j["new_tokens"] for j in r["jobs"]))
        for a, b in zip(got, r["jobs"]):
            assert a["total_s"] == pytest.approx(b["total_s"]) and a["bound_jobs_per_s"] == pytest.approx(b["bound_jobs_per_s"])
    assert "| oscar | 21 | 8192 | computed |" in format_table(rows)


def test_a_method_alone_has_no_ratio():
    """A long BF16 job may run as separate commands (``--requests``), so a run without bf16 is allowed: its ×
    BF16 column is empty; an unknown method is still refused."""
    from oscarkv.bench.configs import JobsBench

    rows = [r for r in json.loads((ROOT / "lab/bench_gpu/jobs_h100.json").read_text())["rows"] if r["method"] == "oscar"]
    assert JobsBench(methods=("oscar",)).methods == ("oscar",)
    assert all(line.split("|")[9].strip() == "-" for line in format_table(rows).splitlines()[2:])
    with pytest.raises(ValueError, match="methods of"):
        JobsBench(methods=("bf16", "kivi"))


def test_one_chunk_for_every_method():
    """``--chunk``: every method prefills in that chunk (few sequences at once, where the per-method chunks sized
    for 26 only add steps); without it each its own; a chunk below 1 is refused, naming the field."""
    from oscarkv.bench.configs import JobsBench
    from oscarkv.cli.main import build_parser

    assert [JobsBench().chunk_of(m) for m in ("bf16", "oscar")] == [8192, 2048]
    args = build_parser().parse_args(["bench", "jobs", "--chunk", "8192", "--methods", "oscar"])
    assert args.chunk == 8192 and JobsBench(chunk=args.chunk).chunk_of("oscar") == 8192
    with pytest.raises(ValueError, match="JobsBench.chunk"):
        JobsBench(chunk=0)


def test_job_through_two_ranks():
    """``run_job`` on an engine whose BenchRunner wraps a tensor-parallel runner (two gloo ranks): the step kinds
    come from the launches the runner records (they once were asked of the runner, and the two-GPU job failed);
    a launch holding a prompt chunk is prefill, then one decode launch per step. The runner is the one the engine
    was built with, a declared Runner."""
    from dataclasses import replace

    from oscarkv.bench import e2e
    from oscarkv.bench.configs import JobsBench
    from oscarkv.bench.jobs import run_job
    from oscarkv.engine.runner import Runner
    from oscarkv.engine.workers import ParallelRunner
    from oscarkv.models.llama import PagedLM
    from tests.engine.conftest import engine_config, tiny_model

    cfg = replace(engine_config("bf16"), overlap=False, tensor_parallel_size=2)
    engine = e2e.bench_engine(PagedLM.from_hf(tiny_model()), cfg)
    runner = engine.runner
    try:
        assert isinstance(runner.inner, ParallelRunner) and isinstance(runner.inner, Runner) and isinstance(runner, Runner)
        run = run_job(engine, JobsBench(context=41, requests=2, new_tokens=(5,)))
        # 41 + 41 prompt tokens > the step budget of 80: the second prompt's chunk shares a launch with the first
        # request's first decode token, which makes that launch a prefill one
        assert [(x.decode, x.batch) for x in runner.launches] == [(False, 1), (False, 2), (True, 2), (True, 2),
                                                                   (True, 2), (True, 1)]
        assert run["decode_steps"] == {1: 1, 2: 3} and engine.runner is runner and engine.num_generated_tokens == 10
    finally:
        engine.close()
