"""Two replicas of the default model behind vllm-router, on the CPU, as users start them:
``oscarkv serve --data-parallel-size 2``. Requests sharing a long prefix all land on one replica under
``cache_aware`` (its prefix cache serves them: a higher hit rate than ``round_robin``'s over the same
replicas, which splits them); their answers equal ``LLM.generate``'s. Then the replica streaming a long
answer is killed: that stream ends with an error, within the timeout, and the next requests are answered
by the survivor, equal to ``LLM.generate``'s. Skipped without vllm-router (the ``router`` extra).
"""

import os
import sys

import pytest

pytest.importorskip("vllm_router")
pytest.importorskip("zmq")

from oscarkv.bench.router import Fleet, failover, hit_rate, prefix_prompts, router  # noqa: E402
from oscarkv.config import EngineConfig  # noqa: E402
from oscarkv.engine.request import SamplingParams  # noqa: E402
from oscarkv.llm import LLM  # noqa: E402

pytestmark = pytest.mark.slow
MEMORY = 64 << 20
SERVE = ["--device", "cpu", "--kv-memory-bytes", str(MEMORY)]
TOKENS = 4


def expected(prompts: list[str]) -> list[str]:
    """``LLM.generate``'s answers with the recipe ``serve`` applies (the shipped artifact's) and the replicas' memory."""
    from oscarkv.config import KVConfig
    from oscarkv.data import default_rotations_dir
    from oscarkv.quant.artifact import Artifact, apply_recipe

    kv = apply_recipe(KVConfig(), Artifact.load(default_rotations_dir()))
    llm = LLM("default", device="cpu", config=EngineConfig(kv, kv_memory_bytes=MEMORY))
    with llm:
        return [o.text for o in llm.generate(prompts, SamplingParams(max_tokens=TOKENS, temperature=0))]


def test_two_replicas_behind_vllm_router(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(sys.path))  # the replicas import this checkout
    aware_prompts, robin_prompts = prefix_prompts(3, 400, "a"), prefix_prompts(3, 400, "b")
    after = prefix_prompts(2, 40, "d")
    want = expected(aware_prompts + after)
    with Fleet.start(2, SERVE) as fleet:
        aware = hit_rate(fleet.router, fleet.replicas, aware_prompts, TOKENS)
        with router(fleet.replicas, "round_robin") as rr:
            robin = hit_rate(rr, fleet.replicas, robin_prompts, TOKENS)
        fail = failover(fleet, prefix_prompts(1, 40, "c")[0], 300, after, TOKENS)
    print(f"cache_aware {aware['hit_rate']:.3f} {aware['queries_per_replica']}, "
          f"round_robin {robin['hit_rate']:.3f} {robin['queries_per_replica']}, failover {fail}")
    assert sorted(q > 0 for q in aware["queries_per_replica"]) == [False, True]  # one replica took them all
    assert all(q > 0 for q in robin["queries_per_replica"])
    assert aware["hit_rate"] > robin["hit_rate"] > 0
    assert aware["texts"] == want[:3]
    f = fail["in_flight"]
    assert not f["hung"] and f["events"] < 300 and ("error" in f or "[DONE]" not in f.get("last", ""))
    assert fail["after"] == [(200, t) for t in want[3:]], fail.get("log_tail")
