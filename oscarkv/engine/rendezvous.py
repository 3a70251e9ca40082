"""How the ranks of one tensor-parallel engine find one another: a file on one host, node 0's TCP store on several.

Role: :func:`join` puts a rank into torch.distributed's default group (the device collectives: NCCL on
CUDA, gloo on the CPU) and a second gloo group for the host messages, and hands back both. On one
host (``DistributedConfig.nnodes == 1``) the ranks meet through a file of rank 0's temporary folder,
as before; on several, through a ``TCPStore`` that node 0 serves on ``master_addr:master_port``. Every
rank waits at most ``DistributedConfig.rendezvous_timeout`` for all the others to arrive; then
:class:`RendezvousError` names the address, the rank and how many were expected, so a node that never
arrives fails the start in bounded time instead of hanging it. ``oscarkv.engine.workers`` calls it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from oscarkv.config import DistributedConfig
from oscarkv.models.parallel import TensorParallel

STEP_TIMEOUT = {"cuda": timedelta(minutes=5), "cpu": timedelta(seconds=90)}
"""How long a device collective (and the one-host rendezvous) waits for the other ranks before it fails,
by device type. NOTE: gloo does not always see a dead peer at once (a broadcast from rank 0 to a killed
rank was seen waiting for the full timeout), so the CPU's is short: ranks step in lockstep, and no CPU
step keeps one rank 90 s behind another."""
IDLE_TIMEOUT = timedelta(days=365)
"""How long a worker waits for rank 0's next step: an idle server sends none (a dead rank 0 closes
the connection, which ends the wait at once)."""


class RendezvousError(RuntimeError):
    """The ranks did not all arrive at the rendezvous in time (a node not started, or unreachable)."""


@dataclass(frozen=True)
class Rendezvous:
    """Where a rank meets the others: ``file`` on one host (``None`` on several), ``nodes`` the hosts."""

    file: Path | None
    nodes: DistributedConfig

    def describe(self) -> str:
        return str(self.file) if self.file is not None else f"tcp://{self.nodes.master_addr}:{self.nodes.master_port}"


def join(rank: int, size: int, where: Rendezvous, device: torch.device) -> tuple[TensorParallel, Any]:
    """Join the group: ``(TensorParallel over the default group, the gloo group of host messages)``."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend, timeout = ("nccl" if device.type == "cuda" else "gloo"), STEP_TIMEOUT[device.type]
    if where.file is not None:
        dist.init_process_group(backend, init_method=where.file.as_uri(), rank=rank, world_size=size, timeout=timeout)
    else:
        dist.init_process_group(backend, store=_tcp_store(rank, size, where), rank=rank, world_size=size, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    return TensorParallel(rank, size, dist.group.WORLD), control


def _tcp_store(rank: int, size: int, where: Rendezvous) -> dist.TCPStore:
    """Node 0's store (rank 0 serves it and waits for all ``size`` ranks), or a connection to it."""
    d = where.nodes
    try:
        return dist.TCPStore(d.master_addr, d.master_port, size, is_master=rank == 0,
                             timeout=timedelta(seconds=d.rendezvous_timeout), wait_for_workers=True)
    except (RuntimeError, OSError) as e:  # DistStoreError (a RuntimeError): the wait timed out or the port is taken
        what = (f"waited {d.rendezvous_timeout:g} s for the {size} tensor-parallel ranks of {d.nnodes} nodes"
                if rank == 0 else f"rank {rank} could not reach node 0 within {d.rendezvous_timeout:g} s")
        raise RendezvousError(f"rendezvous at {where.describe()} failed: {what} (start every node with the same "
                              f"--master-addr/--master-port and --nnodes, node 0 first; is the port free and "
                              f"reachable?): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
