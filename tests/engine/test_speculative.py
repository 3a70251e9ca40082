"""Speculative decoding (``oscarkv.engine.speculative``) against the engine without it.

Greedy outputs must be the tokens of a run without speculation (log-probabilities within float
tolerance: a verify step's rows share one batch's GEMMs), for bf16 and oscar, through prefix hits,
preemptions, an abort and tp = 2; the K/V a sequence stores must be the same bytes; and the
rejection sampler must keep the target distribution.
"""

import pytest
import torch

from oscarkv.config import SpeculativeConfig
from oscarkv.engine.request import SamplingParams
from oscarkv.engine.sampler import filter_logits
from oscarkv.engine.speculative import (DraftGate, NgramIndex, SpeculativeDecoder, StepCosts, greedy_pair,
                                       rejection_sample)
from oscarkv.server.metrics import speculative_metrics
from tests.engine.conftest import make_engine, prompts, run
from tests.engine.test_tensor_parallel import MEMORY, TIGHT, _pair

NGRAM = SpeculativeConfig("ngram", num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=3,
                          min_accepted_tokens=0.0)  # drafts at every match: the tests below exercise verification
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=True)


def copy_prompts() -> list[list[int]]:
    """Phrases repeated (n-gram drafts find them) and one random prompt."""
    a, b = prompts(2, 10, seed=5)
    return [a * 4, (b[:7] + a[:5]) * 3, prompts(1, 33, seed=6)[0]]


@pytest.mark.parametrize("lo,hi", [(1, 3), (2, 5), (1, 1)])
def test_ngram_index_matches_a_scan(lo, hi):
    """The longest suffix of lo..hi tokens with an earlier occurrence followed by a token, its last such occurrence;
    the index grows with the sequence (its mirror copies only new tokens), tested at every length."""
    g = torch.Generator().manual_seed(lo * 10 + hi)
    tokens = torch.randint(0, 5, (1500,), generator=g).tolist()
    index = NgramIndex(lo, hi)
    for L in list(range(1, 60)) + list(range(60, 1500, 37)):
        seq, want = tokens[:L], []
        for n in range(min(hi, L - 1), lo - 1, -1):
            ends = [e for e in range(n, L) if seq[e - n:e] == seq[L - n:]]
            if ends:
                want = seq[ends[-1]:ends[-1] + 4]
                break
        assert index.propose(seq, 4) == want, L


def test_rejection_sampler_keeps_the_distribution():
    """The first emitted token after a point-mass draft is distributed as the target (TV bound), for
    drafts of high and low probability and for a top-k-processed target."""
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, 1.5]] * 3)
    params = SamplingParams(temperature=0.9, top_k=4)
    cases = [(logits.softmax(-1), 0), (logits.softmax(-1), 4), (filter_logits(logits, [params] * 3).softmax(-1), 3)]
    for probs, draft in cases:
        n, counts = 4000, torch.zeros(6)
        for _ in range(n):
            counts[rejection_sample(probs, [draft, 1], g)[0]] += 1
        tv = 0.5 * (counts / n - probs[0]).abs().sum()
        assert tv < 0.035, (draft, tv)  # expected ~0.01 at n = 4000


def test_accept_greedy_is_the_longest_agreeing_prefix():
    spec = SpeculativeDecoder(NGRAM)
    logits = torch.full((4, 8), -5.0)
    for row, best in enumerate([3, 1, 6, 2]):
        logits[row, best] = 5.0
    assert spec.accept(logits, [3, 1, 0], GREEDY, None)[0] == [3, 1, 6]
    assert spec.accept(logits, [3, 1, 6], GREEDY, None)[0] == [3, 1, 6, 2]
    assert spec.accept(logits, [0, 1, 6], GREEDY, None)[0] == [3]
    assert (spec.stats.drafted, spec.stats.accepted) == (9, 5)
    pair = greedy_pair(logits)  # what an extend graph forms: the same tokens and log-probs
    assert spec.accept(logits * 0, [3, 1, 0], GREEDY, None, None, pair) == spec.accept(logits, [3, 1, 0], GREEDY, None)


def test_draft_gate_judges_shadow_drafts_while_closed():
    """Closed at first; each token count's shadow draft is judged once the tokens it guessed are known (on its own):
    one accepted token reopens a floor of 0.45 (a count, whatever the draft's length); rejected verifies (the
    average) close it again; a floor of 0 never closes."""
    index, gate = NgramIndex(1, 4), DraftGate(0.45)
    tokens = [7, 1, 2, 3, 4, 9, 1, 2]  # the suffix [1, 2] occurred before: shadow [3, 4, 9, 1]
    gate.watch(tokens, index, 4)
    assert not gate.is_open() and gate.shadows == [(8, [3, 4, 9, 1])]
    gate.watch(tokens + [3], index, 4)  # one of four agrees so far: it reopens, without waiting for the rest
    assert gate.is_open() and gate.rate == 1
    gate.update(8, 0)
    assert gate.is_open() and gate.rate == 0.5  # the average of accepted tokens, not of the share (0 of 8)
    gate.update(4, 0)
    assert not gate.is_open()
    gate.watch(tokens + [3, 4], index, 4)  # closed again: a fresh shadow from here ([9, 1, 2, 3])
    gate.watch(tokens + [3, 4, 5], index, 4)  # the text stops copying: judged at once, 0 of 4
    assert not gate.is_open() and gate.rate == 0.0
    never = DraftGate(0.0)
    never.update(4, 0)
    assert never.is_open()


def test_gate_keeps_outputs_and_skips_drafts_on_text_that_does_not_copy(llama, artifact):
    """Random prompts (drafts rarely right): the gate drafts on far fewer steps; greedy tokens equal either way."""
    ps, kw = prompts(3, 40, seed=11), dict(kv_memory_bytes=4 * MEMORY["bf16"]["kv_memory_bytes"])
    always = make_engine(llama, "bf16", artifact, speculative=SpeculativeConfig(
        "ngram", num_speculative_tokens=4, min_accepted_tokens=0.0), **kw)
    gated = make_engine(llama, "bf16", artifact, speculative=SpeculativeConfig("ngram", num_speculative_tokens=4), **kw)
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True)
    a, b = run(always, ps, params), run(gated, ps, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    sa, sb = always.spec.stats, gated.spec.stats
    assert sa.acceptance_rate < 0.25 and sb.verify_steps < 0.6 * sa.verify_steps, (sa, sb)


def test_text_that_does_not_copy_never_verifies():
    """A sequence whose suffixes never recur never opens its gate (no verify step: its steps all run ahead); one that
    copies opens after its first shadow draft is judged and drafts at every later step; a floor of 0 never closes."""

    class Seq:  # what propose reads of a sequence (weak-referenceable)
        def __init__(self, ids):
            self.token_ids = ids

    spec = SpeculativeDecoder(SpeculativeConfig("ngram", num_speculative_tokens=4))
    fresh, copying, opens = Seq([]), Seq([1, 2, 3, 4, 5] * 4), []
    for t in range(100):
        fresh.token_ids.append(t)
        opens.append(spec.drafts_next(fresh))
        spec.skip(fresh)
    assert not any(opens) and spec.stats.drafted == 0 and spec.stats.decode_steps == 100
    opens = []
    for t in range(20):
        opens.append(spec.drafts_next(copying) and bool(spec.propose(copying, 4)))
        copying.token_ids.append(copying.token_ids[-5])
    assert opens == [False] + [True] * 19
    never = SpeculativeDecoder(SpeculativeConfig("ngram", num_speculative_tokens=4, min_accepted_tokens=0.0))
    assert all(never.propose(fresh, 4) == [] and never.drafts_next(fresh) for _ in range(10))


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_overlap_runs_ahead_while_gates_are_closed(llama, artifact, method):
    """With overlap, steps whose sequences' gates are all closed are planned ahead (text that does not copy
    decodes as without speculation); the others verify drafts as before: greedy tokens and stored pages' pools
    come back as without speculation and overlap, and the counters add up (every decode step counted once)."""
    ps = prompts(2, 40, seed=11) + [copy_prompts()[0]]  # two random prompts (gates close), one that copies
    params = SamplingParams(max_tokens=48, temperature=0, ignore_eos=True, logprobs=True)
    kw = dict(kv_memory_bytes=4 * MEMORY["bf16"]["kv_memory_bytes"])
    base = run(make_engine(llama, method, artifact, overlap=False, **kw), ps, params)
    engine = make_engine(llama, method, artifact, overlap=True, speculative=SpeculativeConfig(
        "ngram", num_speculative_tokens=4, prompt_lookup_max=3), **kw)
    outs = [run(engine, [p], params)[0] for p in ps]  # one at a time: each sequence's own gate decides
    for a, b in zip(base, outs):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    st = engine.spec.stats
    # NOTE: lookups that find nothing close gates too, so the random model's few matches verify only a few times
    assert engine.num_ahead_steps > 20 and st.verify_steps > 5 and st.accepted > 0
    assert st.decode_steps + st.accepted == 3 * 47  # every token after a request's first: one step or a draft
    assert engine.manager.bf16.num_used == 0


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_greedy_equals_without_speculation(llama, artifact, method):
    """Two waves (the second hits the prefix cache), pools too small for the batch (preemptions)."""
    kw = {**TIGHT, **MEMORY[method]}
    ps = copy_prompts()
    base_engine = make_engine(llama, method, artifact, **kw)
    base = run(base_engine, ps + ps, GREEDY)
    engine = make_engine(llama, method, artifact, speculative=NGRAM, **kw)
    outs = run(engine, ps + ps, GREEDY)
    for a, b in zip(base, outs):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    st, m = engine.spec.stats, engine.manager
    assert st.accepted > 10 and st.drafted > st.accepted, "meant to accept and to reject drafts"
    assert engine.scheduler.num_preemptions > 0 and m.hit_tokens > 0
    assert m.bf16.num_used == 0 and (m.int2 is None or m.int2.num_used == 0)
    m.bf16.check()
    metrics = {f.name: f.samples[0].value for f in speculative_metrics(engine.stats().speculative)}  # what /metrics shows
    assert metrics["oscarkv_spec_acceptance_rate"] == st.acceptance_rate > 0
    assert metrics["oscarkv_spec_tokens_per_step"] == st.tokens_per_step > 1


def _stored(engine, seq) -> tuple[torch.Tensor, ...]:
    """The bytes one sequence stores, by position: BF16 K/V of its sink and recent tokens, its INT2 pages."""
    pools, m, s, P = engine.runner.pools, engine.manager, seq.kv, engine.cfg.kv.page_size
    h = engine.cfg.kv.sink + len(s.history) * P
    slots = torch.tensor([m._slot(s, p, h) for p in range(s.num_tokens) if p < engine.cfg.kv.sink or p >= h])
    bf16 = [t.permute(0, 1, 3, 2, 4).flatten(1, 2)[:, slots] for t in (pools.bf16_k, pools.bf16_v)]  # [L, n, H, d]
    hist = torch.tensor(s.history, dtype=torch.int64)
    int2 = [x[:, hist] for p in (pools.int2_k, pools.int2_v) if p is not None for x in (p.codes, p.scale, p.zero)]
    return tuple(bf16 + int2)


def _snapshots(engine, ps, drafter=None) -> dict[tuple[str, int], tuple]:
    """Every sequence's stored bytes after every step, by (request, stored length)."""
    if drafter is not None:
        engine.scheduler.drafter = drafter
    snaps = {}

    def snap(e):
        for rid, seq in e.seqs.items():
            if seq.kv.num_tokens:
                snaps[rid, seq.kv.num_tokens] = _stored(e, seq)
    run(engine, ps, GREEDY, on_step=snap)
    return snaps


@pytest.mark.parametrize("wrong", [True, False], ids=["all-rejected", "half-accepted"])
def test_stored_pages_equal_without_speculation(llama, artifact, wrong):
    """Four sequences (every step's GEMMs have >= 4 rows in both runs, where the CPU's row results do
    not depend on the batch); drafts from the true continuation, every one wrong or the last half wrong."""
    ps = [p[:30] for p in prompts(4, 30, seed=7)]
    base_engine = make_engine(llama, "oscar", artifact)
    base = _snapshots(base_engine, ps)
    truth = {str(i): list(p) + o.token_ids for i, (p, o) in enumerate(zip(ps, run(make_engine(llama, "oscar", artifact),
                                                                                   ps, GREEDY)))}

    def drafter(seq, limit):
        k = min(limit, 4)
        nxt = truth[seq.request_id][len(seq.token_ids):len(seq.token_ids) + k]
        keep = 0 if wrong else len(nxt) // 2
        return nxt[:keep] + [(t + 1) % 128 for t in nxt[keep:]]
    engine = make_engine(llama, "oscar", artifact, speculative=NGRAM)
    demoting = _count_demoting_verify_steps(engine)
    got = _snapshots(engine, ps, drafter)
    assert engine.spec.stats.drafted > 50 and (engine.spec.stats.accepted == 0) == wrong
    assert demoting[0] >= 4  # demotions happen during speculation: on verify steps too, not only between them
    common = got.keys() & base.keys()
    assert len(common) >= (len(base) if wrong else 12)
    for key in common:
        assert all(torch.equal(a, b) for a, b in zip(got[key], base[key])), key


def _count_demoting_verify_steps(engine) -> list[int]:
    """A counter (``[n]``) of the engine's verify steps that demote a page (their row 0 / chunk carries it)."""
    count, real = [0], engine._run_verify

    def spy(out):
        count[0] += any(c.plan.demote_src for c in out.chunks if c.drafts)
        return real(out)
    engine._run_verify = spy
    return count


def test_abort_and_tp2(llama, artifact):
    """Two waves over a shared prefix (prefix hits), pools too small (preemptions), an abort after 8 steps:
    speculation at tp = 1 and at tp = 2 (gloo) against tp = 1 without it: equal tokens, the aborted
    request a prefix of the plain run's."""
    one, two = _pair(llama, "oscar", 2, speculative=NGRAM)
    try:
        ref = _waves(make_engine(llama, "oscar", artifact, **{**TIGHT, **MEMORY["oscar"]}))
        for engine in (one, two):
            got = _waves(engine)
            assert got.keys() == ref.keys()
            for k in ref:
                a, b = ref[k], got[k]
                if k == "0-2":  # speculation may run ahead of the plain engine when the abort comes
                    assert b.finish_reason == "abort" and b.token_ids == a.token_ids[:len(b.token_ids)]
                else:
                    assert a.token_ids == b.token_ids, k
            assert engine.spec.stats.accepted > 0 and engine.scheduler.num_preemptions > 0
    finally:
        two.close()


def _waves(engine) -> dict:
    shared = prompts(1, 24, seed=3)[0]
    ps = [shared + p + p for p in prompts(3, 6, seed=4)]
    done, steps = {}, 0
    for wave in range(2):
        for i, p in enumerate(ps):
            engine.add_request(f"{wave}-{i}", p, GREEDY)
        while engine.has_unfinished():
            done |= {o.request_id: o for o in engine.step() if o.finished}
            steps += 1
            if steps == 8:
                done["0-2"] = engine.abort("0-2")
    m = engine.manager
    assert not engine.seqs and m.bf16.num_used == 0 and m.int2.num_used == 0
    return done


def _costs(verify_ms: float, plain_ms: float, n: int) -> StepCosts:
    costs = StepCosts()
    for _ in range(n):
        costs.observe("verify", verify_ms / 1e3)
        costs.observe("plain", plain_ms / 1e3)
    return costs


def test_measured_floor_is_where_a_verify_step_breaks_even():
    """``StepCosts``: the prior until four verify steps and four plain ones; then (verify + cold) / plain − 2 — a verify
    step and the cold step after it against plain steps run ahead — with either plain kind standing in for a missing
    one, within [0, K]; a decoder with ``measured_floor`` sets its gates' floor from it, one without keeps
    ``min_accepted_tokens``."""
    assert _costs(2.3, 1.0, 3).floor(0.45, 4) == 0.45
    costs = _costs(2.3, 1.0, 4)
    costs.observe(None, 9.0)  # a step with prefill in it counts for neither
    assert costs.floor(0.45, 4) == pytest.approx(1.3) and _costs(0.5, 1.0, 4).floor(0.45, 4) == 0.0
    for _ in range(4):  # cold steps cost 1.6 plain steps: the verify step's overlap break counts
        costs.observe("cold", 1.6e-3)
    assert costs.floor(0.45, 4) == pytest.approx(1.9)
    cold_only = StepCosts()  # no overlap: every plain step cold
    for _ in range(4):
        cold_only.observe("verify", 2.3e-3)
        cold_only.observe("cold", 1.0e-3)
    assert cold_only.floor(0.45, 4) == pytest.approx(1.3)
    costs.observe("verify", 1.0)  # a slow verify step: the floor stays within K
    assert costs.floor(0.45, 4) == 4.0

    class Seq:  # what the gate reads of a sequence (weak-referenceable)
        def __init__(self, ids):
            self.token_ids = ids

    measured = SpeculativeDecoder(SpeculativeConfig("ngram", num_speculative_tokens=4, measured_floor=True))
    seq = Seq([1, 2, 3, 4, 5] * 4)
    measured.drafts_next(seq)
    assert measured._gate[seq].floor == 0.45  # nothing measured yet: the prior
    measured.costs = _costs(2.3, 1.0, 4)
    measured.drafts_next(seq)
    assert measured._gate[seq].floor == pytest.approx(1.3)
    fixed = SpeculativeDecoder(SpeculativeConfig("ngram", num_speculative_tokens=4))
    fixed.costs = _costs(2.3, 1.0, 4)
    assert fixed.floor() == 0.45


def test_an_engine_measures_its_steps_for_the_floor(llama, artifact):
    """With ``measured_floor`` the engine times its verify steps and its plain decode steps, run ahead and cold (overlap
    on); greedy tokens are those without speculation."""
    ps = prompts(1, 40, seed=11) + [copy_prompts()[0]]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    kw = dict(kv_memory_bytes=4 * MEMORY["bf16"]["kv_memory_bytes"])
    base = run(make_engine(llama, "oscar", artifact, overlap=False, **kw), ps, params)
    engine = make_engine(llama, "oscar", artifact, overlap=True, speculative=SpeculativeConfig(
        "ngram", num_speculative_tokens=4, prompt_lookup_max=3, measured_floor=True), **kw)
    outs = [run(engine, [p], params)[0] for p in ps]
    assert [o.token_ids for o in base] == [o.token_ids for o in outs]
    costs = engine.spec.costs
    assert costs.count["plain"] > 10 and costs.count["verify"] > 0 and costs.count["cold"] > 0
    assert min(costs.mean.values()) > 0
