"""``Sequence.output``: cumulative output and deltas, with the prompt shared rather than copied."""

from oscarkv.cache.seq_kv import ChunkSchedule
from oscarkv.engine.request import SamplingParams
from oscarkv.engine.sequence import Sequence


def test_output_shares_the_prompt_and_reports_deltas():
    prompt = list(range(100, 137))
    seq = Sequence("r", prompt, SamplingParams(max_tokens=8, temperature=0), ChunkSchedule(len(prompt), 16), 0)
    prompt.append(-1)  # the caller's list is not the sequence's
    outs = []
    for tok in (7, 8, 9):
        seq.token_ids.append(tok)
        outs.append(seq.output())
    assert outs[0].prompt_token_ids == tuple(range(100, 137))
    assert all(o.prompt_token_ids is seq.prompt_ids for o in outs)  # one tuple, never copied per step
    assert [o.token_ids for o in outs] == [[7], [7, 8], [7, 8, 9]]
    assert [o.new_token_ids for o in outs] == [[7], [8], [9]]
    assert seq.token_ids[:seq.num_prompt] == list(seq.prompt_ids)
