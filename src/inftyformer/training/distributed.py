"""Data-parallel training: process groups, DDP wrapping and small collective helpers.

Under ``torchrun --nproc_per_node=N`` each process reads RANK / WORLD_SIZE / LOCAL_RANK from the
environment; :func:`init_distributed` joins the group (gloo on CPU, nccl on CUDA). A run without
those variables is a single process and every helper here degrades to a no-op, so the trainer has
one code path. The global batch is split across ranks; only rank 0 logs and writes checkpoints.

Models keep their stream state outside the module (explicit state objects), and every parameter
takes part in the loss of the last segment, so DDP runs without ``find_unused_parameters``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits: rank among world_size processes, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """'auto' -> cuda if available else cpu; 'cuda' -> cuda:<local_rank>."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} requested but CUDA is not available")
        return torch.device(f"cuda:{local_rank}") if name == "cuda" else torch.device(name)
    if name != "cpu":
        raise ValueError(f"unknown device {name!r}")
    return torch.device("cpu")


def env_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(
    device: str = "cpu",
    *,
    rank: int | None = None,
    world_size: int | None = None,
    init_method: str | None = None,
) -> DistEnv:
    """Join the process group described by the environment (torchrun) or by the arguments.

    With world size 1 no group is created. Returns this process's :class:`DistEnv`.
    """
    rank = int(os.environ.get("RANK", "0")) if rank is None else rank
    world_size = env_world_size() if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)))
    dev = resolve_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(
            backend=backend,
            init_method=init_method or "env://",
            rank=rank,
            world_size=world_size,
        )
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, env: DistEnv) -> nn.Module:
    """DDP around `model` when distributed (no find_unused_parameters), else `model` itself."""
    if not env.distributed:
        return model
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, **_NO_BUFFER_SYNC)


def _no_buffer_sync() -> dict[str, bool]:
    """DDP's option not to broadcast buffers at every forward: the buffers here (basis centres
    and widths, a pretrained model's rotary frequencies) are the same constants on every rank.
    torch 2.13 renamed it forward_sync_buffers and warns on the old name once per process;
    earlier versions know only broadcast_buffers."""
    import inspect

    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


_NO_BUFFER_SYNC = _no_buffer_sync()


def all_reduce_sum(values: list[float], env: DistEnv) -> list[float]:
    """Element-wise sum of `values` over ranks (float64)."""
    if not env.distributed:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def reduce_sums(values: dict[str, float], env: DistEnv) -> dict[str, float]:
    """Each value summed over ranks (every rank must hold the same keys)."""
    keys = sorted(values)
    return dict(zip(keys, all_reduce_sum([values[k] for k in keys], env), strict=True))


def all_gather_object(obj: Any, env: DistEnv) -> list[Any]:
    """`obj` from every rank, in rank order (a one-item list without distribution)."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def chunk_rows(batch_rows: int, chunk: int, chunks: int) -> slice:
    """Rows of chunk `chunk` when a global batch is cut into `chunks` equal chunks.

    The trainer cuts the global batch into world_size × grad_accum chunks, rank-major (rank r's
    micro-batch m is chunk r · grad_accum + m), so the data of a step is the same whatever the
    number of processes and micro-batches.
    """
    if batch_rows % chunks:
        raise ValueError(
            f"the global batch ({batch_rows}) must be divisible by world_size × grad_accum "
            f"({chunks})"
        )
    size = batch_rows // chunks
    return slice(chunk * size, (chunk + 1) * size)


__all__ = [
    "DistEnv",
    "chunk_rows",
    "all_gather_object",
    "all_reduce_sum",
    "barrier",
    "env_world_size",
    "init_distributed",
    "reduce_sums",
    "resolve_device",
    "shutdown_distributed",
    "wrap_model",
]
