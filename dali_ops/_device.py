"""Which device decodes, which GPU, and how DALI outputs become torch tensors."""

from __future__ import annotations

import os
from typing import Any, Literal

import torch
from torch.utils.dlpack import from_dlpack

__all__ = ["resolve_device", "resolve_device_id", "to_torch"]


def resolve_device(device: str) -> Literal["cpu", "mixed"]:
    """``"auto"``: ``"mixed"`` when torch sees CUDA (the batches go to torch), else ``"cpu"``.

    Raises:
        ValueError: an unknown device, or ``"mixed"``/``"gpu"`` without CUDA.
    """
    if device not in ("auto", "cpu", "mixed", "gpu"):
        raise ValueError(f"device must be 'auto', 'cpu', 'mixed' or 'gpu', got {device!r}")
    if device == "auto":
        return "mixed" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise ValueError(f"device={device!r} needs CUDA, and torch.cuda.is_available() is False")
    return "mixed"


def resolve_device_id(device: str, device_id: int | None) -> int | None:
    """The GPU: as given, else ``LOCAL_RANK`` (torchrun), else torch's current device.

    Raises:
        ValueError: a ``device_id`` that is not a visible GPU.
    """
    if device == "cpu":
        return None
    count = torch.cuda.device_count()
    if device_id is not None:
        if isinstance(device_id, bool) or not isinstance(device_id, int):
            raise ValueError(f"device_id must be an integer, got {device_id!r}")
        if not 0 <= device_id < count:
            raise ValueError(f"device_id must be in [0, {count}), got {device_id}")
        return device_id
    local = os.environ.get("LOCAL_RANK", "")
    if local.isdigit() and int(local) < count:
        return int(local)
    return torch.cuda.current_device()


def to_torch(tensor: Any, device_id: int | None) -> torch.Tensor:
    """A DALI ``TensorCPU`` / ``TensorGPU`` as a torch tensor, shared through DLPack.

    No copy, as DALI's own PyTorch iterator does with the dynamic executor: that executor
    never reuses an output buffer, and the DLPack capsule keeps it alive as long as the
    tensor. On the GPU, torch passes its current stream of ``device_id``, which DALI makes
    wait for the work that produced the buffer.
    """
    if device_id is None:
        return from_dlpack(tensor)
    with torch.cuda.device(device_id):
        return from_dlpack(tensor)
