"""AsyncEngine: concurrent streams equal offline results; cancelling frees the request."""

import asyncio

from oscarkv.engine.async_engine import AsyncEngine
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import make_engine, prompts, run

SP = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def test_streams_match_offline_and_cancel(llama):
    ps = prompts(2, 20, seed=11)
    offline = run(make_engine(llama, "bf16"), ps, SP)
    engine = AsyncEngine(make_engine(llama, "bf16"))

    async def collect(i):
        toks = []
        async for out in engine.generate(f"r{i}", ps[i], SP):
            toks += out.new_token_ids
        return toks

    async def cancel():
        async for out in engine.generate("c", ps[0], SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)):
            if len(out.token_ids) >= 3:
                break  # leaving the stream aborts the request

    async def main():
        return await asyncio.gather(collect(0), collect(1), cancel())

    try:
        a, b, _ = asyncio.run(main())
        assert [a, b] == [o.token_ids for o in offline]
        for _ in range(50):  # the abort is applied by the worker thread
            if not engine.engine.has_unfinished():
                break
            asyncio.run(asyncio.sleep(0.05))
        assert not engine.engine.has_unfinished() and engine.engine.manager.bf16.num_used == 0
    finally:
        engine.close()
