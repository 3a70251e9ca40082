"""Bounded loopback load test on the real default model (SmolLM2-135M, fp32 on the CPU).

64 concurrent streams, 192 requests through the official async ``openai`` client: every
request is answered, each greedy output equals offline ``LLM.generate`` for the same prompt,
and the KV pool is back to its baseline (no pages held, nothing queued) afterwards.
"""

import asyncio

import openai
import pytest
import torch

from oscarkv.config import EngineConfig, KVConfig
from oscarkv.engine.request import SamplingParams
from oscarkv.config import ServerConfig

CONCURRENCY, REQUESTS, MAX_TOKENS, DISTINCT = 64, 192, 4, 16
PROMPTS = [f"Question {i}: what is {i} plus {i + 1}? Answer:" for i in range(DISTINCT)]


@pytest.mark.slow
def test_load_64_streams_equal_offline_and_pool_returns_to_baseline():
    from oscarkv.engine.async_engine import AsyncEngine
    from oscarkv.engine.engine import LLMEngine
    from oscarkv.llm import LLM
    from oscarkv.models.loader import load_model
    from oscarkv.server.app import create_app, served_model
    from oscarkv.server.launch import serving_in_thread

    loaded = load_model("default", torch.float32)
    cfg = EngineConfig(KVConfig("bf16"), kv_memory_bytes=1 << 27, max_num_seqs=CONCURRENCY)
    sp = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True)
    want = [o.text for o in LLM(loaded, kv="bf16", config=cfg).generate(PROMPTS, sp)]

    llm = LLMEngine.from_hf(loaded.model, cfg, None, loaded.tokenizer)
    engine = AsyncEngine(llm)
    scfg = ServerConfig(served_model_name="default")
    app = create_app(engine, served_model(llm, loaded.config, loaded.tokenizer, "default", scfg), scfg)
    baseline = (llm.manager.bf16.num_used, len(llm.scheduler.waiting))
    try:
        with serving_in_thread(app) as url:
            sem = asyncio.Semaphore(CONCURRENCY)

            async def one(client, i: int) -> tuple[int, str, int]:
                async with sem:
                    text, n = "", 0
                    stream = await client.completions.create(
                        model="default", prompt=PROMPTS[i % DISTINCT], max_tokens=MAX_TOKENS, temperature=0,
                        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
                    async for chunk in stream:
                        text += "".join(c.text for c in chunk.choices)
                        n = chunk.usage.completion_tokens if chunk.usage else n
                    return i, text, n

            async def main():  # the client is closed inside its own loop (see test_openai_client)
                async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                              timeout=600) as client:
                    return await asyncio.gather(*[one(client, i) for i in range(REQUESTS)])

            results = asyncio.run(main())
            for _ in range(100):  # the last aborts/frees are applied by the engine thread
                if not llm.has_unfinished():
                    break
                asyncio.run(asyncio.sleep(0.05))
    finally:
        engine.close()
    assert len(results) == REQUESTS and all(n == MAX_TOKENS for _, _, n in results)
    assert [t for _, t, _ in results] == [want[i % DISTINCT] for i, _, _ in results]
    assert (llm.manager.bf16.num_used, len(llm.scheduler.waiting)) == baseline == (0, 0)
    llm.manager.bf16.check()
