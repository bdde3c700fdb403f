"""GPU (or CPU) image decode of asyncstream samples with NVIDIA DALI (JPEG, PNG, WebP, ...).

:class:`DALIImageLoader` turns a :class:`~asyncstream.ShardStream` into batches of
decoded, augmented ``(images, labels)`` torch tensors; :func:`build_pipeline` is the DALI
graph it runs, usable on its own with any source of encoded images and labels, and
:class:`PipelineSettings` says what that graph computes. The module docstrings of
``_loader`` and ``_pipeline`` give the design: copies, exact resume, undecodable images.

This package imports :mod:`asyncstream`; asyncstream never imports it.

The names load on first use, as asyncstream's do: they import PyTorch and DALI (seconds),
which ``asyncstream --help`` has no use for when it loads ``dali_ops._demo`` to list the
``demo`` command.
"""

from typing import TYPE_CHECKING

from asyncstream._lazy import lazy_names

if TYPE_CHECKING:
    from ._loader import DALIImageLoader
    from ._pipeline import PipelineSettings, build_pipeline

__all__ = ["DALIImageLoader", "PipelineSettings", "build_pipeline"]

_LAZY = {
    "DALIImageLoader": "_loader",
    "PipelineSettings": "_pipeline",
    "build_pipeline": "_pipeline",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, __all__)
