"""Prefix-cache events in vLLM's wire format: a ZMQ subscriber decodes every batch with msgpack and
replays BlockStored / BlockRemoved; the set of block hashes it ends with must be exactly the page keys the
engine's pools hold (BF16 and INT2), after waves of requests sharing prefixes in pools small enough to
evict. Every stored block carries one page of tokens, and its parent is a block stored before it (or
``None`` for a sequence's first page).
"""

import time

import pytest

from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, make_artifact, prompts, run, tiny_model

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")
from oscarkv.server.kv_events import KVEventPublisher  # noqa: E402
from oscarkv.server.replicas import free_ports  # noqa: E402


def held_keys(engine: LLMEngine) -> set[bytes]:
    pools = [engine.manager.bf16, engine.manager.int2]
    return {k for p in pools if p is not None for k in p._page_of}


def receive(sub, until: float) -> list:
    """Every message until ``until`` seconds pass with none: ``(seq, [ts, events, dp_rank])``."""
    out = []
    while sub.poll(int(until * 1000)):
        topic, seq, payload = sub.recv_multipart()
        out.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload, raw=False)))
    return out


def test_events_follow_the_pools():
    model = tiny_model()
    cfg = engine_config("oscar", kv_memory_bytes=65_536, bf16_fraction=0.5, prefill_chunk=16,
                        max_num_batched_tokens=32)
    engine = LLMEngine.from_hf(model, cfg, make_artifact(model.config))
    ctx, port = zmq.Context(), free_ports(1)[0]
    publisher = KVEventPublisher(f"tcp://127.0.0.1:{port}", cfg.kv.page_size)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    time.sleep(0.3)  # a SUB socket sees only what is sent after it joined
    engine.manager.watch(publisher)
    shared = prompts(1, 40, seed=7)[0]
    sp = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    for wave in range(3):
        run(engine, [shared + p for p in prompts(3, 9 + wave, seed=wave)], sp)
    msgs = receive(sub, 0.5)
    publisher.close()
    sub.close()
    ctx.term()

    assert [s for s, _ in msgs] == list(range(len(msgs)))
    held, seen_stored, removed = set(), set(), 0
    for _, (ts, events, dp_rank) in msgs:
        assert isinstance(ts, float) and dp_rank == 0
        for e in events:
            hashes = set(e["block_hashes"])
            if e["type"] == "BlockStored":
                assert e.keys() == {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                                    "medium", "lora_name"}
                assert len(e["token_ids"]) == e["block_size"] == cfg.kv.page_size and e["medium"] == "GPU"
                assert e["parent_block_hash"] is None or e["parent_block_hash"] in seen_stored
                assert not held & hashes
                held |= hashes
                seen_stored |= hashes
            else:
                assert e["type"] == "BlockRemoved" and hashes <= held
                held -= hashes
                removed += 1
    assert removed > 0, "the pools should have been small enough to evict"
    assert held == held_keys(engine) and held
