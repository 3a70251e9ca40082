"""Tensor parallelism over two "nodes" on loopback: node 0 is this process's engine (rank 0), node 1 is
``oscarkv serve --nnodes 2 --node-rank 1`` in a subprocess, as a user starts it on a second host; they
meet at node 0's TCP store (gloo on the CPU). Greedy tokens must equal one process's. A node that never
arrives fails the start within ``--rendezvous-timeout`` with an error naming the rendezvous, on node 0
and on node 1 alike.
"""

import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from oscarkv.config import DistributedConfig
from oscarkv.engine.engine import LLMEngine
from oscarkv.engine.rendezvous import RendezvousError
from oscarkv.engine.request import SamplingParams
from tests.engine.conftest import engine_config, make_artifact, prompts, run, tiny_model

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(rank: int, port: int, timeout: float = 60.0) -> subprocess.Popen:
    """``oscarkv serve`` as node ``rank`` of 2 (no model: its ranks get theirs from node 0)."""
    cmd = [sys.executable, "-m", "oscarkv.cli", "serve", "--device", "cpu", "--tensor-parallel-size", "2",
           "--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
           "--rendezvous-timeout", str(timeout)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)


def two_nodes(port: int, timeout: float = 60.0) -> DistributedConfig:
    return DistributedConfig(nnodes=2, node_rank=0, master_port=port, rendezvous_timeout=timeout)


def test_two_nodes_equal_one_process():
    model = tiny_model()
    art = make_artifact(model.config)
    cfg = engine_config("oscar", kv_memory_bytes=65_536, bf16_fraction=0.5)
    ps = prompts(3, 21, seed=5)
    sp = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    want = [o.token_ids for o in run(LLMEngine.from_hf(tiny_model(), cfg, art), ps, sp)]
    port = free_port()
    other = node(1, port)
    try:
        two = LLMEngine.from_hf(model, replace(cfg, tensor_parallel_size=2, kv_memory_bytes=cfg.kv_memory_bytes // 2,
                                               distributed=two_nodes(port)), art)
        try:
            assert [o.token_ids for o in run(two, ps, sp)] == want
        finally:
            two.close()
        assert other.wait(timeout=60) == 0, other.stderr.read()
    finally:
        other.kill()


def test_node_that_never_arrives_fails_in_bounded_time():
    model, start = tiny_model(), time.monotonic()
    cfg = replace(engine_config("bf16"), tensor_parallel_size=2, distributed=two_nodes(free_port(), timeout=2.0))
    with pytest.raises(RendezvousError, match=r"rendezvous at tcp://127\.0\.0\.1:\d+ failed: waited 2 s for the 2 "
                                              r"tensor-parallel ranks of 2 nodes"):
        LLMEngine.from_hf(model, cfg)
    assert time.monotonic() - start < 30


def test_node_without_node_0_exits_with_a_clear_error():
    start, lone = time.monotonic(), node(1, free_port(), timeout=2.0)
    _, err = lone.communicate(timeout=60)
    assert lone.returncode == 1 and time.monotonic() - start < 60
    assert "rank 1 could not reach node 0 within 2 s" in err and "oscarkv-tp1 exited with code 1" in err
