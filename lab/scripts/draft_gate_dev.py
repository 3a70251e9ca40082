"""Development data for the draft gate (``lab/scripts/draft_gate_sim.py``): greedy outputs, no speculation, of the
default model on the CPU for five tasks over a document of our own (not the bench's gazetteer), 128 tokens each.

Usage (repository root): python lab/scripts/draft_gate_dev.py SOURCE FIRST_TOKEN TOKENS OUT.json [KV]
(the eleventh session: docs/DESIGN.md 0 1500 and README.md 0 1500, bf16; ~10 min each on one core)."""

import json
import sys

import torch

from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from oscarkv.models.loader import default_model_path, load_model

TASKS = {"copy": "Repeat the text above exactly, word for word, from its first line.",
         "quote": "Quote the first paragraph of the text above exactly.",
         "poem": "Now, without quoting the text above, write a short poem about the sea at night.",
         "summary": "Summarize the text above in five bullet points.",
         "story": "Write a short story about a robot who learns to cook, unrelated to the text above."}


def main(src: str, first: int, n: int, out_path: str, kv: str = "bf16") -> None:
    torch.set_num_threads(1)
    loaded = load_model(str(default_model_path()))
    tok = loaded.tokenizer
    doc = tok.decode(tok.encode(open(src).read(), add_special_tokens=False)[first:first + n])
    eng = LLMEngine.from_hf(loaded.model, EngineConfig(KVConfig(kv), kv_memory_bytes=1 << 27, max_num_seqs=8), None, tok)
    out = {}
    for name, ask in TASKS.items():
        text = tok.apply_chat_template([{"role": "user", "content": f"{doc}\n{ask}"}], tokenize=False,
                                       add_generation_prompt=True)
        out[name] = {"prompt": tok.encode(text, add_special_tokens=False)}
        eng.add_request(name, out[name]["prompt"], SamplingParams(max_tokens=128, temperature=0, ignore_eos=True))
    while eng.has_unfinished():
        for o in eng.step():
            if o.finished:
                out[o.request_id]["output"] = o.token_ids
    json.dump(out, open(out_path, "w"))
    for name, v in out.items():
        print(name, len(v["prompt"]), repr(tok.decode(v["output"])[:150]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], *sys.argv[5:])
