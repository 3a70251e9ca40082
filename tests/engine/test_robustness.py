"""Impossible requests are refused at ``add_request`` (and by ``LLM.generate`` as a whole batch);
a failing step fails only its requests; ``LLMEngine.stats()``; a tiny temperature does not
overflow the sampler."""


import pytest
import torch

from oscarkv.engine import sampler
from oscarkv.llm import LLM
from oscarkv.models.loader import LoadedModel
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, fail_once, make_engine, prompts, run

SP = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def idle(engine) -> bool:
    m = engine.manager
    return not engine.has_unfinished() and not engine.seqs and m.bf16.num_used == 0 and \
        (m.int2 is None or m.int2.num_used == 0)


def test_refuses_empty_and_too_long(llama, artifact):
    engine = make_engine(llama, "oscar", artifact)
    limit = llama.config.max_position_embeddings
    with pytest.raises(ValueError, match="prompt is empty"):
        engine.add_request("a", [], SP)
    with pytest.raises(ValueError, match=rf"prompt \(10 tokens\) \+ max_tokens \({limit}\) = {limit + 10} tokens "
                                         rf"exceeds the model's maximum length of {limit}"):
        engine.add_request("b", list(range(10)), SamplingParams(max_tokens=limit))
    assert idle(engine)


def test_llm_generate_refuses_a_batch_as_a_whole(llama):
    llm = LLM(LoadedModel(llama, None, "tiny"), kv="bf16", config=engine_config("bf16"))
    ps = prompts(2, 10, seed=6)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([ps[0], []], SP)
    assert idle(llm.engine)
    assert [o.token_ids for o in llm.generate(ps, SP)] == [o.token_ids for o in run(make_engine(llama, "bf16"), ps, SP)]


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_refuses_what_the_pools_cannot_hold_alone(llama, artifact, method):
    """The longest accepted request runs alone to the end; one token more is refused, with the numbers."""
    engine = make_engine(llama, method, artifact, kv_memory_bytes=1 << 16)
    prompt = prompts(1, 30, seed=5)[0]
    longest = max(n for n in range(1, 1000) if _accepted(engine, prompt, n))
    with pytest.raises(ValueError, match=r"needs \d+ BF16 and \d+ INT2 KV pages, but the pools hold \d+ and \d+"):
        engine.add_request("over", prompt, SamplingParams(max_tokens=longest + 1))
    out = run(engine, [prompt], SamplingParams(max_tokens=longest, temperature=0, ignore_eos=True))[0]
    assert len(out.token_ids) == longest and engine.scheduler.num_preemptions == 0 and idle(engine)


def _accepted(engine, prompt, max_tokens) -> bool:
    try:
        engine.validate("probe", prompt, SamplingParams(max_tokens=max_tokens))
    except ValueError:
        return False
    return True


def _drain(engine) -> dict:
    done = {}
    while engine.has_unfinished():
        done |= {o.request_id: o for o in engine.step() if o.finished}
    return done


@pytest.mark.parametrize("where", ["runner", "sampler"])
def test_failed_step_fails_its_requests_only(llama, artifact, monkeypatch, where):
    """Two requests run, a third waits (max_num_seqs=2). The step that raises (one that demotes a
    page) fails the two running ones and frees all their pages; the waiting one, and the same
    prompts again (prefix hits on the pages cached before the failure), give the tokens of an
    engine that never failed."""
    ps = prompts(3, 70, seed=3)
    ref = run(make_engine(llama, "oscar", artifact, max_num_seqs=2), ps, SP)
    engine = make_engine(llama, "oscar", artifact, max_num_seqs=2)
    for i, p in enumerate(ps):
        engine.add_request(str(i), p, SP)
    for _ in range(3):  # prefill (64 + 6 tokens each), decode: request 0 holds 72 tokens next step
        engine.step()
    target = (engine.runner, "run") if where == "runner" else (sampler.DeviceTokens, "result")
    seen = fail_once(monkeypatch, *target)
    failed = engine.step()
    if where == "runner":
        assert any(c.plan.release_stale for c in seen[0][0])  # the failed step demoted a page: abandon() released it
    assert sorted(o.request_id for o in failed) == ["0", "1"]
    assert all(o.finished and o.finish_reason == "error" and "injected failure" in o.error for o in failed)
    assert _drain(engine)["2"].token_ids == ref[2].token_ids and idle(engine)
    hits = engine.manager.hit_tokens
    assert [o.token_ids for o in run(engine, ps, SP)] == [o.token_ids for o in ref]
    assert engine.manager.hit_tokens > hits and idle(engine)


def test_stats(llama, artifact):
    engine = make_engine(llama, "oscar", artifact, max_num_seqs=2)
    s = engine.stats()
    assert (s.running, s.waiting, s.generated_tokens, s.prefix_hit_rate) == (0, 0, 0, 0.0)
    assert s.tiers["bf16"].pages_free == s.tiers["bf16"].pages_total > 0 and s.tiers["int2"].pages_used == 0
    ps = prompts(3, 70, seed=4)
    for i, p in enumerate(ps):
        engine.add_request(str(i), p, SP)
    engine.step()
    s = engine.stats()
    assert (s.running, s.waiting, s.prompt_tokens) == (1, 2, sum(map(len, ps)))
    assert s.tiers["bf16"].pages_used > 0 and s.tiers["int2"].pages_used > 0
    assert s.tiers["bf16"].pages_used + s.tiers["bf16"].pages_free == s.tiers["bf16"].pages_total
    _drain(engine)
    run(engine, ps[:1], SP)  # the same prompt again: its first 64 tokens come from the prefix cache
    s = engine.stats()
    assert s.generated_tokens == 4 * SP.max_tokens and s.running == s.waiting == 0
    assert s.prefix_hit_tokens == 64 and s.prefix_hit_rate == pytest.approx(64 / (sum(map(len, ps)) + len(ps[0])))
    assert all(t.pages_used == 0 for t in s.tiers.values())


def test_tiny_temperature_samples_the_argmax():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 10
    params = [SamplingParams(temperature=1e-40, seed=i) for i in range(3)]
    tokens, _ = sampler.sample(logits, params, [torch.Generator().manual_seed(i) for i in range(3)])
    assert tokens == logits.argmax(-1).tolist()


def _filter_one(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Reference for one row: tempered logits, keep the ``top_k`` largest, then the most likely of
    those until their probability reaches ``top_p``; the rest -inf."""
    x = (logits - logits.max()) / p.temperature
    order = torch.argsort(x, descending=True).tolist()
    kept = order[:p.top_k] if p.top_k else order
    probs = x[kept].softmax(-1).tolist()
    mass, keep = 0.0, []
    for i, pr in zip(kept, probs):
        if p.top_p < 1 and mass >= p.top_p:
            break
        keep.append(i)
        mass += pr
    out = torch.full_like(x, float("-inf"))
    out[keep] = x[keep]
    return out


def test_filter_logits_rows_as_one_at_a_time():
    """The batched filter gives each row what that row alone gives, and what the reference keeps."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 40, generator=g) * 3
    params = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=5),
              SamplingParams(temperature=1.0, top_p=0.6), SamplingParams(temperature=0.5, top_k=8, top_p=0.9),
              SamplingParams(temperature=2.0, top_k=40)]
    batched = sampler.filter_logits(logits, params)
    for i, p in enumerate(params):
        assert torch.equal(batched[i], sampler.filter_logits(logits[i:i + 1], [p])[0])
        ref = _filter_one(logits[i], p)
        assert torch.equal(batched[i].isinf(), ref.isinf()), i
        torch.testing.assert_close(batched[i][~ref.isinf()], ref[~ref.isinf()])


def test_draws_follow_the_filtered_distribution():
    """4 000 requests, each with its own generator, draw once from softmax(logits / T) restricted by
    top-k: frequencies within 0.03 of the probabilities, and a removed token never drawn."""
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0]).repeat(4000, 1)
    p = SamplingParams(temperature=0.8, top_k=4, seed=0)
    tokens, logps = sampler.sample(logits, [p] * 4000, [torch.Generator().manual_seed(i) for i in range(4000)])
    want = (logits[0, :4] / 0.8).softmax(-1)
    got = torch.bincount(torch.tensor(tokens), minlength=5) / 4000
    assert got[4] == 0 and torch.allclose(got[:4], want, atol=0.03), (got, want)
    assert logps[0] == pytest.approx(float(torch.log_softmax(logits[0], -1)[tokens[0]]))  # the model's log-prob
