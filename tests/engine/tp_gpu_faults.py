"""Run by ``test_tensor_parallel_gpu`` in a subprocess (a hang there fails by the parent's deadline).

``python -m tests.engine.tp_gpu_faults close``: a tp=2 engine on two GPUs runs requests, then
``close()`` must join its worker. ``... kill``: rank 1 is killed between two steps; every request in
flight must finish with ``finish_reason == "error"`` naming the dead rank, and the engine report the
failure, within a bounded number of steps. Prints ``ok CASE`` on success.
"""

import sys
import time

import torch

from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, make_artifact, prompts, tiny_model


def say(*a) -> None:
    print(f"[{time.perf_counter():.1f}]", *a, flush=True)


def main(case: str) -> None:
    model = tiny_model().to("cuda:0", torch.bfloat16)
    engine = LLMEngine.from_hf(model, engine_config("oscar", tensor_parallel_size=2), make_artifact(model.config))
    proc = engine.runner.procs[0]
    try:
        for i, p in enumerate(prompts(3, 30, seed=9)):
            engine.add_request(f"r{i}", p, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
        for _ in range(4):
            engine.step()
        say("4 steps")
        if case == "kill":
            proc.kill()
            proc.join()
            say("rank 1 killed")
            outs = {}
            for _ in range(20):  # bounded
                outs |= {o.request_id: o for o in engine.step() if o.finished}
                if not engine.has_unfinished():
                    break
            assert set(outs) == {"r0", "r1", "r2"}, outs.keys()
            assert all(o.finish_reason == "error" and "oscarkv-tp1" in o.error for o in outs.values())
            assert "died" in engine.failure()
            say("requests failed")
        else:
            while engine.has_unfinished():
                engine.step()
    finally:
        engine.close()
        say("closed")
    proc.join(timeout=5)
    assert not proc.is_alive()
    print(f"ok {case}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
