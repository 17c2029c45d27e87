"""`dreams-nas profile` as one library call: identify, plan, time (resumable), fit, save.

Files in ``<run>/latency/<hardware-id>/``: hardware.json, plan.json (what was asked for:
context lengths, visual tokens, budget), profile.csv (append-only), predictor.skops,
predictor_train.csv, predictor.json.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from dreams_nas.latency.measure.hardware import HardwareInfo, detect_hardware
from dreams_nas.latency.measure.plan import DEFAULT_VERIFY_KS, build_plan
from dreams_nas.latency.measure.profile_store import ProfileStore
from dreams_nas.latency.measure.profiler import TimingSettings, run_profile
from dreams_nas.latency.model.predictor import LatencyPredictor
from dreams_nas.nas.stages.contexts import measure_data_contexts
from dreams_nas.nas.stages.profile_checks import (
    check_options,
    check_same_hardware,
    check_same_target,
    compile_seconds,
    log_accuracy,
    log_compile,
    profile_fingerprint,
    static_positions,
    warn_partial_fit,
)
from dreams_nas.nas.stages.profile_transfer import recorded_transfer
from dreams_nas.supernet.core.device import resolve_compile, resolve_device
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.io import atomic_write_json, read_json
from dreams_nas.supernet.core.runfolder import RunFolder
from dreams_nas.supernet.core.space import SearchSpace, default_draft_vocab

log = logging.getLogger("dreams_nas.latency")


@dataclass(frozen=True)
class ProfileOptions:
    target: str | None = None  # "builtin" | checkpoint folder; None: run.json's, else builtin
    device: str = "auto"
    dtype: str | None = None  # None/auto: the run's dtype, else auto (RunFolder.dtype)
    budget: float | int | str | None = None
    context_lengths: Sequence[int] | None = None  # None: spanning the data's (`contexts`)
    # the evaluation prompts whose visual tokens and lengths set the default context grid
    data: str = "builtin"
    limit: int | None = None
    max_new_tokens: int = 64
    repeats: int = 100
    warmup: int = 3  # untimed runs of a step before each pass's repeats
    threads: int | None = None
    clock: str = "wall"
    # Each step's repeats are spread over `passes` visits, interleaved with the other steps of
    # its block of `chunk` (0: the whole grid), so that the machine's drift hits them alike.
    passes: int = 10
    chunk: int = 256
    holdout: float = 0.2
    stat: str = "p10_ms"  # the per-row statistic the predictor fits (p10_ms or median_ms)
    fit_only: bool = False
    seed: int = 0
    show_progress: bool | None = None
    budget_option: str = "--budget"  # the flag `budget` came from, named in messages
    # source device folders (<run>/latency/<hardware-id>) to transfer the prices from: time
    # `budget` steps here, not the grid (`profile_transfer`)
    transfer_from: tuple[str, ...] = ()
    compile: str = "auto"  # --compile: the steps timed compiled ("on"), eager ("off") or auto
    batch: int = 1  # requests per timed step (a hardware id of its own past 1: <id>-b<B>)


def timing_passes(repeats: int, passes: int) -> int:
    """The passes a step's repeats are spread over: at most `repeats`, since every pass times
    at least one repeat and `--repeats` is an upper bound on the samples of a step."""
    return max(1, min(passes, repeats))


def max_context_len(config: Any, verify_ks: Sequence[int] = DEFAULT_VERIFY_KS) -> int | None:
    """The longest context the target can be timed at: its text config's
    `max_position_embeddings`, less the positions a verify step appends; None when unknown."""
    from dreams_nas.latency.measure.steps import text_config

    positions = getattr(text_config(config), "max_position_embeddings", None)
    return int(positions) - max(verify_ks) if positions else None


def check_context_lengths(contexts: Sequence[int], visual_tokens: int, config: Any) -> None:
    """Refuse context lengths the target cannot hold (past its maximum positions: minutes of
    allocation failures otherwise) or that leave no text after the image, before timing."""
    longest = max_context_len(config)
    too_long = sorted(c for c in contexts if longest is not None and c > longest)
    if too_long:
        raise InputError(
            f"--context-lengths {' '.join(map(str, too_long))} exceed what the target holds: "
            f"max_position_embeddings {longest + max(DEFAULT_VERIFY_KS)}, less the "
            f"{max(DEFAULT_VERIFY_KS)} positions a verify step adds; give lengths up to "
            f"{longest}")
    too_short = sorted(c for c in contexts if c <= visual_tokens)
    if too_short:
        raise InputError(
            f"--context-lengths {' '.join(map(str, too_short))} leave no text after the "
            f"{visual_tokens} visual tokens of one image; give lengths above {visual_tokens}")


def _eval_examples(options: ProfileOptions) -> list[Any]:
    """The evaluation prompts whose visual tokens and lengths the profile reads (`contexts`)."""
    from dreams_nas.nas.stages.inputs import load_eval_examples
    from dreams_nas.supernet.data.prompts import check_data

    check_data(options.data)
    return load_eval_examples(options.data, options.limit, options.seed)


def _range(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low}..{high}"


def count_visual_tokens(adapter: Any) -> int:
    """Visual tokens of one image in a real prompt built by the target's processor; from the
    config when the checkpoint has no processor."""
    from dreams_nas.latency.measure.steps import visual_tokens_of

    if adapter.processor is not None:
        try:
            from PIL import Image

            size = getattr(getattr(adapter.model.config, "vision_config", None), "image_size", 224)
            image = Image.new("RGB", (int(size), int(size)), (127, 127, 127))
            ids = adapter.build_inputs(image, "What is in the picture?")["input_ids"]
            return int((ids == adapter.info.image_token_id).sum())
        except Exception as exc:  # noqa: BLE001 - fall back to the config's count
            log.debug("cannot build a prompt to count visual tokens (%s); using the config", exc)
    return visual_tokens_of(adapter.model.config)


def _space_and_supernet(run: RunFolder, model: Any, seed: int) -> tuple[SearchSpace, Any]:
    from dreams_nas.latency.measure.steps import build_supernet, text_config

    config = None
    if (run.supernet_dir / "config.json").is_file():
        from dreams_nas.supernet.draft.saving import read_supernet_config

        config = read_supernet_config(run.supernet_dir)  # weights are not needed: cost only
    if run.read_run().get("space") is not None:
        space = run.space()
    else:
        text = text_config(model.config)
        heads = config.num_heads if config is not None else int(text.num_attention_heads)
        # a trained supernet's own depths, MLP widths and draft vocabularies; without one the
        # paper's one size and the draft vocabularies `train` would offer for this target
        sizes = ({"draft_vocab": default_draft_vocab(int(text.vocab_size))} if config is None
                 else {"depth": tuple(range(1, config.num_layers + 1)),
                       "mlp": tuple(config.mlp_shares),
                       "draft_vocab": tuple(config.vocab_shares)})
        space = SearchSpace.default_for(int(text.num_hidden_layers), heads, **sizes)
    return space, build_supernet(model, space, config, seed=seed)


def profile(run: RunFolder, options: ProfileOptions) -> dict[str, Any]:
    """Profile the present device (resuming a killed run) and fit its latency predictor."""
    from dreams_nas.nas.stages.inputs import check_run_folder
    from dreams_nas.supernet.core.runlock import stage_lock

    started = time.perf_counter()
    check_run_folder(run)
    device = resolve_device(options.device)
    check_options(options, device)
    dtype_name = run.dtype(options.dtype, device)
    hw = detect_hardware(device, dtype=dtype_name, threads=options.threads,
                         steps=resolve_compile(options.compile, device), batch=options.batch)
    store = ProfileStore(run.profile_csv(hw.hardware_id))
    with stage_lock(run.root, [f"latency-{hw.hardware_id}"], "dreams-nas profile"):
        if options.fit_only:
            timed = _recorded(run, hw, store, device, options.transfer_from)
            result = None
        else:
            timed, result = _time_steps(run, options, hw, store)
        summary = _fit(run, options, timed, store)
    summary.update(device=device, batch=options.batch,
                   seconds=round(time.perf_counter() - started, 1))
    if result is not None:
        summary.update(measured=result.measured, resumed=result.skipped, failed=result.failed)
    return summary


class _Timed(NamedTuple):
    """What the fit needs of the timing: the profile's folder, the rows' machine, the visual
    tokens of a prompt, the target's architecture hash and, for a transfer, its sources."""

    folder: Path
    hw: HardwareInfo
    visual_tokens: int
    architecture: str | None
    sources: list[Any] | None = None  # `profile_transfer.Source`s
    compile_s: dict[str, float] = {}  # compiled steps: each shape's compilation (warm-up)


def _recorded(run: RunFolder, hw: HardwareInfo, store: ProfileStore, device: str,
              transfer_from: Sequence[str] = ()) -> _Timed:
    """`--fit-only`: the recorded profile's machine, visual tokens and architecture, and the
    transfer's sources (`transfer_from`, else those plan.json records, if any)."""
    folder = run.latency_dir(hw.hardware_id)  # this machine's: the rows' identity may differ
    if not store.exists():
        others = run.hardware_ids()
        hint = (f" (profiled in this run: {', '.join(others)}; give the --device and "
                "--threads they were timed with)") if others else ""
        raise MissingArtefactError(
            f"no latency profile in {store.path}; run `dreams-nas profile --device {device}` "
            f"without --fit-only first{hint}")
    plan = run.plan_json(hw.hardware_id)
    plan_info = read_json(plan) if plan.is_file() else {}
    if run.hardware_json(hw.hardware_id).is_file():  # the rows' own identity, not this machine's
        from dreams_nas.nas.stages.inputs import hardware_identity  # refuses a damaged one

        hw = HardwareInfo.from_dict(hardware_identity(run, hw.hardware_id))
    architecture = plan_info.get("architecture_hash")
    recorded = recorded_transfer(plan)
    paths = transfer_from or (recorded or {}).get("folders") or ()
    sources = _sources(run, paths, folder, hw, architecture) if paths else None
    return _Timed(folder, hw, int(plan_info.get("visual_tokens", 0)), architecture, sources)


def _sources(run: RunFolder, paths: Sequence[str], folder: Path, hw: HardwareInfo,
             architecture: str | None) -> list[Any]:
    """The transfer's source devices, checked against this device's program (and the run's
    space, once it has one)."""
    from dreams_nas.nas.stages.profile_transfer import check_space, load_sources

    sources = load_sources(paths, folder, profile_fingerprint(hw, architecture))
    if run.read_run().get("space") is not None:
        check_space(sources, run.space())
    return sources


def _time_steps(run: RunFolder, options: ProfileOptions, hw: HardwareInfo, store: ProfileStore
                ) -> tuple[_Timed, Any]:
    """Time every planned step that profile.csv lacks (plan.json and hardware.json written
    first): the real target and the supernet's extracted drafts."""
    from dreams_nas.latency.measure.steps import ModelSteps
    from dreams_nas.supernet.builtin.resolve import resolve_target
    from dreams_nas.supernet.core.device import torch_dtype
    from dreams_nas.supernet.target.adapter import TargetAdapter

    folder = run.latency_dir(hw.hardware_id)
    check_same_hardware(folder, hw, options.clock)
    # a bad --data fails before the slow load (a transfer reads its sources' contexts instead)
    examples = None if options.transfer_from else _eval_examples(options)
    target_id = options.target or run.target_source() or "builtin"
    where = resolve_target(target_id)  # a named target is built (and logged) on first use
    check_same_target(folder, where, target_id)  # from its config, before the slow load
    sources = (_sources(run, options.transfer_from, folder, hw, TargetAdapter.architecture(where))
               if options.transfer_from else None)
    if sources:  # everything a transfer refuses, before the slow load
        from dreams_nas.nas.stages.profile_transfer import check_transfer

        check_transfer(sources, store, budget=options.budget,
                       budget_option=options.budget_option,
                       context_lengths=options.context_lengths)
    adapter = TargetAdapter.load(where, target_id=target_id, device=hw.device,
                                 dtype=torch_dtype(hw.dtype))
    adapter.use_steps(hw.steps)  # the steps the deployment runs: eager or compiled
    entry = adapter.describe()
    space, supernet = _space_and_supernet(run, adapter.model, options.seed)
    timed_space = space if options.batch == 1 else replace(space, trees=())  # batches: chains
    if sources is None:
        visual_tokens, contexts, data = _contexts(adapter, options, examples)
        keys = build_plan(timed_space, contexts, budget=options.budget, seed=options.seed,
                          budget_option=options.budget_option)
        planned = {"data_contexts": None if data is None else data.to_dict()}
    else:
        from dreams_nas.nas.stages.profile_transfer import plan_transfer

        visual_tokens, contexts, keys, planned = plan_transfer(
            sources, space, store, folder, budget=options.budget,
            budget_option=options.budget_option, context_lengths=options.context_lengths)
    passes = timing_passes(options.repeats, options.passes)
    if passes < options.passes:
        log.info("--passes %d is more than --repeats %d: each step is timed in %d passes of "
                 "one repeat", options.passes, options.repeats, passes)
    existing = run.read_run()
    run.update_run(**{k: v for k, v in (("target", entry), ("space", space.to_dict()),
                                         ("dtype", hw.dtype)) if k not in existing})
    atomic_write_json(run.hardware_json(hw.hardware_id), hw.to_dict())
    atomic_write_json(run.plan_json(hw.hardware_id), {
        "visual_tokens": visual_tokens, "context_lengths": contexts, "budget": options.budget,
        "seed": options.seed, "space": space.to_dict(), "n_keys": len(keys),
        "repeats": options.repeats, "warmup": options.warmup, "clock": options.clock,
        "threads": hw.threads, "passes": passes, "chunk": options.chunk,
        "verify_after": timed_space.largest().id, "target": entry.get("id"),
        "batch": options.batch,
        "architecture_hash": entry["architecture_hash"], **planned,
    })
    settings = TimingSettings(warmup=options.warmup, repeats=options.repeats,
                              min_repeats=min(5, options.repeats), threads=hw.threads,
                              clock=options.clock, passes=passes, chunk=options.chunk)
    # Every verify is timed after the largest subnet's draft steps, as the loop runs it.
    positions = static_positions(contexts, keys, options.max_new_tokens)
    if options.batch == 1:
        steps = ModelSteps(adapter, supernet, visual_tokens, seed=options.seed,
                           precede=space.largest(), trees=space.trees, positions=positions)
    else:
        from dreams_nas.latency.measure.batch_steps import BatchModelSteps

        steps = BatchModelSteps(adapter, supernet, visual_tokens, options.batch,
                                seed=options.seed, precede=timed_space.largest(),
                                positions=positions)
    log.info("profiling %d steps on %s (%s) into %s", len(keys), hw.name, hw.hardware_id, folder)
    result = run_profile(steps, keys, store, hw, settings, show_progress=options.show_progress)
    compiled = compile_seconds(adapter)
    log_compile(compiled)
    return _Timed(folder, hw, visual_tokens, entry["architecture_hash"], sources,
                  compiled), result


def _contexts(adapter: Any, options: ProfileOptions, examples: list[Any]
              ) -> tuple[int, list[int], Any]:
    """(visual tokens of a prompt, the context grid, the data's contexts or None): the grid
    spans the evaluation prompts' contexts unless `--context-lengths` gives one."""
    from dreams_nas.latency.measure.steps import default_context_lengths

    data = measure_data_contexts(adapter, examples, options.data, options.max_new_tokens)
    if data is not None:
        visual_tokens = data.median_visual_tokens
        log.info("evaluation prompts (%s, %d): %s visual tokens, %s tokens long; contexts "
                 "span %d..%d", options.data, len(examples),
                 _range(data.visual_tokens), _range(data.prompt_lens), *data.span())
    else:
        visual_tokens = count_visual_tokens(adapter)
    contexts = list(options.context_lengths or (data.grid() if data is not None
                                                else default_context_lengths(visual_tokens)))
    check_context_lengths(contexts, visual_tokens, adapter.model.config)
    return visual_tokens, contexts, data


def _fit(run: RunFolder, options: ProfileOptions, timed: _Timed, store: ProfileStore
         ) -> dict[str, Any]:
    """Fit the predictor on the profile's ok rows, save it beside them; the summary."""
    hw, folder = timed.hw, timed.folder
    fitted = store.ok_rows()
    fingerprint = profile_fingerprint(hw, timed.architecture)
    if timed.sources:
        from dreams_nas.nas.stages.profile_transfer import fit_transfer

        predictor = fit_transfer(timed.sources, store, hw.hardware_id,
                                 visual_tokens=timed.visual_tokens, stat=options.stat,
                                 seed=options.seed, fingerprint=fingerprint)
    else:
        predictor = LatencyPredictor.fit(fitted, hw.hardware_id,
                                         visual_tokens=timed.visual_tokens,
                                         holdout=options.holdout, seed=options.seed,
                                         stat=options.stat, fingerprint=fingerprint)
    warn_partial_fit(store, len(fitted), folder / "plan.json")
    predictor.save(folder)
    report = predictor.report()
    log_accuracy(predictor.metrics_by_kind,
                 "transfer, measured" if predictor.transfer else "predictor, held-out")
    return {
        "hardware_id": hw.hardware_id, "dtype": hw.dtype,
        "profile": str(store.path), "rows": int(len(store.read())),
        "regressor": report["regressor"], "stat": options.stat,
        **{k: round(v, 4) for k, v in predictor.metrics.items()},
        "by_kind": {kind: {k: v if k == "n" else round(v, 4) for k, v in m.items()}
                    for kind, m in predictor.metrics_by_kind.items()},
        "context_range": report["context_range"],
        "n_train": report["n_train"], "n_holdout": report["n_holdout"],
        **({"transferred_from": [s["hardware_id"] for s in predictor.transfer["sources"]],
            "measured_steps": predictor.transfer["measured"]} if predictor.transfer else {}),
        **({"compile_s": timed.compile_s} if timed.compile_s else {}),
    }
