"""torch.distributed set-up shared by the CLIs run under torchrun (docs/distributed.md).

The backend follows the device the collectives' tensors live on: NCCL for CUDA tensors, gloo for CPU tensors
(gloo also runs across nodes over TCP). torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR / MASTER_PORT or
its c10d rendezvous) says who is who.
"""

from __future__ import annotations

import contextlib
import datetime
import os


def backend_for(device: str | None) -> str:
    """'nccl' for a CUDA device (when NCCL is built in), else 'gloo'."""
    import torch.distributed as dist

    if device is not None and str(device).startswith("cuda") and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def init_process_group(device: str | None = None, minutes: int = 30) -> None:
    """Join the torchrun job: the backend for `device`; with CUDA, this process's GPU is LOCAL_RANK's."""
    import torch
    import torch.distributed as dist

    backend = backend_for(device)
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(minutes=minutes))


def torchrun_rank() -> tuple[int, int]:
    """(rank, world size) of this process, as torchrun's environment says; (0, 1) outside torchrun."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


@contextlib.contextmanager
def joined_ranks(world_size: int):
    """The barrier of a torchrun job whose ranks only wait for each other (the store writers): the process group
    joined with gloo (`init_process_group()`, whatever the model's device) and left on exit; None outside torchrun
    (world_size 1), where nothing is joined."""
    if world_size == 1:
        yield None
        return
    import torch.distributed as dist

    init_process_group()
    try:
        yield dist.barrier
    finally:
        dist.destroy_process_group()


# What gloo / NCCL say when another rank of the job has died (its process exited, its node went away).
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
             "Socket Timeout", "Timed out waiting")


def lost_peer(err: BaseException) -> str | None:
    """One line for a collective that failed because another rank stopped, else None."""
    import torch.distributed as dist

    if not isinstance(err, (RuntimeError, getattr(dist, "DistError", RuntimeError))):
        return None
    text = str(err)
    if not any(marker in text for marker in PEER_LOST):
        return None
    return ("another process of this torchrun job stopped (its rank's own error is in its log); every file here is "
            "whole (the last checkpoint, the written shards): rerun the same command to resume")
