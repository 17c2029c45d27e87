"""A spec folder as transformers' `custom_generate`: `model.generate(custom_generate=folder,
trust_remote_code=True)` decodes with the folder's draft and returns `model.generate()`'s
tokens, streams them, and refuses another target or an option it cannot do in one line."""

from __future__ import annotations

import pytest
import torch
from _support.drafts import random_spec_folder
from _support.models import PROMPTS, tiny_image
from dreams_nas.supernet.core.errors import InputError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", ["llava", "qwen2_vl", "idefics3"])
def test_generate_with_the_folder_returns_generates_tokens(family, tiny_vlm, tiny_target,
                                                          tmp_path) -> None:
    from transformers import TextStreamer

    model, processor = tiny_vlm(family)
    adapter = tiny_target(family)
    folder = random_spec_folder(adapter, tmp_path / "spec")
    for i in range(2):
        inputs = adapter.build_inputs(tiny_image(i, ((16, 16), (32, 16))[i]), PROMPTS[i])
        with torch.inference_mode():
            ref = model.generate(**inputs, max_new_tokens=12, do_sample=False)
            got = model.generate(**inputs, custom_generate=str(folder), trust_remote_code=True,
                                 max_new_tokens=12, do_sample=False)
            out = model.generate(**inputs, custom_generate=str(folder), trust_remote_code=True,
                                 max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
        assert got.tolist() == ref.tolist(), family
        assert out.sequences.tolist() == ref.tolist()
    drafts = model.__dict__["_dreams_adapter"].__dict__["_dreams_drafts"]
    mine = [d for key, d in drafts.items() if key[0] == str(folder.resolve())]
    assert [d.spec.draft_len for d in mine] == [3]  # the folder's draft decoded
    # streamed text equals the returned text
    streamed: list[str] = []

    class Collect(TextStreamer):
        def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
            streamed.append(text)

    tokenizer = processor.tokenizer
    with torch.inference_mode():
        got = model.generate(**inputs, custom_generate=str(folder), trust_remote_code=True,
                             max_new_tokens=12, do_sample=False,
                             streamer=Collect(tokenizer, skip_prompt=True))
    prompt = inputs["input_ids"].shape[1]
    assert "".join(streamed).strip() == tokenizer.decode(got[0, prompt:]).strip()


def test_another_target_and_unsupported_options_are_refused(tiny_vlm, tiny_target,
                                                            tmp_path) -> None:
    llava = tiny_target("llava")
    folder = random_spec_folder(llava, tmp_path / "spec")
    model, _ = tiny_vlm("qwen2_vl")
    inputs = tiny_target("qwen2_vl").build_inputs(tiny_image(0), PROMPTS[0])
    with pytest.raises(InputError, match="was searched for target .* but the loaded target"):
        model.generate(**inputs, custom_generate=str(folder), trust_remote_code=True,
                       max_new_tokens=4)
    llava_model, _ = tiny_vlm("llava")
    inputs = llava.build_inputs(tiny_image(0), PROMPTS[0])
    with pytest.raises(InputError, match="num_beams=2 is not supported"):
        llava_model.generate(**inputs, custom_generate=str(folder), trust_remote_code=True,
                             max_new_tokens=4, num_beams=2)


def test_sampling_through_generate_keeps_the_targets_distribution(tmp_path) -> None:
    """`model.generate(custom_generate=folder, do_sample=True)` with a trained draft: the second
    token (the first a draft proposes) over many calls vs its exact law."""
    from _support.drafts import second_token_law, train_tiny_draft
    from _support.models import build_tiny_llava, tiny_prompts
    from dreams_nas.supernet.core.io import atomic_write_json
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.decoding.hf_entry import write_shim
    from dreams_nas.supernet.decoding.sampling import SamplingConfig
    from dreams_nas.supernet.draft.extract import extract
    from dreams_nas.supernet.target.adapter import TargetAdapter
    from scipy.stats import chisquare

    model = build_tiny_llava(seed=1)
    adapter = TargetAdapter.from_model(model)
    prompts = tiny_prompts(16, seed=5)
    spec = SubnetSpec(4, 1.0, 2, 2)
    folder = tmp_path / "spec"
    extract(train_tiny_draft(adapter, prompts), spec).save_pretrained(folder)
    atomic_write_json(folder / "spec.json", {"schema_version": 1, "spec": spec.to_dict(),
                                             "target": adapter.describe()})
    write_shim(folder)
    prompt = prompts[0]
    expected = second_token_law(adapter, prompt, SamplingConfig(temperature=1.0, top_k=4))
    counts = torch.zeros_like(expected)
    torch.manual_seed(0)
    for _ in range(200):
        with torch.inference_mode():
            out = model.generate(**prompt, custom_generate=str(folder), trust_remote_code=True,
                                 do_sample=True, temperature=1.0, top_k=4, max_new_tokens=3)
        counts[out[0, prompt["input_ids"].shape[1] + 1]] += 1
    support = expected > 0
    assert counts[~support].sum() == 0
    _, p = chisquare(counts[support].numpy(), expected[support].numpy() * 200)
    assert p > 1e-3, (counts[support], expected[support] * 200)


def test_a_text_iterator_streamer_yields_the_returned_text(tiny_vlm, tiny_target,
                                                           tmp_path) -> None:
    import threading

    from transformers import TextIteratorStreamer

    model, processor = tiny_vlm("llava")
    adapter = tiny_target("llava")
    folder = random_spec_folder(adapter, tmp_path / "spec")
    inputs = adapter.build_inputs(tiny_image(1), PROMPTS[1])
    streamer = TextIteratorStreamer(processor.tokenizer, skip_prompt=True)
    out: dict = {}

    def run() -> None:
        with torch.inference_mode():
            out["ids"] = model.generate(**inputs, custom_generate=str(folder),
                                        trust_remote_code=True, max_new_tokens=12,
                                        streamer=streamer)

    thread = threading.Thread(target=run)
    thread.start()
    text = "".join(streamer)
    thread.join()
    new = out["ids"][0, inputs["input_ids"].shape[1]:]
    assert text.strip() == processor.tokenizer.decode(new).strip() != ""


def test_eos_token_id_and_generation_config_as_in_generate(tiny_vlm, tiny_target,
                                                            tmp_path) -> None:
    import copy

    model, _ = tiny_vlm("llava")
    adapter = tiny_target("llava")
    folder = random_spec_folder(adapter, tmp_path / "spec")
    inputs = adapter.build_inputs(tiny_image(2), PROMPTS[2])
    prompt = inputs["input_ids"].shape[1]
    config = copy.deepcopy(model.generation_config)
    config.max_new_tokens, config.do_sample = 5, False
    with torch.inference_mode():
        full = model.generate(**inputs, max_new_tokens=12, do_sample=False)
        eos = int(full[0, prompt + 3])
        for kwargs in ({"eos_token_id": eos, "max_new_tokens": 12, "do_sample": False},
                       {"generation_config": config}):
            ref = model.generate(**inputs, **kwargs)
            got = model.generate(**inputs, custom_generate=str(folder), trust_remote_code=True,
                                 **kwargs)
            assert got.tolist() == ref.tolist(), kwargs
    assert got.shape[1] == prompt + 5 and ref.shape[1] <= full.shape[1]
