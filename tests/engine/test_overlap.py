"""Overlap (``EngineConfig.overlap``): a decode step launched before the previous step's tokens
reach the host gives the outputs of an engine without overlap — tokens, log-probabilities and
finish reasons — when requests stop early (stop tokens, ``max_tokens``), wait for a seat, are
preempted, are aborted while a step runs ahead of them, or a step launched ahead fails; and every
page comes back. On the CPU the steps are synchronous, but the engine's bookkeeping is the same
as on a GPU (the CUDA-graph path: ``test_gpu_engine.py``)."""

import pytest

from oscarkv.engine import sampler
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import fail_once, make_engine, prompts, run
from tests.engine.test_robustness import idle


def _params(n: int, stops: dict[int, int] = {}) -> list[SamplingParams]:
    """With log-probs; requests 2 and 3 draw (seeded, temperature 0.8, top-p 0.9), the others are
    greedy; request ``i`` stops after ``6 + 3i`` tokens, or at token ``stops[i]``."""
    return [SamplingParams(max_tokens=6 + 3 * i, temperature=0.8 if i in (2, 3) else 0, top_p=0.9, seed=i,
                           logprobs=True, ignore_eos=True, stop_token_ids=(stops[i],) if i in stops else ())
            for i in range(n)]


def _same(a, b) -> None:
    """Equal tokens and finish reasons; log-probs equal up to 1e-5: a row kept in a step ahead for a
    request that stopped changes the batch of the others' matmuls, not what they compute."""
    for x, y in zip(a, b, strict=True):
        assert (x.token_ids, x.finish_reason) == (y.token_ids, y.finish_reason)
        assert len(x.logprobs or ()) == len(y.logprobs or ())
        assert all(abs(p - q) < 1e-5 for p, q in zip(x.logprobs or (), y.logprobs or ()))


def _clean(engine) -> None:
    assert idle(engine)
    engine.manager.bf16.check()
    if engine.manager.int2 is not None:
        engine.manager.int2.check()


@pytest.mark.parametrize("method", ["bf16", "oscar"])
@pytest.mark.parametrize("seats", [8, 3])
def test_overlap_gives_the_outputs_of_sequential_steps(llama, artifact, method, seats):
    """Five requests of different lengths (crossing sink, window and history pages), greedy and
    sampled, two of them stopped by a token they sample mid-way; with 3 seats, requests wait and
    are admitted as others finish."""
    ps = prompts(5, 29, seed=11)
    free = run(make_engine(llama, method, artifact, overlap=False), ps, _params(5))
    stops = {1: free[1].token_ids[4], 3: free[3].token_ids[2]}  # stop tokens first sampled there or earlier
    ref = run(make_engine(llama, method, artifact, max_num_seqs=seats, overlap=False), ps, _params(5, stops))
    assert ref[1].finish_reason == ref[3].finish_reason == "stop" and len(ref[1].token_ids) < 9
    engine = make_engine(llama, method, artifact, max_num_seqs=seats, overlap=True)
    waited = []  # steps after which requests waited for a seat and a step was running ahead
    _same(run(engine, ps, _params(5, stops), on_step=lambda e: waited.append(bool(e.scheduler.waiting and e._ahead))),
          ref)
    assert engine.num_ahead_steps > 10 and (seats == 8 or any(waited))
    _clean(engine)


def test_overlap_under_preemption(llama, artifact):
    """Pools too small for every request at once: steps that would preempt are not planned ahead,
    requests that wait for pages are admitted when the policy admits them, and preempted requests
    resume exactly."""
    ps = [p[:24] for p in prompts(3, 24, seed=12)]
    sp = SamplingParams(max_tokens=20, temperature=0, logprobs=True, ignore_eos=True)
    kw = dict(kv_memory_bytes=65_536, bf16_fraction=0.5)  # as test_scheduler's preemption test
    ref = run(make_engine(llama, "oscar", artifact, overlap=False, **kw), ps, sp)
    engine = make_engine(llama, "oscar", artifact, overlap=True, **kw)
    waited = []  # a request waited for pages (seats were free) while a step ran ahead: every other step
    _same(run(engine, ps, sp, on_step=lambda e: waited.append(bool(e.scheduler.waiting and e._ahead))), ref)
    assert engine.scheduler.num_preemptions > 0 and engine.num_ahead_steps > 0 and any(waited)
    _clean(engine)


def test_abort_while_a_step_runs_ahead(llama, artifact):
    ps = prompts(3, 33, seed=13)
    sp = SamplingParams(max_tokens=16, temperature=0, logprobs=True, ignore_eos=True)
    ref = run(make_engine(llama, "oscar", artifact, overlap=False), ps, sp)
    engine = make_engine(llama, "oscar", artifact, overlap=True)
    for i, p in enumerate(ps):
        engine.add_request(str(i), p, sp)
    while engine._ahead is None or len(engine.seqs["1"].output_ids) < 5:
        engine.step()
    aborted = engine.abort("1")
    assert aborted.finish_reason == "abort" and aborted.token_ids == ref[1].token_ids[:len(aborted.token_ids)]
    done = {}
    while engine.has_unfinished():
        done |= {o.request_id: o for o in engine.step() if o.finished}
    assert sorted(done) == ["0", "2"]
    _same([done["0"], done["2"]], [ref[0], ref[2]])
    _clean(engine)


def test_failed_step_launched_ahead_fails_its_requests_only(llama, artifact, monkeypatch):
    """The launch of a step ahead raises: the step being finished still returns its tokens, the next
    ``step()`` fails the requests of the failed one (reason ``error``), and the engine serves on."""
    ps = prompts(2, 30, seed=14)
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    ref = run(make_engine(llama, "naive", overlap=False), ps, sp)
    engine = make_engine(llama, "naive", overlap=True)
    for i, p in enumerate(ps):
        engine.add_request(str(i), p, sp)
    while engine._ahead is None:
        engine.step()
    fail_once(monkeypatch, engine.runner, "run")
    got = engine.step()  # finishes the step launched ahead earlier; launching the next one raises
    assert sorted(o.request_id for o in got) == ["0", "1"] and not any(o.finished for o in got)
    failed = engine.step()
    assert sorted(o.request_id for o in failed) == ["0", "1"]
    assert all(o.finish_reason == "error" and "injected failure" in o.error for o in failed)
    _clean(engine)
    _same(run(engine, ps, sp), ref)
    _clean(engine)


def test_failed_sampling_while_a_step_runs_ahead(llama, artifact, monkeypatch):
    """Collecting a step's tokens raises after the next step was launched: the step's requests fail
    (no placeholder token in their outputs), the step ahead of them is dropped, every page comes back."""
    ps = prompts(2, 30, seed=15)
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    engine = make_engine(llama, "oscar", artifact, overlap=True)
    for i, p in enumerate(ps):
        engine.add_request(str(i), p, sp)
    while engine._ahead is None:
        engine.step()
    fail_once(monkeypatch, sampler.DeviceTokens, "result")
    failed = engine.step()
    assert sorted(o.request_id for o in failed) == ["0", "1"]
    assert all(o.finish_reason == "error" and -1 not in o.token_ids for o in failed)
    while engine.has_unfinished():
        assert engine.step() == []
    _clean(engine)
