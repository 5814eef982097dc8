"""Running one computation over several processes with ``torch.distributed`` (launched by ``torchrun``).

``torchrun --nproc-per-node N [--nnodes M ...] -m wsbook ...`` starts ``N * M`` copies of the same program
and sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address in their environment;
:func:`init` reads them and joins the process group (``nccl`` on GPUs, ``gloo`` on CPUs). Nothing here
launches processes. Every rank then runs the same code, and the library splits the work at three places:

* populations (:func:`wsbook.nets.train_population`) and HMC chains (:func:`wsbook.bayes.mcmc.hmc`): every
  rank draws the *whole* population's random numbers from the same generator, keeps its own contiguous
  block of members (:func:`shard`, starting on a vector boundary: :func:`granule_for`) and the blocks
  are gathered back (:func:`all_gather_rows`), so the result equals a single-process run with the same
  seeds, bit for bit on CPUs (on GPUs to rounding: cuBLAS may pick other kernels for other batch sizes);
* flow training (:meth:`wsbook.weightflow.WeightFlow.fit`): DistributedDataParallel over the global batch;
* the cache (:mod:`wsbook.cache`): all ranks agree on hit or miss, rank 0 writes.

Outside ``torchrun`` (or with one process) every function here is a no-op: :func:`active` is ``False``.
"""
from __future__ import annotations

import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import Tensor


def launched() -> bool:
    """Whether this process was started by ``torchrun`` with more than one process in all."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def backend() -> str:
    """``"nccl"`` when this process computes on a CUDA device, else ``"gloo"``."""
    from wsbook import config

    return "nccl" if config.device().type == "cuda" and dist.is_nccl_available() else "gloo"


def init(timeout_minutes: float = 60.0) -> bool:
    """Join the process group described by ``torchrun``'s environment variables (a no-op when not launched
    by ``torchrun``, or when already joined). On GPUs every process uses the GPU ``LOCAL_RANK`` of its node.
    Returns :func:`active`."""
    if not launched() or not dist.is_available() or dist.is_initialized():
        return active()
    if torch.cuda.is_available() and os.environ.get("WSBOOK_DEVICE", "cuda").startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend(), timeout=timedelta(minutes=timeout_minutes))
    return active()


def close() -> None:
    """Leave the process group (if joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def active() -> bool:
    """Whether a process group with more than one process is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 outside a process group)."""
    return dist.get_rank() if active() else 0


def world_size() -> int:
    """The number of processes (1 outside a process group)."""
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0: the process that writes the cache and prints summaries."""
    return rank() == 0


#: Blocks of a split tensor start at a multiple of this many bytes of it (one 512-bit vector register, a
#: cache line). Elementwise CPU kernels, the fused Adam and SGD steps among them, run in vector registers
#: and finish a tensor's last few elements in scalar code, which can round differently: a member's update
#: is bit-identical in a block and in the whole population only when the block starts on a vector boundary
#: of the whole. (Measured with torch 2.13 on an AVX-512 CPU: 32 bytes suffice; products are exact anyway.)
ALIGN_BYTES = 64

#: The granule of :func:`shard_sizes` when none is given: rows of 8 bytes (one float64 per chain).
GRANULE = ALIGN_BYTES // 8


def granule_for(row_bytes: int) -> int:
    """The fewest rows of ``row_bytes`` bytes each that fill a multiple of :data:`ALIGN_BYTES`: blocks that
    start at multiples of it start on a vector boundary (e.g. 2 networks of 7,960 float32 parameters, 8 of
    802, 16 rows of one float32)."""
    if isinstance(row_bytes, bool) or not isinstance(row_bytes, int) or row_bytes < 1:
        raise ValueError(f"row_bytes must be a positive int; got {row_bytes!r}")
    return ALIGN_BYTES // math.gcd(row_bytes, ALIGN_BYTES)


def shard_sizes(n: int, world: int | None = None, granule: int = GRANULE) -> list[int]:
    """Sizes of the contiguous blocks ``n`` items are split into, one per rank: whole groups of ``granule``
    items (the last may be partial), spread as evenly as possible; a rank may get none."""
    world = world_size() if world is None else world
    groups = -(-n // granule)
    per = [groups // world + (r < groups % world) for r in range(world)]
    sizes, start = [], 0
    for g in per:
        stop = min(n, start + g * granule)
        sizes.append(stop - start)
        start = stop
    return sizes


def splits(n: int, granule: int = GRANULE) -> bool:
    """Whether ``n`` items are split over the ranks: a process group runs and every rank gets a block."""
    return active() and min(shard_sizes(n, granule=granule)) > 0


def shard(n: int, rank_: int | None = None, world: int | None = None, granule: int = GRANULE) -> slice:
    """This rank's contiguous block of ``range(n)`` (all of it outside a process group)."""
    sizes = shard_sizes(n, world, granule)
    r = rank() if rank_ is None else rank_
    start = sum(sizes[:r])
    return slice(start, start + sizes[r])


def _comm_device(t: Tensor) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


#: Bytes per ``all_gather`` call of :func:`all_gather_rows`: gloo moves a large tensor about twice as fast
#: in pieces of a few MiB as in one call (measured on two CPU processes: 88 MiB a rank in 0.16 s against 0.33 s).
GATHER_PIECE_BYTES = 4 * 2**20


def all_gather_rows(t: Tensor, dim: int = 0) -> Tensor:
    """Concatenate every rank's ``t`` along ``dim`` in rank order (blocks may differ in size along ``dim``;
    all other dimensions must agree). The result is on ``t``'s device, bit for bit the blocks' values."""
    if not active():
        return t
    dim = dim % t.dim()
    sizes = torch.tensor([t.shape[dim]], device=_comm_device(t))
    all_sizes = [torch.zeros_like(sizes) for _ in range(world_size())]
    dist.all_gather(all_sizes, sizes)
    counts = [int(s) for s in all_sizes]
    moved = t.movedim(dim, 0).to(_comm_device(t))
    row = moved[0].numel() if moved.shape[0] else math.prod(moved.shape[1:])
    flat = moved.new_zeros(max(counts) * row)              # this rank's block, padded to the largest
    flat[:moved.numel()] = moved.reshape(-1)
    parts = flat.new_empty((len(counts), flat.numel()))
    step = max(1, GATHER_PIECE_BYTES // flat.element_size())
    for start in range(0, flat.numel(), step):             # a few calls per hundred MiB
        piece = slice(start, start + step)
        dist.all_gather(list(parts[:, piece].unbind(0)), flat[piece])
    out = torch.cat([p[:c * row] for p, c in zip(parts, counts)]).view(sum(counts), *moved.shape[1:])
    return out.movedim(0, dim).to(t.device)


def all_sum(t: Tensor) -> Tensor:
    """The element-wise sum of ``t`` over ranks (a new tensor on ``t``'s device)."""
    if not active():
        return t
    out = t.detach().clone().to(_comm_device(t))
    dist.all_reduce(out)
    return out.to(t.device)


def all_agree(flag: bool) -> bool:
    """``True`` only when ``flag`` is true on every rank (e.g. a cache hit everywhere)."""
    if not active():
        return flag
    t = torch.tensor([int(bool(flag))], device=_comm_device(torch.empty(0)))
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def barrier() -> None:
    """Wait until every rank arrives here (a no-op outside a process group)."""
    if active():
        dist.barrier()


__all__ = ["ALIGN_BYTES", "GRANULE", "GATHER_PIECE_BYTES", "granule_for", "launched", "backend", "init", "close",
           "active", "rank", "world_size", "is_main", "shard_sizes", "splits", "shard", "all_gather_rows", "all_sum",
           "all_agree", "barrier"]
