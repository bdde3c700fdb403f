"""GPU (or CPU) JPEG decode of asyncstream samples with NVIDIA DALI.

This package imports :mod:`asyncstream`; asyncstream never imports it. The DALI
pipeline and the PyTorch loader arrive with the dali_ops issue; until then this
package exports nothing.
"""

__all__: list[str] = []
