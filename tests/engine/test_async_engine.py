"""AsyncEngine: concurrent streams equal offline results; cancelling frees the request;
failures fail their requests and the thread serves on."""

import asyncio

import pytest

from oscarkv.engine.async_engine import AsyncEngine, RequestFailed
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import fail_once, make_engine, prompts, run

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


def test_failures_fail_their_requests_and_the_thread_serves_on(llama, monkeypatch):
    ps = prompts(2, 20, seed=12)
    offline = run(make_engine(llama, "bf16"), ps[1:], SP)[0]
    engine = AsyncEngine(make_engine(llama, "bf16"))

    async def collect(rid, prompt):
        toks = []
        async for out in engine.generate(rid, prompt, SP):
            toks += out.new_token_ids
        return toks

    try:
        with pytest.raises(ValueError, match="prompt is empty"):
            asyncio.run(collect("empty", []))
        fail_once(monkeypatch, engine.engine.runner, "run")  # a failing step: its requests fail
        with pytest.raises(RequestFailed, match="injected failure"):
            asyncio.run(collect("model", ps[0]))
        fail_once(monkeypatch, engine.engine.scheduler, "schedule")  # step() itself raises: all in flight fail
        with pytest.raises(RequestFailed, match="engine step failed"):
            asyncio.run(collect("scheduler", ps[0]))
        assert engine.is_alive()
        assert asyncio.run(collect("ok", ps[1])) == offline.token_ids
        assert not engine.engine.seqs and engine.engine.manager.bf16.num_used == 0
    finally:
        engine.close()
