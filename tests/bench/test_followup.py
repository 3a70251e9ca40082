"""``oscarkv bench followup`` at tiny shapes on the CPU: the timed step is the cached-prefix step it claims to be."""

from __future__ import annotations

import types
from dataclasses import replace

import pytest
from transformers import Qwen3Config

from oscarkv.bench import followup
from oscarkv.bench.configs import FollowupBench
from oscarkv.engine.request import SamplingParams
from oscarkv.models.llama import PagedLM

CONFIG = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=32, vocab_size=128, max_position_embeddings=8192,
                     architectures=["Qwen3ForCausalLM"])


@pytest.mark.parametrize("method", ["bf16", "oscar"])
def test_followup_hits_the_whole_prefix_and_computes_k_tokens(method):
    """Contexts past the windows (INT2 history for oscar): every follow-up request is served the whole prefix
    from the cache and one launch computes exactly its k tokens (``followup_step`` raises otherwise; the rows
    say so too); repeats are separate requests; the decode step is timed at the same context. With ``profile``
    (oscar here) rows at the longest context carry the host profile of one more follow-up."""
    cfg = FollowupBench(contexts=(640, 1024), new_tokens=(1, 8, 64), methods=(method,), repeats=2, steps=3,
                        kv_gib=1 / 64, profile=method == "oscar")
    rows = followup.followup_rows(PagedLM.random(CONFIG), cfg, "tiny")
    assert [(r["context"], r["new_tokens"]) for r in rows] == [(n, k) for n in (640, 1024) for k in (1, 8, 64)]
    for r in rows:
        assert r["hit_tokens"] == r["context"] and r["computed_tokens"] == r["new_tokens"]
        assert len(r["all_step_s"]) == 2 and r["step_s"] == r["all_step_s"][-1] > 0 and r["decode_s"] > 0
        assert 0 < r["admit_s"] < r["step_s"]
        assert ("host" in r) == (cfg.profile and r["context"] == 1024)
        assert all(f["us"] >= 0 and "(" in f["name"] for f in r.get("host", []))
    table = followup.format_table(rows)
    assert table.count(f"| tiny | 1024 | {method} |") == 1 and "k = 64 / decode" in table


def test_a_followup_that_misses_the_cache_is_refused():
    """A follow-up whose prefix is not cached raises instead of timing a cold prefill."""
    engine = followup.followup_engine(PagedLM.random(CONFIG), "bf16", 1 << 22, 8)
    try:
        with pytest.raises(RuntimeError, match="prefix hit 0 of 128"):
            followup.followup_step(engine, list(range(128)), 8, seed=0)
    finally:
        engine.close()


def test_table_holds_each_step_to_its_target_where_measured():
    """On a GPU each row carries its bound (two decode steps plus the k tokens' GEMMs): the ratio is to it."""
    rows = [dict(shape="s", context=4096, method="oscar", new_tokens=k, decode_s=0.005, step_s=step,
                 gemm_s=gemm, target_s=0.01 + gemm) for k, step, gemm in ((1, 0.015, 0.0), (8, 0.024, 0.002))]
    table = followup.format_table(rows)
    assert "k = 8 / target" in table and "| 1.5x | 2.0x |" in table


def test_the_bound_adds_the_tokens_attention_flops():
    """The bound: the target plus the computed tokens' attention over the hit prefix and themselves, at the measured
    rate; the table shows step / target, then step / bound in brackets."""
    model = types.SimpleNamespace(head_dim=128, config=types.SimpleNamespace(num_attention_heads=32,
                                                                             num_hidden_layers=36))
    row = dict(shape="s", context=102400, method="oscar", new_tokens=512, decode_s=0.005, step_s=0.07,
               gemm_s=0.005, target_s=0.015, cached_tokens=102400, hit_tokens=102400, computed_tokens=512)
    row |= followup._bound(model, row, 680e12)
    flops = 4 * 32 * 128 * 512 * (102400 + 256) * 36
    assert row["attention_s"] == pytest.approx(flops / 680e12) and 0.04 < row["attention_s"] < 0.05
    assert "k = 512 / target (bound)" in followup.format_table([row])
    assert f"| 4.7x ({0.07 / (0.015 + flops / 680e12):.1f}x) |" in followup.format_table([row])


def test_the_servers_chunking_recomputes_the_cached_prompts_last_partial_chunk():
    """``prefill_chunk`` N: the cached prompt runs N // 2 tokens past a multiple of N; a follow-up hits it up to that
    multiple and computes the rest with its k tokens, which the row and the table report; resuming where the cached
    prompt ended (``resume_turns``, a chat follow-up), it hits all of it."""
    cfg = FollowupBench(contexts=(640,), new_tokens=(1, 8), methods=("oscar",), repeats=1, steps=2, kv_gib=1 / 64,
                        prefill_chunk=128, resume_turns=False)
    rows = followup.followup_rows(PagedLM.random(CONFIG), cfg, "tiny")
    for r in rows:
        assert r["cached_tokens"] == 704 and r["hit_tokens"] == 640
        assert r["computed_tokens"] == 64 + r["new_tokens"]
    assert "(65 computed)" in followup.format_table(rows)
    rows = followup.followup_rows(PagedLM.random(CONFIG), replace(cfg, resume_turns=True), "tiny")
    assert [(r["hit_tokens"], r["computed_tokens"]) for r in rows] == [(704, 1), (704, 8)]
    with pytest.raises(ValueError, match="--prefill-chunk"):
        FollowupBench(prefill_chunk=-1)


def test_followups_longer_than_a_chunk_keep_hitting_the_document():
    """One sequence at a time (the smallest BF16 pool) and follow-ups longer than a prefill chunk: each one still
    hits the document, because the pool keeps room for cached windows (``EngineConfig.prefix_windows``); without it
    the first long follow-up evicted the window at the document's last chunk start and the next one missed."""
    cfg = FollowupBench(contexts=(1024,), new_tokens=(512,), methods=("oscar",), repeats=2, steps=2, kv_gib=1 / 64,
                        prefill_chunk=512)
    rows = followup.followup_rows(PagedLM.random(CONFIG), cfg, "tiny")
    assert [(r["hit_tokens"], r["computed_tokens"]) for r in rows] == [(1280, 512)]
    assert all(s > 0 for s in rows[0]["all_step_s"])


def test_a_new_conversation_on_the_document_hits_after_long_follow_ups():
    """A chat that resumes at its turns keeps hitting the document; a request that shares the document but not those
    chunk starts (a new conversation, the decode row of ``bench followup``) hits at the last multiple of the prefill
    chunk: the BF16 recent window there stays cached (``KVCacheManager._keep_restore_points``) although each long
    follow-up allocates BF16 pages of its own (OSCAR's BF16 pool holds windows only: 44 pages here). Without it the
    request recomputed all 4 096 tokens. The window a chunk earlier stays too (a request diverging there)."""
    engine = followup.followup_engine(PagedLM.random(CONFIG), "oscar", 1 << 28, 512, 512)
    prefix = followup._ids(engine, 4096 + 256, 1)
    followup.cache_prefix(engine, prefix)
    for seed in range(6):
        assert followup.followup_step(engine, prefix, 512, seed, False, True)["hit_tokens"] == len(prefix)
    for ids, hit in ((prefix + [3], 4096), (prefix[:4000] + [3], 3584)):  # the second diverges a chunk earlier
        hits = engine.manager.hit_tokens
        engine.add_request(f"new{hit}", ids, SamplingParams(max_tokens=1, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()
        assert engine.manager.hit_tokens - hits == hit


def test_a_long_prompt_between_turns_leaves_the_document_cached():
    """OSCAR's BF16 pool holds windows only (45 pages here): a 4K prompt between two turns on a 4K document
    allocates ~8 times that. Its own demoted pages go first in the eviction order (``PagePool.release_all`` with
    ``stale``), a hit's pages (the document's end, demoted by a turn) and a finished sequence's (tail first) as
    recently used; before, the prompt evicted the document's sink page and the next turn hit nothing."""
    engine = followup.followup_engine(PagedLM.random(CONFIG), "oscar", 1 << 28, 512, 512)
    prefix = followup._ids(engine, 4096 + 256, 1)
    followup.cache_prefix(engine, prefix)
    assert followup.followup_step(engine, prefix, 512, 0, False, True)["hit_tokens"] == len(prefix)
    engine.add_request("other", followup._ids(engine, 4096, 77), SamplingParams(max_tokens=1, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert followup.followup_step(engine, prefix, 64, 9, False, True)["hit_tokens"] == len(prefix)
