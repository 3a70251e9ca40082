"""Lab: a tiny tensor-parallel engine on two GPUs, step by step with timestamps (``kill -USR1`` any of its
processes for their Python stacks). ``python -m lab.benchmarks.tp_debug [bf16|oscar ...]``"""

import faulthandler
import signal
import sys
import time

import torch

from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, make_artifact, prompts, tiny_model

T0 = time.perf_counter()


def say(*a):
    print(f"[{time.perf_counter() - T0:7.2f}s]", *a, flush=True)


def one(method: str, graphs: bool, overlap: bool) -> None:
    model = tiny_model().to("cuda:0", torch.bfloat16)
    art = make_artifact(model.config) if method == "oscar" else None
    say(method, "graphs", graphs, "overlap", overlap, "building")
    engine = LLMEngine.from_hf(model, engine_config(method, tensor_parallel_size=2, overlap=overlap), art,
                               cuda_graphs=graphs)
    say("built")
    for i, p in enumerate(prompts(3, 30, seed=9)):
        engine.add_request(f"r{i}", p, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    n = 0
    while engine.has_unfinished():
        outs = engine.step()
        n += 1
        say("step", n, [(o.request_id, len(o.token_ids), o.finish_reason) for o in outs if o.finished])
    engine.close()
    say("closed")


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    for m in sys.argv[1:] or ["bf16"]:
        one(m, graphs=True, overlap=True)
