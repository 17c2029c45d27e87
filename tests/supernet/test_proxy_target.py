"""The real-shaped proxy targets (supernet/builtin/proxy.py, bpe.py): LLaVA-1.5 geometry, a
32,000-token BPE, a 0.3B+ LM, cached like the built-in target and loadable by name."""

from __future__ import annotations

import json

import pytest
import torch
from dreams_nas.supernet.builtin.bpe import build_bpe_tokenizer
from dreams_nas.supernet.builtin.cache import ensure_proxy_target, proxy_target_dir
from dreams_nas.supernet.builtin.proxy import PROXIES, build_config, build_processor, get_proxy
from dreams_nas.supernet.builtin.resolve import resolve_target
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.targets import NAMED_TARGETS, PROXY_TARGETS
from dreams_nas.supernet.data.synth import make_sample, vocabulary_texts
from dreams_nas.supernet.target.adapter import TargetAdapter
from PIL import Image


def test_the_named_targets_are_the_proxies_built() -> None:
    assert set(PROXY_TARGETS) == set(PROXIES) and "builtin" in NAMED_TARGETS


def test_proxy_llava_has_llava_15_geometry_and_a_32k_bpe() -> None:
    """The full-size proxy's processor and config (weights on the meta device: no memory)."""
    from transformers import LlavaForConditionalGeneration

    spec = get_proxy("proxy-llava")
    processor = build_processor(spec)
    tokenizer = processor.tokenizer
    assert len(tokenizer) == 32_000
    for text in vocabulary_texts()[:200]:  # byte-level: every text round-trips exactly
        assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text
    sample = make_sample("eval", 0, 3)
    # the built-in prompts read as words, not bytes: far fewer tokens than characters
    assert len(tokenizer(sample.prompt)["input_ids"]) < len(sample.prompt) / 3
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": sample.prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    for image in (sample.image, Image.new("RGB", (640, 480))):  # any size: 336 px, 576 tokens
        inputs = processor(images=[image], text=[text], return_tensors="pt")
        assert inputs["pixel_values"].shape[-2:] == (336, 336)
        image_id = tokenizer.convert_tokens_to_ids("<image>")
        assert int((inputs["input_ids"] == image_id).sum()) == 576
    config = build_config(spec, tokenizer)
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(config)
    lm = sum(p.numel() for p in model.model.language_model.parameters())
    lm += model.lm_head.weight.numel()
    assert 0.3e9 <= lm <= 0.5e9 and config.text_config.hidden_size >= 1024
    assert config.text_config.vocab_size == 32_000


def test_bpe_is_deterministic_and_sized() -> None:
    a, b = build_bpe_tokenizer(1_500, seed=0), build_bpe_tokenizer(1_500, seed=0)
    assert len(a) == 1_500 and a.get_vocab() == b.get_vocab()
    assert [a.convert_ids_to_tokens(i) for i in range(5)] == ["<unk>", "<s>", "</s>", "<pad>",
                                                              "<image>"]


@pytest.fixture(scope="module")
def proxy_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("proxy-cache")
    folder, metrics, cached = ensure_proxy_target("proxy-llava-tiny", cache)
    assert not cached and folder == proxy_target_dir(cache, "proxy-llava-tiny")
    return cache, folder, metrics


def test_tiny_proxy_builds_once_and_is_reused(proxy_cache) -> None:
    cache, folder, metrics = proxy_cache
    assert metrics["visual_tokens"] == 64 and metrics["vocab_size"] == 1_000
    assert (folder / "config.json").is_file() and (folder / "proxy_metrics.json").is_file()
    again, metrics2, cached = ensure_proxy_target("proxy-llava-tiny", cache)
    assert cached and again == folder and metrics2["num_params"] == metrics["num_params"]
    # a damaged build is rebuilt, never used
    (folder / "config.json").write_text("{}")
    _, _, cached = ensure_proxy_target("proxy-llava-tiny", cache)
    assert not cached and json.loads((folder / "config.json").read_text())["model_type"] == "llava"


def test_a_proxy_loads_by_name_and_a_run_records_the_name(proxy_cache, monkeypatch,
                                                          tmp_path) -> None:
    cache, folder, _ = proxy_cache
    monkeypatch.setenv("DREAMS_NAS_CACHE", str(cache))
    target = TargetAdapter.load(resolve_target("proxy-llava-tiny"), target_id="proxy-llava-tiny")
    assert target.path == str(folder.resolve()) and target.num_layers == 2
    sample = make_sample("eval", 0, 1)
    inputs = target.build_inputs(sample.image, sample.prompt)
    pre = target.prefill(inputs, layers=(1,))
    assert int(pre.visual_positions.numel()) == 64
    run = RunFolder(tmp_path / "run")
    run.update_run(target=target.describe())
    assert run.target_source() == "proxy-llava-tiny"  # rebuilt by name when the cache is gone


def test_an_unknown_proxy_is_a_one_line_error() -> None:
    from dreams_nas.supernet.core.errors import InputError

    with pytest.raises(InputError, match="proxy-llava"):
        get_proxy("proxy-nope")
