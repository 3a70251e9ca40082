"""Prefix-cache events in vLLM's KV-event wire format, published over ZMQ, for routers that follow the cache.

Role: :class:`KVEventPublisher` is a :class:`~oscarkv.cache.events.CacheObserver` of the engine's
manager (``KVCacheManager.watch``). The engine's thread only appends events to a list; a publisher thread
sends them every :data:`FLUSH_S` as one batch on a ZMQ PUB socket bound to
``ServerConfig.kv_events_endpoint`` (``tcp://*:5557``), so routers (vllm-router's ``kv_aware`` policy
with ``--kv-event-source``, llm-d, Dynamo) subscribe as they do to vLLM.

Wire format (vLLM's ``vllm/distributed/kv_events.py``, msgpack; the batch an array, each event a map
tagged by ``type``, as vllm-router's ``kv_aware`` decodes them): each message is three frames
``(topic, seq, payload)``: the topic (empty), an 8-byte big-endian sequence number from 0, and
``payload = [ts, events, data_parallel_rank]`` where an event is
``{type: "BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
lora_name}``, ``{type: "BlockRemoved", block_hashes, medium}`` or ``{type: "AllBlocksCleared"}``
(vllm-router refuses an event array, "KV event must be a tagged map", and a batch map, "KV event batch
must be an array"). A block is one page
(``block_size`` = ``KVConfig.page_size`` tokens); its hash is oscarkv's page key (32 bytes: it chains
the previous page's key, the tokens and how they were chunked), so a consumer that hashes tokens itself
uses ``token_ids``. ``medium`` is ``"GPU"`` for a page held in either tier (BF16 or INT2). NOTE: no
replay socket: a subscriber that joins late sees only later events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import msgpack
import zmq

log = logging.getLogger(__name__)

FLUSH_S = 0.02
"""Seconds between batches: events of one engine step mostly leave together."""
MEDIUM = "GPU"
"""The medium vLLM names device memory with; both KV tiers live there."""


def stored(keys: list[bytes], parent: bytes | None, tokens: Sequence[int], block_size: int) -> dict:
    return {"type": "BlockStored", "block_hashes": keys, "parent_block_hash": parent, "token_ids": list(tokens),
            "block_size": block_size, "lora_id": None, "medium": MEDIUM, "lora_name": None}


def removed(keys: list[bytes]) -> dict:
    return {"type": "BlockRemoved", "block_hashes": keys, "medium": MEDIUM}


def batch(events: list[dict], dp_rank: int = 0) -> bytes:
    """One batch's payload: ``[ts, events, data_parallel_rank]``, msgpack."""
    return msgpack.packb([time.time(), events, dp_rank], use_bin_type=True)


class KVEventPublisher:
    """Queue the cache's events (engine thread), publish them in batches (own thread); ``close()`` flushes."""

    def __init__(self, endpoint: str, block_size: int, dp_rank: int = 0) -> None:
        self.block_size, self.dp_rank = block_size, dp_rank
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)  # NOTE: zmq.ZMQError when the port is taken: the server does not start
        self._pending: list[dict] = []
        self._lock, self._stop, self._seq = threading.Lock(), threading.Event(), 0
        self._thread = threading.Thread(target=self._run, name="oscarkv-kv-events", daemon=True)
        self._thread.start()

    def stored(self, key: bytes, parent: bytes | None, tokens: Sequence[int]) -> None:
        self._add(stored([key], parent, tokens, self.block_size))

    def removed(self, key: bytes) -> None:
        self._add(removed([key]))

    def cleared(self) -> None:
        self._add({"type": "AllBlocksCleared"})

    def _add(self, event: dict) -> None:
        with self._lock:
            self._pending.append(event)

    def _run(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self._flush()
        self._flush()

    def _flush(self) -> None:
        with self._lock:
            events, self._pending = self._pending, []
        if events:
            self._pub.send_multipart([b"", self._seq.to_bytes(8, "big"), batch(events, self.dp_rank)])
            self._seq += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pub.close()
        self._ctx.term()
