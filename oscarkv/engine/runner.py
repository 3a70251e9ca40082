"""The one interface between :class:`~oscarkv.engine.engine.LLMEngine` and whatever runs its steps.

Role: :class:`Runner` declares what the engine (and the benchmarks, ``oscarkv.bench``) may use of a
runner. Three classes implement it: :class:`~oscarkv.engine.model_runner.ModelRunner` (the model and
its KV storage on one device, or one tensor-parallel rank's shard),
:class:`~oscarkv.engine.workers.ParallelRunner` (rank 0 of a tensor-parallel group, which drives the
other ranks' ``ModelRunner`` s in their processes) and the benchmarks' ``oscarkv.bench.e2e.BenchRunner``
(a real runner plus launch records and the fast prompt fill).

Ownership: the engine receives its runner at construction (``LLMEngine(runner, ...)``, or built by
:func:`~oscarkv.engine.assembly.build_runner_and_codec`) and never replaces it; a wrapper that adds
behaviour (timing, recording, filling) is itself a :class:`Runner`, given to the engine in place of the
runner it wraps. The runner owns the model, the KV pools and the worker processes; the engine owns the
scheduler and the :class:`~oscarkv.cache.manager.KVCacheManager`, which decides which pages each step
writes and hands them to ``run`` inside the :class:`~oscarkv.engine.scheduler.ScheduledChunk` s.
``close()`` is the engine's to call, once, when it stops.

Data flow per step: ``run(chunks, pending)`` → :class:`~oscarkv.engine.model_runner.RunnerOutput`
(the logits of every chunk that samples, in chunk order; prompt hidden states for prompt
log-probabilities) → the engine's sampler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from oscarkv.attention.step import AttentionBackend, LayerStorage
    from oscarkv.cache.kv_pools import KVPools
    from oscarkv.engine.cuda_graphs import DecodeGraphs
    from oscarkv.engine.extend_graphs import ExtendGraphs
    from oscarkv.engine.model_runner import PendingIds, RunnerOutput
    from oscarkv.engine.scheduler import ScheduledChunk
    from oscarkv.models.llama import PagedLM
    from oscarkv.models.parallel import TensorParallel


@runtime_checkable
class Runner(Protocol):
    """What runs the engine's steps (see the module docstring). With tensor parallelism every attribute
    is rank 0's: its shard of the model, its pools (every rank has the same pages), its backend."""

    model: PagedLM
    """The model (rank 0's shard): ``config`` (vocabulary, positions) and ``compute_logits`` (the engine
    forms prompt log-probabilities from ``RunnerOutput.prompt_hidden`` with it)."""
    pools: KVPools
    """This device's KV pools; ``pools.geo`` is the capacity the engine sizes its cache manager from."""
    device: torch.device
    """Where the step's outputs live (sampling runs there)."""
    tp: TensorParallel
    """The tensor-parallel group (``size`` 1 without); capacity in bytes counts ``tp.size`` ranks."""
    backend: AttentionBackend
    """The attention backend: its write and demotion paths (the benchmarks' prompt fill uses them)."""
    storage: list[LayerStorage]
    """Per layer, the key and value codecs the pools are written with (value codecs folded)."""
    graphs: DecodeGraphs | None
    """The CUDA graphs of decode steps by batch bucket; ``None`` without (CPU, sliding-window models)."""
    extend_graphs: ExtendGraphs | None
    """The CUDA graphs of short extend steps of one sequence by token bucket (rank 0's); ``None`` without. The
    engine asks it whether a verify step runs as one chunk (``ExtendGraphs.verifies``)."""

    def run(self, chunks: list[ScheduledChunk], pending: PendingIds | None = None) -> RunnerOutput:
        """Run one step over ``chunks`` (their write plans say which slots to write and which pages to
        demote); ``pending``: the step's input tokens are still on the device (one-token chunks, overlap).
        Returns the sampling chunks' logits (valid until the next ``run``). Raises on failure: the engine
        then fails the step's requests and abandons its plans."""
        ...

    def failure(self) -> str | None:
        """Why no more steps can run (a tensor-parallel rank died), or ``None``. Safe from any thread."""
        ...

    def close(self) -> None:
        """Release what outlives the object (worker processes, process groups); idempotent."""
        ...

    def replay(self, bucket: int) -> None:
        """Replay the decode CUDA graph of ``bucket`` (captured by earlier steps) on every rank: a
        benchmark's timing of the forward alone. NOTE: a tensor-parallel rank's graph holds all-reduces
        and replays only with every rank's."""
        ...

    def profile(self, bucket: int, reps: int = 5) -> list[dict]:
        """Rank 0's per-kernel GPU time of ``reps`` replays of ``bucket``'s graph
        (``oscarkv.engine.rank_profile.kernel_profile``), every rank replaying together."""
        ...


def one_token_step(chunks: list[ScheduledChunk]) -> bool:
    """Whether a step is a decode step by its shape: every chunk one token. (Whether the runner then
    takes its decode kernels and graphs depends on its backend too: ``ModelRunner.is_decode``.)"""
    return all(c.plan.t1 - c.plan.t0 == 1 for c in chunks)
