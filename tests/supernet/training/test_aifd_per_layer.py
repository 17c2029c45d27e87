"""`measure_target_entropy` reduces each layer's attention entropy as that layer runs, in query
chunks: it must agree with the all-layers computation (eager + output_attentions=True), leave the
model's output and every attention implementation as they were, and feed `measure_aifd` one
batch at a time."""

from __future__ import annotations

import pytest
import torch
from dreams_nas.supernet.training.aifd import EntropyMeter, measure_target_entropy

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------ tiny models and padded batches
def _llava_batches(tiny_models) -> list[dict[str, torch.Tensor]]:
    """Two batches of two prompts of the bare tiny LLaVA (16 image tokens each); the shorter
    prompt of each batch is left-padded with pad id 0 and attention_mask 0."""
    gen = torch.Generator().manual_seed(3)
    image = torch.full((16,), tiny_models.LLAVA_IMAGE_TOKEN)
    batches = []
    for extra in (2, 5):
        rows = []
        for tail in (2, 2 + extra):
            words = torch.randint(5, tiny_models.LLAVA_VOCAB, (1 + tail,), generator=gen)
            rows.append(torch.cat((torch.tensor([1]), words[:1], image, words[1:])))
        width = max(len(r) for r in rows)
        ids = torch.stack([torch.cat((torch.zeros(width - len(r), dtype=r.dtype), r))
                           for r in rows])
        mask = torch.stack([torch.cat((torch.zeros(width - len(r), dtype=torch.long),
                                       torch.ones(len(r), dtype=torch.long))) for r in rows])
        batches.append({"input_ids": ids, "attention_mask": mask,
                        "pixel_values": torch.randn(2, 3, 16, 16, generator=gen)})
    return batches


def _qwen2_vl_batch(model, processor, tiny_models) -> dict[str, torch.Tensor]:
    """One batch of two Qwen2-VL prompts with images; the shorter one is left-padded (input_ids
    0, attention_mask 0, mm_token_type_ids 0)."""
    rows = []
    for seed, prompt in enumerate(tiny_models.PROMPTS[:2]):
        messages = [{"role": "user",
                     "content": [{"type": "image"}, {"type": "text", "text": prompt}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        rows.append(dict(processor(images=[tiny_models.tiny_image(seed)], text=[text])))
    width = max(r["input_ids"].shape[1] for r in rows)

    def pad(key: str) -> torch.Tensor:
        return torch.cat([torch.nn.functional.pad(r[key], (width - r[key].shape[1], 0))
                          for r in rows])

    assert rows[0]["input_ids"].shape[1] != rows[1]["input_ids"].shape[1]  # padding happens
    return {"input_ids": pad("input_ids"), "attention_mask": pad("attention_mask"),
            "mm_token_type_ids": pad("mm_token_type_ids"),
            "pixel_values": torch.cat([r["pixel_values"] for r in rows]),
            "image_grid_thw": torch.cat([r["image_grid_thw"] for r in rows])}


@pytest.fixture(scope="module")
def llava(tiny_models):
    return tiny_models.build_tiny_llava(seed=1, layers=4), _llava_batches(tiny_models)


@pytest.fixture(scope="module")
def qwen2_vl(tiny_models):
    model, processor = tiny_models.build_tiny_vlm("qwen2_vl")
    return model, [_qwen2_vl_batch(model, processor, tiny_models)]


def _implementations(model) -> dict[str, object]:
    """The attention implementation of every config the model holds: the top-level one, its
    sub-configs at any depth, and the config of every sub-model."""
    out = {}
    todo = [("config", model.config)]
    while todo:
        key, cfg = todo.pop(0)
        out[key] = cfg._attn_implementation
        todo.extend((f"{key}.{sub}", getattr(cfg, sub)) for sub in cfg.sub_configs
                    if getattr(cfg, sub, None) is not None)
    for name, module in model.named_modules():
        if name and hasattr(module, "config") and hasattr(module.config, "_attn_implementation"):
            out[f"module:{name}"] = module.config._attn_implementation
    return out


def _reference(model, batches):
    """The all-layers computation: eager text attention, output_attentions=True, every layer's
    map reduced by EntropyMeter at once. Returns (AE per layer, logits per batch)."""
    text_cfg = model.config.get_text_config()
    saved = text_cfg._attn_implementation
    text_cfg._attn_implementation = "eager"
    meter, logits = EntropyMeter(text_cfg.num_hidden_layers), []
    try:
        with torch.no_grad():
            for batch in batches:
                out = model(**batch, output_attentions=True, use_cache=False)
                meter.add(out.attentions, batch["attention_mask"].bool())
                logits.append(out.logits)
    finally:
        text_cfg._attn_implementation = saved
    return meter.mean(), logits


def _captured_logits(model) -> tuple[list[torch.Tensor], object]:
    seen: list[torch.Tensor] = []
    handle = model.register_forward_hook(lambda _m, _a, out: seen.append(out.logits.clone()))
    return seen, handle


def _elements(batch, model, queries: int) -> int:
    """chunk_elements that gives chunks of `queries` query rows on this batch."""
    text_cfg = model.config.get_text_config()
    return batch["input_ids"].shape[0] * text_cfg.num_attention_heads * \
        batch["input_ids"].shape[1] * queries


# ------------------------------------------------------------------------------------- the tests
@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
@pytest.mark.parametrize("chunk_queries", [1, 3, None])  # None: the default budget, one chunk
def test_aifd_per_layer_matches_all_layers_reference(family, chunk_queries, request):
    model, batches = request.getfixturevalue(family)
    before = _implementations(model)
    expected_ae, expected_logits = _reference(model, batches)
    kwargs = {} if chunk_queries is None else {
        "chunk_elements": _elements(batches[-1], model, chunk_queries)}
    seq = batches[-1]["input_ids"].shape[1]
    assert chunk_queries is None or chunk_queries < seq  # several chunks per layer
    seen, handle = _captured_logits(model)
    try:
        ae = measure_target_entropy(model, batches, **kwargs)
    finally:
        handle.remove()
    assert len(ae) == model.config.get_text_config().num_hidden_layers
    torch.testing.assert_close(torch.tensor(ae, dtype=torch.float64),
                               torch.tensor(expected_ae, dtype=torch.float64),
                               rtol=0, atol=1e-5)
    # what the model computed while measured is what eager computes
    assert len(seen) == len(batches)
    for got, want in zip(seen, expected_logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert _implementations(model) == before


def test_aifd_per_layer_counts_only_the_query_mask_rows(llava):
    model, batches = llava
    batch = batches[0]
    # only the last query of each row counts: its own reference
    last = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
    last[:, -1] = True
    text_cfg = model.config.get_text_config()
    saved = text_cfg._attn_implementation
    text_cfg._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model(**batch, output_attentions=True, use_cache=False)
    finally:
        text_cfg._attn_implementation = saved
    meter = EntropyMeter(len(out.attentions))
    meter.add(out.attentions, last)
    ae = measure_target_entropy(model, [batch], [last], chunk_elements=_elements(batch, model, 4))
    assert ae == pytest.approx(meter.mean(), abs=1e-5)
    # None: every position counts, padding included
    meter = EntropyMeter(len(out.attentions))
    meter.add(out.attentions)
    assert measure_target_entropy(model, [batch], [None]) == pytest.approx(meter.mean(), abs=1e-5)


def _registered_names() -> set[str]:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    return set(AttentionInterface._global_mapping) | set(AttentionMaskInterface._global_mapping)


@pytest.mark.parametrize("family", ["llava", "qwen2_vl"])
def test_aifd_per_layer_restores_each_implementation_after_an_error(family, request):
    model, batches = request.getfixturevalue(family)
    text_cfg = model.config.get_text_config()
    # a vision tower on its own implementation (eager) must not get the text's (sdpa) back
    model.config.vision_config._attn_implementation = "eager"
    try:
        before, names = _implementations(model), _registered_names()
        assert before["config.vision_config"] == "eager"
        assert text_cfg._attn_implementation == "sdpa"

        # an error raised by the model in the middle of the forward (after layer 1's attention)
        def boom(*_args):
            raise RuntimeError("boom in layer 2")

        layers = model.get_decoder().layers
        handle = layers[1].register_forward_pre_hook(boom)
        try:
            with pytest.raises(RuntimeError, match="boom in layer 2"):
                measure_target_entropy(model, batches)
        finally:
            handle.remove()
        assert _implementations(model) == before
        assert _registered_names() == names

        # an error raised by the measurement itself: a query mask of the wrong shape
        bad = torch.ones(1, 3, dtype=torch.bool)
        with pytest.raises(ValueError, match=r"query mask of shape \(1, 3\) does not match"):
            measure_target_entropy(model, batches[:1], [bad])
        assert _implementations(model) == before
        assert _registered_names() == names

        # and after a clean run
        measure_target_entropy(model, batches[:1])
        assert _implementations(model) == before
        assert _registered_names() == names
    finally:
        model.config.vision_config._attn_implementation = "sdpa"


def test_aifd_per_layer_rejects_a_chunk_budget_below_one(llava):
    model, batches = llava
    with pytest.raises(ValueError, match="chunk_elements=0 must be a positive"):
        measure_target_entropy(model, batches, chunk_elements=0)


def test_aifd_per_layer_holds_no_attention_map_of_a_whole_layer(llava, monkeypatch):
    """With chunks of 2 queries, no attention weights bigger than (batch, heads, 2, keys) are
    ever made: the family's eager function only sees query chunks."""
    import transformers.models.llama.modeling_llama as llama

    model, batches = llava
    batch = batches[0]
    shapes = []
    eager = llama.eager_attention_forward

    def spy(module, query, *args, **kwargs):
        out, weights = eager(module, query, *args, **kwargs)
        shapes.append(tuple(weights.shape))
        return out, weights

    monkeypatch.setattr(llama, "eager_attention_forward", spy)
    measure_target_entropy(model, [batch], chunk_elements=_elements(batch, model, 2))
    seq = batch["input_ids"].shape[1]
    assert shapes and all(s[2] <= 2 and s[3] == seq for s in shapes)
    assert len(shapes) == 4 * -(-seq // 2)  # 4 layers, ceil(seq / 2) chunks each


def test_measure_aifd_moves_one_batch_at_a_time(monkeypatch, tiny_models):
    """measure_aifd prepares (moves and extends) a calibration batch only when the measurement
    asks for it: a lazy iterable, not a list of every batch on the device."""
    from dreams_nas.supernet.training import selfdistill

    model = tiny_models.build_tiny_llava(seed=2, layers=3)
    prompts = tiny_models.tiny_prompts(3, seed=4)
    answers = [torch.tensor([7, 8, 9]), torch.tensor([10, 11]), torch.tensor([12])]
    extended, prepared_when_run = [], []
    extend = selfdistill.TargetAdapter.extend_inputs
    real = selfdistill.measure_target_entropy

    def counting_extend(self, inputs, tokens):
        extended.append(tokens.shape[1])
        return extend(self, inputs, tokens)

    def spy(model, batches, *args, **kwargs):
        assert not isinstance(batches, list | tuple)

        def watch():
            for batch in batches:
                prepared_when_run.append(len(extended))
                yield batch

        return real(model, watch(), *args, **kwargs)

    monkeypatch.setattr(selfdistill.TargetAdapter, "extend_inputs", counting_extend)
    monkeypatch.setattr(selfdistill, "measure_target_entropy", spy)
    result = selfdistill.measure_aifd(model, prompts, answers)
    assert extended == [3, 2, 1] and prepared_when_run == [1, 2, 3]
    assert len(result.ae) == 3 and len(result.chosen) == 1


def test_aifd_in_bfloat16_without_native_instructions_matches_eager(tiny_models, monkeypatch):
    """On a CPU without native 16-bit products eager runs on float32 copies of the 16-bit
    queries, keys and values: the entropies and the model's logits stay eager's own (bfloat16
    kernels) to bfloat16 precision."""
    import copy

    from dreams_nas.supernet.ops import linear as fast

    model = copy.deepcopy(tiny_models.build_tiny_llava(seed=1, layers=4)).to(torch.bfloat16)
    batches = [{k: (v.to(torch.bfloat16) if v.is_floating_point() else v)
                for k, v in b.items()} for b in _llava_batches(tiny_models)]
    monkeypatch.setattr(fast, "_native_bf16", lambda: True)  # torch's own 16-bit kernels
    expected_ae, expected_logits = _reference(model, batches)
    monkeypatch.setattr(fast, "_native_bf16", lambda: False)
    seen, handle = _captured_logits(model)
    try:
        ae = measure_target_entropy(model, batches)
    finally:
        handle.remove()
    torch.testing.assert_close(torch.tensor(ae), torch.tensor(expected_ae), rtol=2e-2, atol=2e-2)
    assert all(got.dtype == torch.bfloat16 for got in seen)
    for got, want in zip(seen, expected_logits, strict=True):
        torch.testing.assert_close(got.float(), want.float(), rtol=5e-2, atol=5e-2)
