"""Build the built-in target: train a small LLaVA on the synthetic tasks, grow it, time it, save it.

`build_builtin_target` trains a real `LlavaForConditionalGeneration` (a one-layer CLIP vision tower
with patch size = the synthetic tasks' cell size, and a deep, narrow Llama) on the synthetic tasks
of `data.synth` until its greedy answers match the references (trained shallow with an auxiliary
per-cell loss on the image tokens, see `training.CellPatterns`, then grown to full depth
function-preservingly and fine-tuned, see `grow_text_layers`), then saves model + processor with
`save_pretrained`, so the folder loads like any checkpoint on disk.
"""

from __future__ import annotations

import logging
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from dreams_nas.supernet.builtin.parallel import train_on_ranks
from dreams_nas.supernet.builtin.processor import build_processor
from dreams_nas.supernet.builtin.training import (
    Encoder,
    TargetTrainConfig,
    exact_match,
    exact_match_flags,
    train_target,
)
from dreams_nas.supernet.builtin.variants import (
    BUILTIN_VERSION,
    REQUIRED_EXACT_MATCH,
    BuiltinVariant,
    get_variant,
)
from dreams_nas.supernet.builtin.word_tokenizer import IMAGE
from dreams_nas.supernet.core.device import torch_threads
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.io import atomic_write_json
from dreams_nas.supernet.core.progress import progress as progress_bar
from dreams_nas.supernet.core.versions import library_versions
from dreams_nas.supernet.data.synth import CELL, IMAGE_SIZE, TASKS, make_sample

log = logging.getLogger("dreams_nas")


def build_config(variant: BuiltinVariant, tokenizer: Any) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    vision = CLIPVisionConfig(
        hidden_size=variant.vision_hidden, intermediate_size=2 * variant.vision_hidden,
        num_hidden_layers=variant.vision_layers, num_attention_heads=variant.vision_heads,
        image_size=IMAGE_SIZE, patch_size=CELL, projection_dim=variant.vision_hidden)
    text = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=variant.text_hidden,
        intermediate_size=variant.text_intermediate, num_hidden_layers=variant.text_layers,
        num_attention_heads=variant.text_heads, num_key_value_heads=variant.text_heads,
        max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id)
    return LlavaConfig(
        vision_config=vision, text_config=text,
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE),
        vision_feature_layer=-1, vision_feature_select_strategy="default",
        image_seq_length=(IMAGE_SIZE // CELL) ** 2)


def build_builtin_target(
    out_dir: str | Path,
    variant: str = "default",
    seed: int = 0,
    progress: bool = True,
    threads: int | None = None,
) -> dict[str, Any]:
    """Train the built-in target and `save_pretrained` it (model + processor) into `out_dir`.

    Deterministic for a given `seed`, variant and thread count (the variant's `build_ranks`
    processes share the threads). Returns the metrics: eval exact
    match (greedy, on the eval split), parameter count, decode-step times of the target and of
    one- and three-layer draft-sized models, build time.
    """
    with torch_threads(threads):
        return _build(Path(out_dir), get_variant(variant), seed, progress)


def _build(out: Path, spec: BuiltinVariant, seed: int, progress: bool) -> dict[str, Any]:
    import torch

    variant = spec.name
    start = time.perf_counter()
    processor = build_processor()
    grow = spec.grow_from_layers > 0 and spec.finetune is not None
    first_layers = spec.grow_from_layers if grow else spec.text_layers
    config = build_config(replace(spec, text_layers=first_layers), processor.tokenizer)
    model = init_model(config, seed)
    encoder = Encoder(processor)

    model, result, finetune_steps = _train_and_grow(model, encoder, spec, seed, progress,
                                                    grow, first_layers)
    train_s = time.perf_counter() - start

    eval_samples = [make_sample("eval", seed, i) for i in range(spec.n_eval)]
    em = exact_match(model, encoder, eval_samples)
    per_task = _per_task_exact_match(model, encoder, eval_samples)
    generate_check = _generate_check(model, processor, eval_samples[: len(TASKS)])
    timing = measure_decode_steps(model, processor, repeats=spec.timing_repeats)

    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.pad_token_id = processor.tokenizer.pad_token_id
    model.save_pretrained(out)
    processor.save_pretrained(out)
    metrics = {
        "variant": variant, "version": BUILTIN_VERSION, "seed": seed,
        "exact_match": em, "exact_match_per_task": per_task, "n_eval": len(eval_samples),
        "generate_check": generate_check,
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_layers": spec.text_layers, "hidden_size": spec.text_hidden,
        "train_steps": result["steps"], "finetune_steps": finetune_steps,
        "grown_from_layers": first_layers if grow else None,
        "val_history": result["val_history"],
        "final_loss": result["loss_curve"][-1]["loss"],
        **timing,
        "train_s": round(train_s, 1),
        "build_s": round(time.perf_counter() - start, 1),
        "threads": torch.get_num_threads(),
        "ranks": spec.build_ranks,
        # The vector instructions torch's CPU kernels ran on: builds of one version, seed and
        # thread count on CPUs of different capability differ in float rounding.
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
        "versions": library_versions(),
    }
    atomic_write_json(out / "builtin_metrics.json", metrics)
    if variant == "default" and em < REQUIRED_EXACT_MATCH:
        log.warning("the built-in target reached only %.3f eval exact match (< %.2f) in %d steps; "
                    "its answers are less predictable than intended", em, REQUIRED_EXACT_MATCH,
                    result["steps"])
    return metrics


def _train_and_grow(model: Any, encoder: Encoder, spec: BuiltinVariant, seed: int,
                    progress: bool, grow: bool, first_layers: int
                    ) -> tuple[Any, dict[str, Any], int]:
    """Train `model` (shallow when it grows), then grow it to the variant's depth and fine-tune
    it: (the model, the run's steps, loss curve and validation history, fine-tune steps)."""
    total = spec.train.max_steps + (spec.finetune.max_steps if grow and spec.finetune else 0)
    bar = progress_bar(total=total, desc=f"training built-in target ({spec.name})",
                       unit="step", disable=None if progress else True)
    state: dict[str, float] = {}

    def on_step(step: int, loss: float, val: float | None) -> None:
        if val is not None:
            state["val"] = val
            log.info("built-in target step %d: loss %.4f, validation exact match %.3f",
                     step + 1, loss, val)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", val_em=f"{state.get('val', 0.0):.2f}")

    try:
        result = _train_phase(model, encoder, spec.train, spec, seed, on_step)
        finetune_steps = 0
        if grow and spec.finetune is not None:
            bar.total = result["steps"] + spec.finetune.max_steps
            log.info("built-in target: growing %d -> %d layers after %d steps", first_layers,
                     spec.text_layers, result["steps"])
            model = grow_text_layers(model, spec.text_layers, seed + 2)
            tuned = _train_phase(model, encoder, spec.finetune, spec, seed, on_step,
                                 sample_offset=result["steps"] * spec.train.batch_size)
            finetune_steps = tuned["steps"]
            result = {"steps": result["steps"],
                      "loss_curve": result["loss_curve"] + tuned["loss_curve"],
                      "val_history": result["val_history"] + [
                          {**h, "phase": "finetune"} for h in tuned["val_history"]]}
    finally:
        bar.close()
    return model, result, finetune_steps


def _train_phase(model: Any, encoder: Encoder, cfg: TargetTrainConfig, spec: BuiltinVariant,
                 seed: int, on_step: Callable[[int, float, float | None], None],
                 sample_offset: int = 0) -> dict[str, Any]:
    """`training.train_target` in this process, or data parallel over the variant's `build_ranks`
    local processes sharing this process's torch threads (`parallel.train_on_ranks`)."""
    import torch

    if spec.build_ranks <= 1:
        return train_target(model, encoder, cfg, data_seed=seed, on_step=on_step,
                     sample_offset=sample_offset)
    threads = max(1, torch.get_num_threads() // spec.build_ranks)
    return train_on_ranks(model, cfg, ranks=spec.build_ranks, threads_per_rank=threads,
                          data_seed=seed, sample_offset=sample_offset, on_step=on_step)


def grow_text_layers(model: Any, num_layers: int, seed: int) -> Any:
    """A copy of `model` whose Llama has `num_layers` layers and computes the same function.

    Function-preserving depth growth by block expansion (as in LLaMA Pro): the trained layers
    keep their weights and are spread evenly over the new depth; every inserted layer is a copy
    of the trained layer before it with its two residual output projections (attention
    ``o_proj``, MLP ``down_proj``) zeroed, so it starts as the identity, attends like its
    neighbour (not uniformly, as a fresh layer would) and moves away from it in the fine-tuning
    that follows. Training the shallow model first costs a fraction of a deep step per sample;
    the deep model still pays every layer at decode time.
    """
    import copy

    import torch
    from transformers import LlavaForConditionalGeneration

    old = model.model.language_model.layers
    if num_layers < len(old):
        raise InputError(f"cannot grow a {len(old)}-layer model to {num_layers} layers; "
                         "pick num_layers >= the current depth")
    config = copy.deepcopy(model.config)
    config.text_config.num_hidden_layers = num_layers
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        grown = LlavaForConditionalGeneration(config)
    new = grown.model.language_model.layers
    kept = {round(i * num_layers / len(old)): i for i in range(len(old))}  # new index -> old
    state = {k: v for k, v in model.state_dict().items() if ".language_model.layers." not in k}
    grown.load_state_dict(state, strict=False)
    with torch.no_grad():
        source = 0
        for j, layer in enumerate(new):
            source = kept.get(j, source)  # the last trained layer at or before j
            layer.load_state_dict(old[source].state_dict())
            if j not in kept:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    grown.generation_config = copy.deepcopy(model.generation_config)
    return grown


def init_model(config: Any, seed: int) -> Any:
    """The untrained built-in target of `config`: transformers' init from `seed` (the global RNG
    left untouched), then `init_patch_embeddings` and `init_projector`."""
    import torch
    from transformers import LlavaForConditionalGeneration

    with torch.random.fork_rng(devices=[]):  # weight init reads the global RNG; keep it local
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config)
    init_patch_embeddings(model, torch.Generator().manual_seed(seed))
    init_projector(model, torch.Generator().manual_seed(seed + 1))
    return model


def init_projector(model: Any, generator: Any) -> None:
    """Fan-in init of the multimodal projector, so image tokens enter the LM at unit scale.

    With the default std-0.02 init the projected patches are ~50x smaller than their content
    code and the language model needs many steps before it can read them.
    """
    import math

    import torch

    projector = model.model.multi_modal_projector
    with torch.no_grad():
        for linear in (projector.linear_1, projector.linear_2):
            weight = linear.weight  # (out, in)
            weight.copy_(torch.randn(weight.shape, generator=generator)
                         / math.sqrt(weight.shape[1]))


def init_patch_embeddings(model: Any, generator: Any) -> None:
    """Give each patch a strong content code and a 2-D position code before training.

    CLIP's default init (std 0.02 for both) leaves the 36 patch features of an image nearly
    parallel (cosine ~0.9), and the language model then spends hundreds of steps learning to
    tell the cells apart. Here the patch projection gets a fan-in init (unit-scale content
    codes) and the position table a sin/cos code of (row, column) at unit scale, so "which cell,
    holding what" is linearly readable from the first step.
    """
    import math

    import torch

    vision = model.config.vision_config
    embeddings = next(m for m in model.modules() if type(m).__name__ == "CLIPVisionEmbeddings")
    side = vision.image_size // vision.patch_size
    dim = vision.hidden_size
    with torch.no_grad():
        weight = embeddings.patch_embedding.weight  # (dim, 3, patch, patch)
        fan_in = weight[0].numel()
        weight.copy_(torch.randn(weight.shape, generator=generator) / math.sqrt(fan_in))
        rows = torch.arange(side).repeat_interleave(side).float()  # (side*side,)
        cols = torch.arange(side).repeat(side).float()
        quarter = dim // 4
        freqs = torch.pi / side * torch.arange(1, quarter + 1).float()  # (quarter,)
        code = torch.cat([torch.sin(rows[:, None] * freqs), torch.cos(rows[:, None] * freqs),
                          torch.sin(cols[:, None] * freqs), torch.cos(cols[:, None] * freqs)],
                         dim=1)  # (side*side, 4*quarter)
        table = embeddings.position_embedding.weight  # (1 + side*side, dim); row 0 = class token
        table.zero_()
        table[1:, : 4 * quarter] = code * math.sqrt(2.0)


def _per_task_exact_match(model: Any, encoder: Encoder, samples: list) -> dict[str, float]:
    out = {}
    for task in TASKS:
        subset = [s for s in samples if s.task == task]
        if subset:
            out[task] = round(exact_match(model, encoder, subset), 4)
    return out


def _generate_check(model: Any, processor: Any, samples: list) -> dict[str, Any]:
    """Greedy `model.generate` on a few eval questions, one per task: how many match exactly."""
    import torch

    encoder = Encoder(processor)
    matched = 0
    agree = 0
    for sample in samples:
        messages = [{"role": "user", "content": [{"type": "image"},
                                                 {"type": "text", "text": sample.prompt}]}]
        text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        inputs = processor(images=[sample.image], text=[text], return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**inputs, do_sample=False, max_new_tokens=80,
                                 pad_token_id=processor.tokenizer.pad_token_id)
        answer = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:],
                                            skip_special_tokens=True)
        hit = answer == sample.answer
        matched += hit
        agree += hit == bool(exact_match_flags(model, encoder.encode([sample]))[0])
    return {"n": len(samples), "matched": matched, "agrees_with_teacher_forced": agree}


# --- timing ---------------------------------------------------------------------------------------

def measure_decode_steps(model: Any, processor: Any, repeats: int = 40) -> dict[str, float]:
    """Median batch-1 decode-step time (ms) of the target and of 1- and 3-layer Llamas as wide.

    The draft-sized models share the target's text config except depth, so they cost what the
    supernet's draft layers cost (the draft's full step is decoder + cross-attention + decoder,
    about three layers). Each step decodes one token after a cached context of a real prompt,
    then crops the cache back, so every repeat sees the same context length. The three models
    are timed round-robin so background load hits them alike.
    """
    import torch
    from transformers import DynamicCache, LlamaForCausalLM

    text_config = model.config.text_config
    drafts = {}
    for layers in (1, 3):
        cfg = text_config.__class__(**{**text_config.to_dict(), "num_hidden_layers": layers})
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            drafts[layers] = LlamaForCausalLM(cfg).eval()
    sample = make_sample("eval", 0, 0)
    messages = [{"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": sample.prompt}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(images=[sample.image], text=[text], return_tensors="pt")
    context = inputs["input_ids"].shape[1]
    step_ids = torch.tensor([[processor.tokenizer.eos_token_id]])  # (1, 1)

    def prepare(net: Any, is_target: bool) -> tuple[Any, Any]:
        cache = DynamicCache(config=net.config)
        with torch.inference_mode():
            if is_target:
                net(**inputs, cache=cache, use_cache=True)
            else:
                net(input_ids=inputs["input_ids"], cache=cache, use_cache=True)
        return net, cache

    runs = {"target": prepare(model.eval(), True), "draft1": prepare(drafts[1], False),
            "draft3": prepare(drafts[3], False)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    with torch.inference_mode():
        for i in range(repeats + 3):
            for name, (net, cache) in runs.items():
                t0 = time.perf_counter()
                net(input_ids=step_ids, cache=cache, use_cache=True)
                elapsed = time.perf_counter() - t0
                cache.crop(-1)
                if i >= 3:  # warm-up steps are dropped
                    times[name].append(elapsed * 1e3)
    med = {name: statistics.median(values) for name, values in times.items()}
    return {
        "context_len": context,
        "decode_ms_target": round(med["target"], 3),
        "decode_ms_draft_1layer": round(med["draft1"], 3),
        "decode_ms_draft_3layer": round(med["draft3"], 3),
        "draft_1layer_to_target": round(med["draft1"] / med["target"], 4),
        "draft_3layer_to_target": round(med["draft3"] / med["target"], 4),
    }
