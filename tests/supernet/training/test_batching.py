"""Training's feature noise (`training.batching.row_noise`): drawn on the batch's device by a
generator of that device, per row and seed, and never copied from the host."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from _support.drafts import tiny_draft, tiny_samples
from dreams_nas.supernet.training import batching
from dreams_nas.supernet.training.batching import LossSetup, collate, loss_terms, row_noise
from torch.utils._python_dispatch import TorchDispatchMode

SEEDS = [11, 12, 13]


def _samples() -> list:
    samples = tiny_samples(3)
    short = samples[1]  # a shorter row: padding in the batch
    samples[1] = replace(short, input_ids=short.input_ids[:15],
                         distill_hidden={k: v[:15] for k, v in short.distill_hidden.items()},
                         last_hidden=short.last_hidden[:15])
    return samples


def test_each_row_is_drawn_on_the_batch_device_by_its_own_generator(monkeypatch):
    batch = collate(_samples(), with_visual=True)
    asked: list[torch.device | None] = []
    real = torch.Generator

    def generator(device: str | torch.device | None = None) -> torch.Generator:
        asked.append(None if device is None else torch.device(device))
        return real(device=device or "cpu")

    monkeypatch.setattr(batching.torch, "Generator", generator)
    noise = row_noise(batch, SEEDS)
    monkeypatch.undo()
    # one generator per row, each made for the batch's device (none left to a default)
    assert asked == [batch.prev_hidden.device] * len(SEEDS)
    assert noise.device == batch.prev_hidden.device and noise.shape == batch.prev_hidden.shape
    lengths = batch.text_mask.sum(1).tolist()
    assert lengths[1] < max(lengths)
    for i, (seed, n) in enumerate(zip(SEEDS, lengths, strict=True)):
        draw = torch.randn(n, noise.shape[-1], generator=real().manual_seed(seed))
        assert torch.equal(noise[i, :n], draw) and not noise[i, n:].any()
    # a row's noise is its seed's alone: the same in another batch (a rank's share)
    alone = row_noise(collate(_samples()[1:2], with_visual=True), SEEDS[1:2])
    assert torch.equal(alone[0], noise[1, : lengths[1]])


class _HostToDevice(TorchDispatchMode):
    """Counts copies from the host to a device (`.to(device)`, `copy_` of a CPU tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default:
            src, dst = args[0], out
        elif func is torch.ops.aten.copy_.default:
            src, dst = args[1], args[0]
        else:
            return out
        if src.device.type == "cpu" and dst.device.type != "cpu":
            self.copies += 1
        return out


@pytest.mark.cuda
def test_the_noise_of_a_cuda_batch_is_drawn_there_without_a_copy_from_the_host():
    batch = collate(_samples(), with_visual=True).to("cuda")
    with _HostToDevice() as mode:
        noise = row_noise(batch, SEEDS)
    assert noise.is_cuda and mode.copies == 0
    draft = tiny_draft(0).to("cuda").train()
    spec = draft.config.largest()
    copies = []
    for amount in (0.0, 0.1):  # the noisy loss copies no more from the host than the plain one
        with _HostToDevice() as mode:
            loss_terms(draft, batch, spec, LossSetup((2,), noise=amount), noise_seeds=SEEDS)
        copies.append(mode.copies)
    assert copies[1] == copies[0]
