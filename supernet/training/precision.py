"""Mixed precision for training: autocast to the run's dtype, a loss scaler for float16 only."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class MixedPrecision:
    """Autocast to the compute dtype around the forward, and a gradient scaler that is on only
    for float16 (bfloat16 has float32's exponent range and needs none)."""

    def __init__(self, device: torch.device, dtype: torch.dtype | None) -> None:
        self.device_type = device.type
        self.dtype = dtype if dtype in (torch.float16, torch.bfloat16) else None
        self.scaler = torch.amp.GradScaler(self.device_type,
                                           enabled=self.dtype == torch.float16)

    @contextmanager
    def autocast(self) -> Iterator[None]:
        with warnings.catch_warnings(), torch.autocast(
                self.device_type, dtype=self.dtype or torch.float32,
                enabled=self.dtype is not None):
            # the fp32 RMSNorm weights meet 16-bit activations: torch computes the norm
            # unfused (in the higher precision) and says so once per process; expected here
            warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
            yield
