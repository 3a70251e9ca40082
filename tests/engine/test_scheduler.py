"""Scheduler and prefix cache on the real serving path: hits, preemption, tiers, sampling."""

import torch

from oscarkv.engine.request import SamplingParams
from oscarkv.quant.bpe import tiers
from oscarkv.engine.engine import LLMEngine
from tests.engine.conftest import WINDOWS, engine_config, make_engine, prompts, run

GREEDY = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=True)


def test_prefix_hit_identical_to_cold(llama, artifact):
    base = prompts(1, 70, seed=3)[0]
    b = base[:66] + [5, 6, 7, 8, 9]
    warm = make_engine(llama, "oscar", artifact, prefill_chunk=16, max_num_batched_tokens=32)
    run(warm, [base])
    hot = run(warm, [b])[0]
    assert warm.manager.hit_tokens == 64  # the last chunk start inside b's prompt
    cold = run(make_engine(llama, "oscar", artifact, prefill_chunk=16, max_num_batched_tokens=32), [b])[0]
    assert hot.token_ids == cold.token_ids
    assert hot.logprobs == cold.logprobs  # same bytes, same arithmetic


def _follow_up(engine, doc, params, resume):
    engine.add_request("f", doc, params, resume=resume)
    out = None
    while engine.has_unfinished():
        for o in engine.step():
            out = o if o.finished else out
    return out


def test_follow_up_resumes_the_cached_partial_chunk(llama, artifact):
    """A follow-up turn that names where the first turn's prompt ended (``resume``) hits that prompt's last, partial
    chunk down to its page (the first turn's schedule is unchanged) and gives what a cold run of its schedule gives;
    without ``resume`` the hit stops at the last chunk start."""
    doc = prompts(1, 75, seed=8)[0]  # chunks of 32: [0, 32), [32, 64), [64, 75); pages of 8
    follow = doc + [3, 1, 4, 1, 5, 9, 2, 6, 5]
    kw = dict(prefill_chunk=32, max_num_batched_tokens=48)
    warm = make_engine(llama, "oscar", artifact, **kw)
    first = run(warm, [doc])[0]
    hot = _follow_up(warm, follow, GREEDY, (len(doc),))
    assert warm.manager.hit_tokens == 72  # 75 rounded down to a page, past the chunk start 64
    cold_engine = make_engine(llama, "oscar", artifact, **kw)
    cold = _follow_up(cold_engine, follow, GREEDY, (len(doc),))
    assert cold_engine.manager.hit_tokens == 0
    assert hot.token_ids == cold.token_ids and hot.logprobs == cold.logprobs  # same bytes, same arithmetic
    plain = make_engine(llama, "oscar", artifact, **kw)
    assert run(plain, [doc])[0].token_ids == first.token_ids  # resume never changes the first turn
    _follow_up(plain, follow, GREEDY, ())
    assert plain.manager.hit_tokens == 64


def test_third_turn_hits_the_second_turns_chunks(llama, artifact):
    """After a resume point chunks run ``prefill_chunk`` long from it (a 28-token follow-up is one chunk, not two
    cut at a multiple of 32); a third turn resuming at both earlier ends reproduces the second turn's chunks: it
    hits down to the second turn's end (rounded to a page) and gives what a cold run gives."""
    doc = prompts(1, 75, seed=8)[0]
    second = doc + prompts(1, 25, seed=9)[0]  # ends at 100
    third = second + [3, 1, 4, 1, 5, 9, 2, 6]
    kw = dict(prefill_chunk=32, max_num_batched_tokens=48)
    warm = make_engine(llama, "oscar", artifact, **kw)
    assert warm.admission.validate("s", second, GREEDY, resume=(75,)).schedule.starts() == [0, 32, 64, 72]
    run(warm, [doc])
    _follow_up(warm, second, GREEDY, (75,))
    before = warm.manager.hit_tokens
    hot = _follow_up(warm, third, GREEDY, (75, 100))
    assert warm.manager.hit_tokens - before == 96
    cold = _follow_up(make_engine(llama, "oscar", artifact, **kw), third, GREEDY, (75, 100))
    assert hot.token_ids == cold.token_ids and hot.logprobs == cold.logprobs


def test_chat_follow_up_resumes_where_the_turn_marker_ends(llama, artifact):
    """``EngineConfig.resume_turns``: a prompt holding the chat template's assistant prefix (here a stand-in marker)
    resumes where it ends, as an explicit ``resume`` would; without the marker (or with the flag off) nothing changes."""
    from dataclasses import replace

    from oscarkv.engine.admission import turn_ends

    marker = (7, 7, 7)
    doc = prompts(1, 72, seed=8)[0] + list(marker)  # the first turn's prompt ends with the assistant prefix
    follow = doc + [3, 1, 4, 1, 5, 9] + list(marker)
    assert turn_ends(follow, marker) == (75, 84) and turn_ends(doc[:-1], marker) == ()
    kw = dict(prefill_chunk=32, max_num_batched_tokens=48)
    for on, hit in ((True, 72), (False, 64)):
        engine = make_engine(llama, "oscar", artifact, resume_turns=on, **kw)
        engine.admission = replace(engine.admission, turn_marker=marker if on else ())
        run(engine, [doc])
        _follow_up(engine, follow, GREEDY, ())
        assert engine.manager.hit_tokens == hit


def test_a_new_question_on_a_document_resumes_at_its_line(llama, artifact):
    """``Admission.lines``: a long single-turn prompt resumes at its last line, so another question on the same
    document hits every page before that line, and gives what a cold run of it gives (a function of the prompt);
    without it the hit stops at the last chunk start. Short or multi-turn prompts get no line resume point."""
    from dataclasses import replace

    import numpy as np

    from oscarkv.engine.admission import LineStarts

    nl = 5  # a stand-in newline token
    lines = LineStarts(np.arange(64) == nl, np.zeros(64, dtype=bool))
    doc = [t if t != nl else 6 for t in prompts(1, 150, seed=9)[0]] + [nl]  # the question's line starts at 151
    asks = [doc + [3, 1, 4, 1], doc + [2, 7, 1, 8, 2]]
    kw = dict(prefill_chunk=32, max_num_batched_tokens=48)

    def engine(on: bool) -> LLMEngine:
        e = make_engine(llama, "oscar", artifact, **kw)
        e.admission = replace(e.admission, lines=lines if on else None)
        return e

    hot = {}
    for on, hit in ((True, 144), (False, 128)):  # pages of 8: 151 rounds down to 144; chunks of 32 from 0: 128
        warm = engine(on)
        run(warm, [asks[0]])
        hot[on] = run(warm, [asks[1]])[0]
        assert warm.manager.hit_tokens == hit
    cold = run(engine(True), [asks[1]])[0]
    assert hot[True].token_ids == cold.token_ids and hot[True].logprobs == cold.logprobs
    adm = engine(True).admission
    assert adm.question(np.array(asks[0])) == (151,) and adm.question(np.array(asks[0][-60:])) == ()  # too short
    turns = replace(adm, turn_marker=(7, 7))
    assert turns.validate("t", doc[:100] + [7, 7] + asks[0][100:], GREEDY).schedule.resume == (96,)  # its turn only
    from tests.byte_llama import byte_tokenizer  # EngineConfig.resume_questions: line starts from the tokenizer

    built = [LLMEngine.from_hf(llama, engine_config(resume_questions=on), artifact, byte_tokenizer()) for on in (1, 0)]
    assert built[0].admission.lines.newline[byte_tokenizer()("\n").input_ids[-1]] and built[1].admission.lines is None


def test_preemption_resumes_exactly(llama, artifact):
    ps = [p[:24] for p in prompts(3, 24, seed=4)]
    params = [SamplingParams(max_tokens=20, temperature=0.8 if i % 2 else 0, seed=i, ignore_eos=True, logprobs=True)
              for i in range(len(ps))]
    roomy = run(make_engine(llama, "oscar", artifact), ps, params)
    tight = make_engine(llama, "oscar", artifact, kv_memory_bytes=65_536, bf16_fraction=0.5)
    preempted = []
    orig = tight.scheduler._preempt
    tight.scheduler._preempt = lambda seq, out: (preempted.append(seq.request_id), orig(seq, out))
    outs = run(tight, ps, params)
    assert preempted, "the pool was meant to be too small for all three requests"
    for a, b in zip(roomy, outs):
        assert a.token_ids == b.token_ids and len(b.token_ids) == 20
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert tight.manager.bf16.num_used == 0 and tight.manager.int2.num_used == 0  # nothing leaked


def test_tier_boundaries_at_every_step(llama, artifact):
    engine = make_engine(llama, "oscar", artifact, prefill_chunk=16, max_num_batched_tokens=32)
    seen = []

    def check(e):
        for seq in e.scheduler.running:
            got = e.manager.tier_tokens(seq)
            assert got == tuple(tiers(seq.num_computed, WINDOWS["sink"], WINDOWS["recent"], WINDOWS["page_size"]))
            seen.append(got)
    run(engine, prompts(2, 20, seed=5) + [[1, 2, 3, 4, 5]], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True), on_step=check)
    assert any(h > 0 for _, h, _ in seen) and any(s < WINDOWS["sink"] for s, _, _ in seen)


def test_sampling_seed_batch_invariant_and_topk1_is_greedy(llama, artifact):
    ps = prompts(3, 25, seed=6)
    sp = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=20, seed=7, ignore_eos=True)
    alone = run(make_engine(llama, "naive"), ps[:1], sp)[0]
    batched = run(make_engine(llama, "naive"), ps, sp)[0]
    assert alone.token_ids == batched.token_ids
    top1 = run(make_engine(llama, "naive"), ps[:1], SamplingParams(max_tokens=12, top_k=1, seed=1, ignore_eos=True))[0]
    greedy = run(make_engine(llama, "naive"), ps[:1], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    assert top1.token_ids == greedy.token_ids


class _Tok:
    """A tokenizer stand-in: token i is the word ``w{i}``."""

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(f"w{i}" for i in ids)


def test_stop_tokens_strings_and_max_tokens(llama):
    p = prompts(1, 20, seed=8)[0]
    free = run(make_engine(llama, "bf16"), [p], GREEDY)[0]
    third = free.token_ids[2]
    first_at = free.token_ids.index(third)
    stopped = run(make_engine(llama, "bf16"), [p], SamplingParams(max_tokens=20, temperature=0, stop_token_ids=(third,)))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[:first_at + 1]
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    engine = LLMEngine.from_hf(llama, engine_config("bf16"), None, _Tok())
    word = f"w{free.token_ids[4]}"
    out = run(engine, [p], SamplingParams(max_tokens=20, temperature=0, stop=(word,), ignore_eos=True))[0]
    assert out.finish_reason == "stop" and word not in out.text
    assert all(lp <= 0 for lp in free.logprobs) and len(free.logprobs) == 20


def test_prompt_logprobs_are_teacher_forced(llama):
    p = prompts(1, 20, seed=9)[0]
    out = run(make_engine(llama, "bf16"), [p], SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1))[0]
    with torch.no_grad():
        ref = torch.log_softmax(llama(torch.tensor([p])).logits[0, :-1].float(), -1)
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(p)
    for i, row in enumerate(out.prompt_logprobs[1:]):
        assert abs(row[p[i + 1]] - float(ref[i, p[i + 1]])) < 1e-4
        assert int(ref[i].argmax()) in row
