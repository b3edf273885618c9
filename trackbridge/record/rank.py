"""Which process of a distributed job this is, from the environment (no torch.distributed import).

Launchers set the global rank in ``RANK`` (torchrun, Accelerate, DeepSpeed, veRL/Ray workers via torchrun);
``LOCAL_RANK`` alone means a single-node job where local and global rank coincide. MPI and SLURM launchers are
recognised too. A process with none of these is rank 0 of a one-process job.
"""
from __future__ import annotations

import os

_GLOBAL = ("RANK", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")
_WORLD = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")


def _first_int(names: tuple[str, ...], env: dict[str, str]) -> tuple[int | None, str | None]:
    for name in names:
        raw = env.get(name)
        if raw is None or not raw.strip():
            continue
        try:
            return int(raw.strip()), name
        except ValueError:
            raise ValueError(f"environment variable {name}={raw!r} is not an integer rank") from None
    return None, None


def global_rank(env: dict[str, str] | None = None) -> int:
    """The global rank: ``RANK``, then ``LOCAL_RANK``, then MPI/SLURM variables; 0 when none is set."""
    rank, _ = _first_int(_GLOBAL, dict(os.environ) if env is None else env)
    return rank or 0


def world_size(env: dict[str, str] | None = None) -> int:
    """The number of processes of the job: ``WORLD_SIZE``, then MPI/SLURM variables; 1 when none is set."""
    size, _ = _first_int(_WORLD, dict(os.environ) if env is None else env)
    return size or 1


__all__ = ["global_rank", "world_size"]
