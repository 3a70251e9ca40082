"""Tensor-parallel worker processes: rank 0 (the engine's process) schedules, every rank runs its shard.

Role: with ``EngineConfig.tensor_parallel_size = n > 1`` the engine's runner is a
:class:`ParallelRunner`. It starts ranks ``1 .. n-1`` as processes of its own
(``torch.multiprocessing``, spawn; no launcher) and joins them in a torch.distributed group
(``oscarkv.engine.rendezvous``): the default group carries the device collectives (NCCL on CUDA, rank
``r`` on ``cuda:r``; gloo on the CPU), a second gloo group the host messages. On several hosts
(``EngineConfig.distributed``) node 0 starts its own ranks only, and every other node runs
:func:`run_node`, which starts that node's ranks (rank ``n k + i`` on the ``i``-th device of node ``n``);
they meet at node 0's TCP store. Rank 0 sends every rank the :class:`RankSpec` (config, engine config,
backend; over the gloo group), then the codecs of its KV heads and its shard of the unfolded
weights (``oscarkv.models.parallel.rank_tensors``), tensor by tensor over the device group. Every rank folds its value codecs into its
shard and sizes its own pools from ``kv_memory_bytes`` (a per-device budget) for its KV heads,
so every rank has the same pages (checked at start-up); rank 0's
:class:`~oscarkv.cache.manager.KVCacheManager` decides for all of them.

Per step (:meth:`ParallelRunner.run`):

1. rank 0 broadcasts the step's write plans on the gloo group as one ``int32`` tensor
   (``oscarkv.engine.step_plan_codec``: no pickling; the INT2 views as deltas against the last step's);
2. every rank builds the same tables from them, receives rank 0's input ids by a device broadcast
   (``ModelRunner._fill_ids``: tokens of a step launched ahead stay on the device) and runs its
   shard: two all-reduces per layer (``RowParallelLinear`` through ``oscarkv.models.allreduce``, of the kind
   rank 0 resolved from ``EngineConfig.tensor_parallel_all_reduce`` and sent in the spec), inside the CUDA
   graph on CUDA;
3. rank 0 alone forms logits and samples; the other ranks wait for the next plans.

Failure: a rank that dies (or a step that fails on rank 0 after the plans went out, which leaves
the ranks out of step, or a rank of another node that died) ends the group: the step raises :class:`WorkerDied`, whose message names the
rank and its exit code, and so does every later step, so the engine fails the requests in flight
(``finish_reason == "error"``) instead of waiting. Gloo sees a dead peer's closed connection at
once; on CUDA a watcher thread aborts the NCCL group when a worker process exits (untested here:
no GPU), and collectives time out after :data:`oscarkv.engine.rendezvous.STEP_TIMEOUT`. A worker whose rank 0 dies sees the connection close and exits.
``close()`` sends a ``STOP`` message (the workers leave their loop), joins them and tears the groups down.
:meth:`ParallelRunner.replay` and :meth:`ParallelRunner.profile` replay (or profile) a decode graph on every
rank at once, for benchmarks: a rank's graph holds all-reduces and replays only with the others'.

NOTE: one tensor-parallel engine per process: the group is torch.distributed's default group. The
workers are spawned, so they import the main module: a script that builds a tensor-parallel engine
needs the ``if __name__ == "__main__":`` guard (``python -m oscarkv.cli`` needs none).
"""

from __future__ import annotations

import faulthandler
import json
import logging
import multiprocessing.connection
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from oscarkv.attention.step import AttentionBackend
from oscarkv.config import EngineConfig
from oscarkv.engine.model_runner import ModelRunner, PendingIds, RunnerOutput
from oscarkv.engine.runner_build import build_runner, history_page_bytes
from oscarkv.engine.rank_profile import FUNCTIONS, OFF, OPERATORS, HostProfile, kernel_profile
from oscarkv.engine.rendezvous import Rendezvous, join
from oscarkv.engine.scheduler import ScheduledChunk
from oscarkv.engine.step_plan_codec import (CAPTURE, HEADER, HOST_PROFILE, PROFILE, REPLAY, STEP, STOP, Channel, PlanDecoder,
                                            PlanEncoder, control, header)
from oscarkv.models.allreduce import make_all_reduce, resolve
from oscarkv.models.llama import PagedLM
from oscarkv.models.parallel import TensorParallel, check_shardable, rank_tensors, shard_codecs, sharded_model
from oscarkv.quant.codec import KVCodec

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 30.0
"""Seconds ``close()`` gives a worker to leave before it is killed."""
LEAVE_TIMEOUT_S = 10.0
"""Seconds a rank waits to leave the groups (``destroy_process_group``) before it goes on without it."""


class WorkerDied(RuntimeError):
    """A tensor-parallel rank died, or the ranks fell out of step: the engine can run no more steps."""


@dataclass
class RankSpec:
    """What every rank builds its runner from, besides its weights and codecs (no tensors; rank 0 sends it over
    the gloo group once the ranks have joined, so that a rank on another node needs nothing else)."""

    config: Any  # the whole model's transformers config
    cfg: EngineConfig
    backend: AttentionBackend
    graph_buckets: tuple[int, ...]
    dtype: torch.dtype
    all_reduce: str  # the row-parallel all-reduce every rank builds: rank 0's choice (allreduce.resolve), never "auto"
    page_bytes: int = 0  # the largest rank's history page (a per-head allocation: ranks' pages differ), sized by all


def largest_page(codec: KVCodec, config, cfg: EngineConfig) -> int:
    """The largest history page (bytes, every layer) of any rank's shard of ``codec``: a per-head allocation stores
    each rank's KV heads at their own bits, and every rank must hold as many pages (``RankSpec.page_bytes``)."""
    size, heads = cfg.tensor_parallel_size, config.num_key_value_heads
    if codec.config.method == "bf16":
        return 0
    ranks = [TensorParallel(r, size) for r in range(size)]
    return max(history_page_bytes(shard_codecs(codec.layers, heads, tp), config, len(range(heads)[tp.kv_heads(heads)]),
                                  cfg.kv.page_size) for tp in ranks)


def _send_shard(model: PagedLM, codec: KVCodec, tp: TensorParallel, control, device: torch.device) -> None:
    """Rank 0: rank ``tp.rank``'s codecs (pickled, on the gloo group) and weights (tensor by tensor on the
    device group, through rank 0's ``device``: GPU to GPU with NCCL; no shared memory, no second copy of
    the model; a model held on the host goes up one tensor at a time)."""
    config = model.config
    dist.send_object_list([shard_codecs(codec.layers, config.num_key_value_heads, tp)], dst=tp.rank, group=control)
    for _, t in rank_tensors(model.state_dict(), config, tp):
        dist.send(t.to(device), dst=tp.rank)


def _receive_shard(spec: RankSpec, tp: TensorParallel, device: torch.device, control) -> ModelRunner:
    """A worker: its codecs and weights from rank 0 (:func:`_send_shard`), then its runner."""
    codecs: list = [None]
    dist.recv_object_list(codecs, src=0, group=control)
    model = sharded_model(spec.config, tp, spec.dtype, device)
    for _, p in sorted(model.state_dict().items()):
        dist.recv(p, src=0)  # NOTE: in place; a tied lm_head is its embedding, received twice
    return build_runner(model, codecs[0], spec.cfg, spec.backend, spec.graph_buckets, tp, spec.page_bytes)


def _local_shard(model: PagedLM, codec: KVCodec, spec: RankSpec, tp: TensorParallel, device: torch.device) -> ModelRunner:
    """Rank 0's own shard, copied tensor by tensor from the whole model, and its runner."""
    shard = sharded_model(model.config, tp, spec.dtype, device)
    mine = shard.state_dict()
    for key, t in rank_tensors(model.state_dict(), model.config, tp):
        mine[key].copy_(t)
    codecs = shard_codecs(codec.layers, model.config.num_key_value_heads, tp)
    return build_runner(shard, codecs, spec.cfg, spec.backend, spec.graph_buckets, tp, spec.page_bytes)


def _device(base: torch.device, local: int) -> torch.device:
    """The device of a node's ``local``-th rank: the ``local``-th GPU after ``base``, or the CPU."""
    return torch.device("cuda", (base.index or 0) + local) if base.type == "cuda" else base


def _with_all_reduce(tp: TensorParallel, spec: RankSpec, device: torch.device) -> TensorParallel:
    """``tp`` with the all-reduce rank 0 chose (every rank at once: a symmetric buffer is a collective),
    sized for a decode step's ``[B, D]`` at the largest graph bucket."""
    rows = max(spec.graph_buckets, default=1)
    reduce = make_all_reduce(spec.all_reduce, tp.group, device, spec.dtype, rows * spec.config.hidden_size, rows)
    return replace(tp, reduce=reduce)


def _handshake(runner: ModelRunner, control, size: int) -> None:
    """Every rank's pool geometry, compared on rank 0 (the manager there decides pages for all)."""
    geos: list = [None] * size
    dist.all_gather_object(geos, runner.pools.geo, group=control)
    def sized(g):  # NOTE: a per-head allocation may store each rank's heads at other bits; the page counts agree
        return replace(g, layer_parts=(), layer_bits=(), bits=(0, 0))
    if any(sized(g) != sized(geos[0]) for g in geos):
        raise RuntimeError(f"tensor-parallel ranks sized different pools: {geos}")


def _worker_main(rank: int, size: int, where: Rendezvous, device: torch.device) -> None:
    """A worker process: receive the spec and the shard, then run every step rank 0 sends until it sends
    ``None``. NOTE: an exception ends the process (its traceback on stderr): rank 0 then sees a dead rank."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: a stuck worker's stacks on stderr
    tp, group = join(rank, size, where, device)
    received: list = [None]
    dist.broadcast_object_list(received, src=0, group=group)
    spec = received[0]
    tp = _with_all_reduce(tp, spec, device)
    runner = _receive_shard(spec, tp, device, group)
    _handshake(runner, group, size)
    channel, plans, host = Channel(group), PlanDecoder(), HostProfile(rank)
    with torch.inference_mode():
        while (kind := header(msg := channel.receive())[0]) != STOP:
            if kind == STEP:
                runner.forward(plans.decode(msg), None)
            elif kind == HOST_PROFILE:
                host.switch(int(msg[HEADER]))
            elif kind == CAPTURE:
                runner.piecewise.capture_all()
            else:
                _graph_work(runner, kind, msg[HEADER:].tolist(), rank)
    _leave(runner, device)


def _graph_work(runner: ModelRunner, kind: int, args: list[int], rank: int) -> None:
    """A worker's share of :meth:`ParallelRunner.replay` (args: the bucket) or :meth:`ParallelRunner.profile`
    (the bucket, the replays: its kernel profile printed as one JSON line tagged with its rank)."""
    graph = runner.graphs.graphs[args[0]].graph
    if kind == REPLAY:
        graph.replay()
    elif kind == PROFILE:
        print(json.dumps(dict(rank=rank, bucket=args[0], kernels=kernel_profile(graph.replay, args[1]))), flush=True)


def _leave(runner: ModelRunner | None, device: torch.device) -> None:
    """Leave the groups. NOTE: CUDA graphs hold the NCCL kernels they captured: they go first, then every
    rank leaves at once (rank 0 does not wait for its workers' exit before leaving: seen on two H200s,
    2026-11-27, a worker's exit waited for rank 0's, a 30 s join timeout per close, longer with graphs)."""
    for graphs in (runner.graphs, runner.extend_graphs, runner.piecewise) if runner is not None else ():
        if graphs is not None:
            graphs.graphs.clear()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not dist.is_initialized():
        return
    left = threading.Event()

    def leave() -> None:
        try:
            dist.destroy_process_group()
        except RuntimeError:  # e.g. an aborted NCCL group
            log.warning("leaving the tensor-parallel group failed", exc_info=True)
        left.set()
    # NOTE: bounded: after a worker died (NCCL group aborted) leaving never returned on two H200s,
    # 2026-11-27 (close() after the requests had failed); the thread is left behind, the process goes on
    threading.Thread(target=leave, name="oscarkv-tp-leave", daemon=True).start()
    if not left.wait(LEAVE_TIMEOUT_S):
        log.warning("leaving the tensor-parallel group did not finish within %.0f s; going on without it", LEAVE_TIMEOUT_S)


class ParallelRunner:
    """Rank 0 of a tensor-parallel group, in the engine's process: a :class:`~oscarkv.engine.runner.Runner`
    whose attributes are rank 0's :class:`ModelRunner`'s, ``run`` as its (see the module docstring). ``model``: the whole model, unfolded; it is not changed. ``device``: rank 0's
    device (rank ``r`` runs on the ``r``-th after it); default: the model's. A model larger than one GPU
    stays on the host (``device`` a GPU): every rank, rank 0 too, copies only its shard to its GPU."""

    def __init__(self, model: PagedLM, codec: KVCodec, cfg: EngineConfig, backend: AttentionBackend,
                 graph_buckets: tuple[int, ...] = (), device: torch.device | None = None) -> None:
        size = cfg.tensor_parallel_size
        check_shardable(model.config, size)
        if dist.is_initialized():
            raise RuntimeError("a tensor-parallel engine already runs in this process; close() it first")
        device = torch.device(device) if device is not None else next(model.parameters()).device
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        check_devices(device, size // cfg.distributed.nnodes)
        # NOTE: rank 0 alone chooses the all-reduce (and refuses a second symmetric-memory engine in this
        # process) before any rank starts: a rank that chose differently would wait in another collective
        reduce = resolve(cfg.tensor_parallel_all_reduce, size, device)
        spec = RankSpec(model.config, cfg, backend, graph_buckets, next(model.parameters()).dtype, reduce,
                        largest_page(codec, model.config, cfg))
        self._dir = Path(tempfile.mkdtemp(prefix="oscarkv-tp-"))
        nodes = cfg.distributed
        where = Rendezvous(self._dir / "rendezvous" if nodes.nnodes == 1 else None, nodes)
        self.procs = _start_ranks(range(1, size // nodes.nnodes), 0, size, where, device)
        self._failure: str | None = None
        self._closing, self._closed = threading.Event(), False
        try:
            self.tp, self.control = join(0, size, where, device)
            dist.broadcast_object_list([spec], src=0, group=self.control)
            self.tp = _with_all_reduce(self.tp, spec, device)
            self.channel, self.encoder = Channel(self.control), PlanEncoder()
            with torch.no_grad():
                for r in range(1, size):
                    _send_shard(model, codec, TensorParallel(r, size), self.control, device)
                self.local = _local_shard(model, codec, spec, self.tp, device)
            _handshake(self.local, self.control, size)
        except BaseException:  # a rank that failed to start (its traceback on stderr): leave nothing behind
            self._closed = True
            self._teardown()
            raise
        self.pools, self.device, self.model = self.local.pools, device, self.local.model
        self.backend, self.storage, self.graphs = self.local.backend, self.local.storage, self.local.graphs  # rank 0's
        self.extend_graphs = self.local.extend_graphs
        if device.type == "cuda":
            threading.Thread(target=self._watch, name="oscarkv-tp-watch", daemon=True).start()
        if self.local.piecewise is not None:
            self._capture_pieces()

    def _capture_pieces(self) -> None:
        """Every rank captures its piecewise graphs now, all at once (their warm-ups and captures hold all-reduces),
        as one GPU does at start-up, not in the first served steps (~1.4 s a bucket at Qwen3-8B's shape). After the
        watcher starts: a rank dying meanwhile aborts the group. A failure stops the workers and raises."""
        try:
            self.channel.send(control(CAPTURE))
            self.local.piecewise.capture_all()
        except BaseException as e:
            failed = self._fail(e) if isinstance(e, Exception) else e
            self._closed = True
            self._teardown()
            raise failed from e

    def run(self, chunks: list[ScheduledChunk], pending: PendingIds | None = None) -> RunnerOutput:
        """Send the step's plans to every rank, then run rank 0's shard; raises :class:`WorkerDied` once the group is gone."""
        self._check()
        try:
            self.channel.send(self.encoder.encode([c.plan for c in chunks]))
            return self.local.run(chunks, pending)
        except Exception as e:
            raise self._fail(e) from e

    def replay(self, bucket: int) -> None:
        """Replay the decode graph of ``bucket`` on every rank (captured by earlier steps; a benchmark's timing)."""
        self._check()
        self.channel.send(control(REPLAY, bucket))
        self.local.graphs.graphs[bucket].graph.replay()

    def profile(self, bucket: int, reps: int = 5) -> list[dict]:
        """Rank 0's kernel profile of ``reps`` replays of the graph of ``bucket``, every rank replaying (and
        profiling, each printing its own rows as a JSON line) together."""
        self._check()
        self.channel.send(control(PROFILE, bucket, reps))
        return kernel_profile(self.local.graphs.graphs[bucket].graph.replay, reps)

    def host_profile(self, on: bool, runtime: bool = False) -> None:
        """Start (``on``) or end a cProfile (``runtime``: a host-operator profile, ``rank_profile.runtime_profiler``)
        of every worker's host over the steps between; at the end each worker prints its busiest functions as one
        JSON line tagged with its rank (rank 0's: the caller's to take)."""
        self._check()
        self.channel.send(control(HOST_PROFILE, (OPERATORS if runtime else FUNCTIONS) if on else OFF))

    def failure(self) -> str | None:
        """Why the group can run no more steps (a rank died, or the ranks fell out of step); ``None`` while
        every rank lives. Safe from any thread (a server's health check)."""
        if self._failure is None and (dead := self._dead()):
            self._failure = _died(dead)
        return self._failure

    def _check(self) -> None:
        if self.failure() is not None:
            raise WorkerDied(self._failure)

    def _dead(self, timeout: float = 0.0) -> list:
        """The workers that exited. NOTE: by their sentinels, not ``is_alive()``: a process is reaped by one
        thread only, and another thread's ``is_alive()`` then reads it as alive."""
        ready = multiprocessing.connection.wait([p.sentinel for p in self.procs], timeout)
        return [p for p in self.procs if p.sentinel in ready]

    def _fail(self, exc: Exception) -> WorkerDied:
        """The group is gone after ``exc`` in a step: name the rank that died, else stop the workers
        (they wait in a collective of a step that rank 0 abandoned)."""
        dead = self._dead(timeout=1.0)  # a dying worker's connection may close before its process ends
        if self._failure is None:
            self._failure = _died(dead) if dead else (
                f"tensor-parallel rank 0 failed a step ({type(exc).__name__}: {exc}); a rank (of another node?) "
                "died or the ranks are out of step; the engine can run no more steps (restart every node)")
        self._stop_workers()
        return WorkerDied(self._failure)

    def _watch(self) -> None:
        """CUDA: abort the NCCL group when a worker exits unasked, so that no collective waits for it
        (the step in flight then raises and :meth:`_fail` names the worker). Gloo needs no help."""
        multiprocessing.connection.wait([p.sentinel for p in self.procs])
        if not self._closing.is_set() and hasattr(dist.group.WORLD, "abort"):
            log.error("a tensor-parallel worker exited; aborting the NCCL group")
            dist.group.WORLD.abort()

    def _stop_workers(self) -> None:
        self._closing.set()
        for p in self.procs:
            if p.is_alive():
                p.kill()
            p.join()

    def close(self) -> None:
        """Let the workers leave, join them, tear the groups down (idempotent)."""
        if self._closed:
            return
        self._closed = True
        alive = self._failure is None and not self._dead()
        if alive:
            try:
                self.channel.send(control(STOP))
            except RuntimeError:
                log.warning("a tensor-parallel worker left before close()")
        self._closing.set()
        if alive:  # every rank leaves the groups together (_leave)
            _leave(self.local, self.device)
        for p in self.procs:
            p.join(timeout=JOIN_TIMEOUT_S)
        self._teardown()

    def _teardown(self) -> None:
        """Kill the workers still there, leave the groups, remove the rendezvous file. NOTE: an NCCL group
        aborted after a rank died is not left (leaving it never returned on two H200s): it goes with the
        process, and this process can start no other tensor-parallel engine."""
        self._stop_workers()
        aborted = self._failure is not None and dist.is_initialized() and dist.get_backend() == "nccl"
        if aborted:
            log.warning("the aborted NCCL group of the dead rank is left to the process's exit")
        else:
            _leave(None, torch.device("cpu"))
        shutil.rmtree(self._dir, ignore_errors=True)


def _died(dead: list) -> str:
    for p in dead:
        p.join(timeout=1.0)  # its exit code
    names = ", ".join(f"{p.name} (pid {p.pid}, exit code {p.exitcode})" for p in dead)
    return (f"tensor-parallel worker {names} died; the engine can run no more steps "
            "(its requests fail; restart the engine)")


def _start_ranks(ranks: range, first: int, size: int, where: Rendezvous, base: torch.device) -> list:
    """Spawn worker ranks of this node, whose first rank is ``first`` (rank ``r`` on the device ``r - first``
    after ``base``)."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker_main, args=(r, size, where, _device(base, r - first)),
                         name=f"oscarkv-tp{r}", daemon=True) for r in ranks]
    for p in procs:
        p.start()
    return procs


def check_devices(device: torch.device, ranks: int, available: int | None = None) -> None:
    """Refuse, before any rank starts, ``ranks`` GPUs of this host from ``device`` on when fewer are visible
    (a rank on a missing GPU dies before it joins, and the others would wait for it until the timeout)."""
    if device.type != "cuda":
        return
    available = torch.cuda.device_count() if available is None else available
    first = device.index or 0
    if first + ranks > available:
        raise ValueError(f"EngineConfig.tensor_parallel_size: {ranks} ranks on this host need GPUs {first}.."
                         f"{first + ranks - 1}, but {available} are visible (CUDA_VISIBLE_DEVICES); lower it or "
                         "spread the ranks over several nodes")


def run_node(cfg: EngineConfig, device: torch.device) -> int:
    """Node ``cfg.distributed.node_rank > 0``: run its ranks until node 0's engine closes; the exit status
    (0 when every rank left cleanly). The ranks get their spec and weights from rank 0."""
    nodes, size = cfg.distributed, cfg.tensor_parallel_size
    k = size // nodes.nnodes
    first = nodes.node_rank * k
    check_devices(device, k)
    procs = _start_ranks(range(first, first + k), first, size, Rendezvous(None, nodes), device)
    print(f"oscarkv: node {nodes.node_rank} of {nodes.nnodes}: ranks {first}..{first + k - 1} of {size}, "
          f"rendezvous tcp://{nodes.master_addr}:{nodes.master_port}", file=sys.stderr)
    for p in procs:
        p.join()
    failed = [p for p in procs if p.exitcode]
    for p in failed:
        print(f"oscarkv: node {nodes.node_rank}: {p.name} exited with code {p.exitcode} (see its error above; "
              "node 0 gone, unreachable, or a rank failed)", file=sys.stderr)
    return 1 if failed else 0
