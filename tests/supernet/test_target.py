"""TargetAdapter: hooks match HF's hidden states and eager attention; cache rollback; loading."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from _support.models import PROMPTS, save_tiny_vlm, tiny_image
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.target.adapter import TargetAdapter

HOOK_FAMILIES = ("llava", "pixtral", "mistral3", "qwen2_vl", "idefics3")


@pytest.mark.parametrize("family", HOOK_FAMILIES)
def test_prefill_and_verify_match_hf_hidden_states(family, tiny_vlm, tiny_target) -> None:
    model, _ = tiny_vlm(family)
    adapter = tiny_target(family)
    inputs = adapter.build_inputs(tiny_image(0), PROMPTS[0])
    layers = (0, 1, 2)
    pre = adapter.prefill(inputs, layers=layers, all_logits=True)
    with torch.inference_mode():
        ref = model(**inputs, output_hidden_states=True, use_cache=True)
    seq = inputs["input_ids"].shape[1]
    assert pre.logits.shape == (1, seq, adapter.vocab_size)
    torch.testing.assert_close(pre.logits, ref.logits.float())
    for i in layers:
        torch.testing.assert_close(pre.layer_hidden[i], ref.hidden_states[i])
    torch.testing.assert_close(pre.last_hidden, ref.hidden_states[-1])
    # three new tokens in one verify == HF continuing from its own cache
    new = torch.tensor([[11, 12, 13]])
    out = adapter.verify(new, layers=layers)
    with torch.inference_mode():
        cont = model(input_ids=new, cache=ref.cache, output_hidden_states=True, use_cache=True)
    torch.testing.assert_close(out.logits, cont.logits.float())
    for i in layers:
        torch.testing.assert_close(out.layer_hidden[i], cont.hidden_states[i])
    assert adapter.cache_len == seq + 3


@pytest.mark.parametrize("family", ("llava", "pixtral", "mistral3", "qwen2_vl"))
def test_visual_scores_match_eager_attention(family, tiny_vlm, tiny_target) -> None:
    model, _ = tiny_vlm(family)
    adapter = tiny_target(family)
    inputs = adapter.build_inputs(tiny_image(1, (32, 16)), PROMPTS[1])
    pre = adapter.prefill(inputs)
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.inference_mode():
        attn = eager(**inputs, output_attentions=True).attentions[-1][0]  # (heads, seq, seq)
    ids = inputs["input_ids"][0]
    vis = pre.visual_positions
    assert torch.equal(vis, (ids == adapter.info.image_token_id).nonzero().flatten())
    text = torch.arange(len(ids)) > vis.max()
    for tid in adapter._text_ids_excluded:
        text &= ids != tid
    expected = attn[:, text][..., vis].mean(dim=(0, 1))
    torch.testing.assert_close(pre.visual_scores, expected.float(), rtol=1e-4, atol=1e-6)
    assert pre.visual_scores.shape == (len(vis),) and len(vis) > 0


def test_rollback_restores_the_cache(tiny_target) -> None:
    adapter = tiny_target("qwen2_vl")  # M-RoPE positions must follow the cropped cache too
    inputs = adapter.build_inputs(tiny_image(2), PROMPTS[2])
    adapter.prefill(inputs)
    straight = adapter.verify(torch.tensor([[5, 6]])).logits
    adapter.prefill(inputs)
    adapter.verify(torch.tensor([[5, 9, 9, 9]]))
    adapter.rollback(3)
    assert adapter.cache_len == inputs["input_ids"].shape[1] + 1
    again = adapter.verify(torch.tensor([[6]])).logits
    torch.testing.assert_close(again[:, -1], straight[:, -1])
    with pytest.raises(ValueError, match=r"rollback\(-1\) needs 0 <= n"):
        adapter.rollback(-1)


def test_adapter_properties(tiny_target) -> None:
    adapter = tiny_target("llava")
    assert adapter.family == "llava" and adapter.num_layers == 2 and adapter.hidden_size == 32
    assert adapter.vocab_size == 160 and 2 in adapter.eos_token_ids
    assert adapter.embed_tokens.weight.shape == (160, 32)
    assert adapter.describe()["family"] == "llava"


def test_pixtral_family_detected_and_break_tokens_are_not_text(tiny_target) -> None:
    adapter = tiny_target("pixtral")
    assert adapter.family == "pixtral"
    vocab = adapter.tokenizer.get_vocab()
    assert {vocab["[IMG_BREAK]"], vocab["[IMG_END]"]} <= set(adapter._text_ids_excluded)


@pytest.mark.parametrize(("family", "n_visual"),
                         [("llava", 16), ("llava_next", 36), ("idefics3", 4)])
def test_load_from_folder(family, n_visual, tmp_path, tiny_target) -> None:
    """Families whose HF processor needs no optional library round-trip through save_pretrained."""
    folder = save_tiny_vlm(family, tmp_path / "ckpt")
    adapter = TargetAdapter.load(folder)
    assert adapter.family == family and adapter.processor is not None
    assert adapter.path == str(folder.resolve())
    inputs = adapter.build_inputs(tiny_image(0), "what is in the image ?")
    assert (inputs["input_ids"] == adapter.info.image_token_id).sum() == n_visual
    reference = tiny_target(family)
    ref_inputs = reference.build_inputs(tiny_image(0), "what is in the image ?")
    assert torch.equal(inputs["input_ids"], ref_inputs["input_ids"])
    torch.testing.assert_close(adapter.prefill(inputs).logits, reference.prefill(ref_inputs).logits)


def test_load_rejects_folders_without_a_vlm(tmp_path) -> None:
    with pytest.raises(InputError, match="holds no config.json"):
        TargetAdapter.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(InputError, match="without a vision_config, not a VLM"):
        TargetAdapter.load(tmp_path)
    with pytest.raises(InputError, match="does not exist"):
        TargetAdapter.load(tmp_path / "missing")


def test_build_inputs_rejects_bad_images(tiny_target, tmp_path) -> None:
    adapter = tiny_target("llava")
    with pytest.raises(InputError, match="does not exist"):
        adapter.build_inputs(tmp_path / "nope.png", "hi")
    bad = tmp_path / "bad.png"
    bad.write_text("not an image")
    with pytest.raises(InputError, match="cannot be read as an image"):
        adapter.build_inputs(bad, "hi")


def test_open_image_names_too_large_truncated_and_folder_paths(tmp_path, monkeypatch) -> None:
    from dreams_nas.supernet.target.adapter import open_image
    from PIL import Image

    png = tmp_path / "big.png"
    tiny_image(0, (64, 64)).save(png)
    # Pillow refuses past twice its limit before decoding; a limit of 1000 pixels makes this
    # 64 x 64 image one (a 20000 x 20000 photo is one at the default limit).
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(InputError, match=r"big\.png' is too large to decode \(4,096 pixels, over "
                                         r"Pillow's safety limit of 2,000: .*; resize it"):
        open_image(png)
    monkeypatch.undo()
    cut = tmp_path / "cut.png"
    cut.write_bytes(png.read_bytes()[:200])
    with pytest.raises(InputError, match=r"cut\.png' cannot be read as an image \(\w+"):
        open_image(cut)
    with pytest.raises(InputError, match="is a folder; pass the path of a PNG/JPEG file"):
        open_image(tmp_path)
    assert open_image(png).size == (64, 64)


@pytest.mark.parametrize("family", ("llava", "qwen2_5_vl"))
def test_teacher_forced_prefill_equals_incremental_logits(family, tiny_target) -> None:
    adapter = tiny_target(family)
    inputs = adapter.build_inputs(tiny_image(3), PROMPTS[3])
    continuation = torch.tensor([[20, 21, 22, 23]])
    full = adapter.prefill(adapter.extend_inputs(inputs, continuation), all_logits=True)
    adapter.prefill(inputs)
    step = adapter.verify(continuation)
    torch.testing.assert_close(full.logits[:, -4:], step.logits, rtol=1e-4, atol=1e-5)


def test_text_only_prefill_after_an_image_prompt(tiny_vlm, tiny_target) -> None:
    """Qwen keeps M-RoPE deltas on the model: a later text-only prompt must not inherit them."""
    model, _ = tiny_vlm("qwen2_vl")
    adapter = tiny_target("qwen2_vl")
    adapter.prefill(adapter.build_inputs(tiny_image(0, (32, 16)), PROMPTS[0]))
    text = torch.randint(30, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    adapter.prefill({"input_ids": text[:, :8]})
    step = adapter.verify(text[:, 8:])
    with torch.inference_mode():
        full = model(input_ids=text).logits
    torch.testing.assert_close(step.logits, full[:, 8:].float(), rtol=1e-4, atol=1e-5)


def test_an_uncached_hub_id_fails_at_once_when_the_hub_cannot_be_reached(monkeypatch) -> None:
    import socket

    from dreams_nas.supernet.target import loading
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    calls = []

    def unreachable(address, timeout):
        calls.append((address, timeout))
        raise OSError(-2, "Name or service not known")

    monkeypatch.setattr(socket, "create_connection", unreachable)
    with pytest.raises(InputError, match=r"hub id 'nobody/uncached' is not in the local Hugging "
                                         r"Face cache and huggingface.co cannot be reached "
                                         r"\(Name or service not known\)"):
        loading.load_config("nobody/uncached")
    assert calls == [(("huggingface.co", 443), 3.0)]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(InputError, match="offline mode is on"):
        loading.load_config("nobody/uncached")
