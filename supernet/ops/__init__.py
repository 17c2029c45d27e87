"""Tensor operations the draft and the target share, below both: `linear` (16-bit products
without the slow CPU kernels)."""
