from __future__ import annotations

import json
import time

import pytest
import torch
from dreams_nas.nas import cli
from dreams_nas.supernet.builtin.build import build_processor
from dreams_nas.supernet.builtin.cache import (
    MARKER,
    builtin_target_dir,
    ensure_builtin_target,
    ensure_builtin_target_with_metrics,
    read_complete_marker,
)
from dreams_nas.supernet.builtin.training import Encoder, exact_match_flags
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.data.synth import make_sample
from transformers import AutoProcessor, LlavaForConditionalGeneration, LlavaProcessor


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    folder, metrics, cached = ensure_builtin_target_with_metrics(cache, variant="tiny",
                                                              progress=False, threads=1)
    assert not cached
    return cache, folder, metrics


def _messages(prompt, image=None):
    part = {"type": "image"} if image is None else {"type": "image", "path": str(image)}
    return [{"role": "user", "content": [part, {"type": "text", "text": prompt}]}]


def test_folder_loads_like_any_checkpoint(tiny, tmp_path) -> None:
    _, folder, _ = tiny
    model = LlavaForConditionalGeneration.from_pretrained(folder)
    processor = AutoProcessor.from_pretrained(folder)
    assert isinstance(processor, LlavaProcessor)
    assert type(processor.image_processor).__name__.startswith("CLIPImageProcessor")
    assert processor.patch_size == 8 and processor.tokenizer.chat_template
    sample = make_sample("eval", 0, 3)
    sample.image.save(tmp_path / "x.png")
    inputs = processor.apply_chat_template(_messages(sample.prompt, tmp_path / "x.png"),
                                           add_generation_prompt=True, tokenize=True,
                                           return_dict=True, return_tensors="pt")
    ids = inputs["input_ids"][0]
    assert int((ids == model.config.image_token_id).sum()) == 36  # image first, 6 x 6 patches
    assert ids[0] == processor.tokenizer.bos_token_id
    assert processor.tokenizer.convert_ids_to_tokens(ids[-2:].tolist()) == ["ASSISTANT", ":"]
    out = model.generate(**inputs, do_sample=False, max_new_tokens=4)
    assert out.shape[1] == ids.shape[0] + 4 or out[0, -1] == processor.tokenizer.eos_token_id


def test_metrics_and_cache_reuse(tiny, capsys) -> None:
    cache, folder, metrics = tiny
    for key in ("exact_match", "num_params", "decode_ms_target", "decode_ms_draft_1layer",
                "decode_ms_draft_3layer", "draft_3layer_to_target", "build_s"):
        assert key in metrics
    # the vector instructions the build ran on (builds on CPUs that differ here differ)
    assert metrics["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert metrics["num_params"] == sum(
        p.numel() for p in LlavaForConditionalGeneration.from_pretrained(folder).parameters())
    assert metrics["generate_check"]["agrees_with_teacher_forced"] == metrics["generate_check"]["n"]
    start = time.perf_counter()
    assert ensure_builtin_target(cache, variant="tiny") == folder
    assert time.perf_counter() - start < 2.0
    code = cli.main(["target", "build-builtin", "--variant", "tiny", "--cache-dir", str(cache),
                     "--json", "-q"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["cached"] is True and summary["folder"] == str(folder)
    assert summary["exact_match"] == metrics["exact_match"]


def test_teacher_forced_exact_match_equals_greedy_generate(tiny) -> None:
    from dreams_nas.supernet.builtin.training import IGNORE, TargetBatch

    _, folder, _ = tiny
    model = LlavaForConditionalGeneration.from_pretrained(folder).eval()
    processor = build_processor()
    encoder = Encoder(processor)
    sample = make_sample("eval", 0, 1)
    text = processor.apply_chat_template(_messages(sample.prompt), add_generation_prompt=True,
                                         tokenize=False)
    inputs = processor(images=[sample.image], text=[text], return_tensors="pt")
    prompt = inputs["input_ids"]  # (1, prompt_len)
    assert prompt[0].tolist() == encoder.prompt_ids(sample.prompt)
    # no min_new_tokens: suppressing EOS would make greedy decoding differ from the argmax
    out = model.generate(**inputs, do_sample=False, max_new_tokens=10)
    labels = torch.full_like(out, IGNORE)
    labels[:, prompt.shape[1]:] = out[:, prompt.shape[1]:]
    batch = TargetBatch(input_ids=out, attention_mask=torch.ones_like(out),
                  pixel_values=inputs["pixel_values"], labels=labels)
    assert bool(exact_match_flags(model, batch)[0])  # greedy continuation = all argmaxes
    wrong = labels.clone()
    wrong[0, -1] = (wrong[0, -1] + 1) % model.config.text_config.vocab_size
    batch = TargetBatch(input_ids=out, attention_mask=torch.ones_like(out),
                  pixel_values=inputs["pixel_values"], labels=wrong)
    assert not bool(exact_match_flags(model, batch)[0])


def test_damaged_or_half_written_cache_is_rebuilt(tiny, tmp_path) -> None:
    cache = tmp_path / "cache"
    folder = builtin_target_dir(cache, variant="tiny")
    killed = folder.parent / f".{folder.name}.abc123.tmp"  # left by a builder that was killed
    (killed / "sub").mkdir(parents=True)
    assert ensure_builtin_target(cache, variant="tiny", progress=False, threads=1) == folder
    assert not killed.exists()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # a torn file
    assert read_complete_marker(folder) is None
    assert ensure_builtin_target(cache, variant="tiny", progress=False, threads=1) == folder
    assert read_complete_marker(folder) is not None
    (folder / MARKER).unlink()  # a folder without its completion marker
    assert read_complete_marker(folder) is None
    assert ensure_builtin_target(cache, variant="tiny", progress=False, threads=1) == folder
    LlavaForConditionalGeneration.from_pretrained(folder)
    assert not [p for p in folder.parent.iterdir() if p.name.endswith(".tmp")]


def test_build_is_deterministic(tiny, tmp_path) -> None:
    from safetensors.torch import load_file

    _, folder, _ = tiny
    again = ensure_builtin_target(tmp_path, variant="tiny", progress=False, threads=1)
    a, b = load_file(folder / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_unknown_variant() -> None:
    with pytest.raises(InputError, match="variant 'huge' is unknown"):
        builtin_target_dir(None, variant="huge")


def test_cache_env_var(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(tmp_path))
    assert builtin_target_dir(variant="tiny").is_relative_to(tmp_path)


def test_rebuild_swaps_in_a_fresh_build(tmp_path) -> None:
    folder, _, cached = ensure_builtin_target_with_metrics(tmp_path, variant="tiny", progress=False,
                                                        threads=1)
    marker = (folder / MARKER).read_text()
    again, _, cached = ensure_builtin_target_with_metrics(tmp_path, variant="tiny", progress=False,
                                                       threads=1, rebuild=True)
    assert again == folder and not cached
    assert (folder / MARKER).read_text() != marker  # new build time in the metrics
    assert read_complete_marker(folder) is not None
    assert sorted(p.name for p in folder.parent.iterdir() if not p.name.endswith(".lock")) == [
        folder.name]


def test_growing_depth_preserves_the_function() -> None:
    from dataclasses import replace

    from dreams_nas.supernet.builtin.build import build_config, grow_text_layers
    from dreams_nas.supernet.builtin.variants import VARIANTS

    processor = build_processor()
    config = build_config(replace(VARIANTS["tiny"], text_layers=2), processor.tokenizer)
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    batch = Encoder(processor).encode([make_sample("eval", 0, i) for i in range(3)])
    grown = grow_text_layers(model, 5, seed=1).eval()
    assert len(grown.model.language_model.layers) == 5
    assert grown.config.text_config.num_hidden_layers == 5
    with torch.no_grad():
        before = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                       pixel_values=batch.pixel_values).logits
        after = grown(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                      pixel_values=batch.pixel_values).logits
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)
    inserted = grown.model.language_model.layers[1]  # new index 1 sits between old 0 and 1
    assert not inserted.self_attn.q_proj.weight.eq(0).all()  # a real layer, zero residual out
    assert inserted.self_attn.o_proj.weight.eq(0).all()
    assert inserted.mlp.down_proj.weight.eq(0).all()
    # block expansion: a copy of the trained layer before it (it attends like its neighbour)
    source = grown.model.language_model.layers[0]
    assert torch.equal(inserted.self_attn.q_proj.weight, source.self_attn.q_proj.weight)
    assert torch.equal(inserted.mlp.up_proj.weight, source.mlp.up_proj.weight)
    with pytest.raises(InputError, match="cannot grow a 2-layer model to 1 layers"):
        grow_text_layers(model, 1, seed=1)


def test_cell_patterns_label_every_cell_of_unseen_images() -> None:
    """The auxiliary loss's targets: the exact cell patterns of the tasks, found on some
    training images, label every cell of other images (none ignored), and differ by content."""
    from dreams_nas.supernet.builtin.training import IGNORE, CellPatterns
    from dreams_nas.supernet.builtin.variants import DEFAULT_TASK_MIX
    from dreams_nas.supernet.data.synth import CELL, GRID

    encoder = Encoder(build_processor())
    patterns = CellPatterns(encoder, [make_sample("train", 0, i, DEFAULT_TASK_MIX)
                                      for i in range(512)])
    # 48 shapes, 18 white glyphs, 30 bar labels (values 1-5 in 6 colours), 6 bar bodies, 6 bar
    # caps, the background
    assert len(patterns) == 109
    samples = [make_sample("eval", 0, i) for i in range(40)]
    pixels = encoder.encode(samples).pixel_values
    labels = patterns.labels(pixels)
    assert labels.shape == (40, GRID * GRID) and (labels != IGNORE).all()
    # two cells get the same label exactly when their pixels are equal
    cells = pixels.reshape(40, 3, GRID, CELL, GRID, CELL).permute(0, 2, 4, 1, 3, 5).reshape(
        40 * GRID * GRID, -1)
    flat = labels.flatten()
    for i in range(0, len(flat), 37):
        same = (cells == cells[i]).all(dim=1)
        assert torch.equal(same, flat == flat[i])
    # a cell drawn nowhere in the tasks is ignored, not forced onto a pattern
    odd = pixels[:1].clone()
    odd[0, :, :CELL, :CELL] = 0.123
    assert patterns.labels(odd)[0, 0] == IGNORE
