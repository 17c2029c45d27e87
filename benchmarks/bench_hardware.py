"""Cross-hardware claim: the best subnet per profiled hardware, and what each machine would lose
running another's choice.

    # one supernet; a run folder per dtype, each profiled on the machines to compare
    dreams-nas profile --run <run> --threads 1 ; dreams-nas profile --run <run> --threads 2
    dreams-nas search  --run <run> --hardware <hw> --method exhaustive --verify 0   # per <hw>
    python benchmarks/bench_hardware.py --run <run> [--run <run-bf16> ...]
        [--measure --prompts 16 --repeats 3]

A "hardware" is one (run folder, hardware id) pair: the device and thread count of the
profile, in the run's dtype. Every exhaustive search's trials.csv predicts the speedup of
every subnet of the space on its hardware (its own acceptance tau in its dtype, its own
latency model), so the table is read off them with no new model: for hardware h and the
choice c_g of hardware g, S_h(c_g) / S_h(c_h) - 1 is what h loses by deploying g's choice.

`--measure` also decodes, on this machine, the distinct choices against plain decoding for each
hardware profiled here (a CPU id with this machine's name), at that profile's thread count and
dtype, interleaved prompt by prompt, `--repeats` times (medians): the same losses, measured.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Hardware:
    run: Path
    hardware_id: str
    dtype: str
    speedups: dict[str, float]  # spec id -> predicted speedup (complete trials)
    taus: dict[str, float]
    chosen: str | None = None  # the search's own pick (best.json), ties broken as it breaks them

    @property
    def label(self) -> str:
        return f"{self.hardware_id} {self.dtype}"

    @property
    def best(self) -> str:
        if self.chosen in self.speedups:
            return self.chosen
        return max(self.speedups, key=lambda s: (self.speedups[s], s))


def load(run: Path, space_size: int | None = None) -> list[Hardware]:
    """Every hardware id of `run` with an exhaustive search (a warning for partial ones)."""
    meta = json.loads((run / "run.json").read_text())
    found = []
    for trials in sorted((run / "search").glob("*/trials.csv")):
        with trials.open(newline="") as handle:
            rows = [r for r in csv.DictReader(handle)
                    if r.get("state", "complete").lower() == "complete" and r.get("speedup")]
        if not rows:
            continue
        if space_size is not None and len(rows) < space_size:
            print(f"warning: {trials} holds {len(rows)} of {space_size} subnets (not an "
                  "exhaustive search); its best may be missed", file=sys.stderr)
        best_json = trials.parent / "best.json"
        chosen = json.loads(best_json.read_text()).get("spec_id") if best_json.is_file() else None
        found.append(Hardware(run, trials.parent.name, str(meta.get("dtype")),
                              {r["spec_id"]: float(r["speedup"]) for r in rows},
                              {r["spec_id"]: float(r["tau"]) for r in rows}, chosen))
    return found


def cross_table(hardware: list[Hardware]) -> list[str]:
    """Markdown: the best per hardware, then S_h(c_g) and the loss, rows h, columns g."""
    lines = ["| hardware (dtype) | best subnet | predicted speedup | tau |", "|---|---|---:|---:|"]
    for h in hardware:
        lines.append(f"| {h.label} | `{h.best}` | {h.speedups[h.best]:.3f} | "
                     f"{h.taus[h.best]:.3f} |")
    lines += ["", "| runs on \\ uses the choice of | " + " | ".join(h.label for h in hardware)
              + " |", "|---|" + "---:|" * len(hardware)]
    for h in hardware:
        own = h.speedups[h.best]
        cells = []
        for g in hardware:
            value = h.speedups.get(g.best)
            cells.append("-" if value is None else
                         f"{value:.3f} ({100 * (value / own - 1):+.1f} %)")
        lines.append(f"| {h.label} | " + " | ".join(cells) + " |")
    return lines


def measure(hardware: list[Hardware], prompts: int, repeats: int, max_new_tokens: int
            ) -> list[str]:
    """The distinct choices measured on this machine for each CPU hardware profiled here."""
    import torch
    from dreams_nas.latency.measure.hardware import detect_hardware
    from dreams_nas.nas.stages.inputs import RunModels, load_eval_examples
    from dreams_nas.nas.stages.verify import measure_end_to_end
    from dreams_nas.supernet.core.device import torch_threads
    from dreams_nas.supernet.core.runfolder import RunFolder
    from dreams_nas.supernet.core.spec import SubnetSpec

    choices = list(dict.fromkeys(h.best for h in hardware))
    specs = [SubnetSpec.from_id(c) for c in choices]
    lines = ["", f"Measured on this machine ({prompts} prompts, {max_new_tokens} new tokens, "
             f"median of {repeats} interleaved repeats; speedup over plain decoding, decode "
             "phase):", "", "| runs on | " + " | ".join(f"`{c}`" for c in choices)
             + " | outputs equal to greedy |", "|---|" + "---:|" * (len(choices) + 1)]
    for h in hardware:
        threads = int(h.hardware_id.rsplit("-", 1)[-1].removesuffix("t")) \
            if h.hardware_id.startswith("cpu-") else 0
        if not threads or detect_hardware("cpu", h.dtype, threads).hardware_id != h.hardware_id:
            continue  # not this machine
        with torch_threads(threads), torch.inference_mode():
            models = RunModels(RunFolder(h.run), "cpu", h.dtype)
            examples = load_eval_examples("builtin", prompts, 0)
            inputs = [models.target.build_inputs(ex.image_path, ex.prompt) for ex in examples]
            runs = [measure_end_to_end(models.target, models.draft, specs, inputs,
                                       max_new_tokens=max_new_tokens, show_progress=False)
                    for _ in range(max(1, repeats))]
        cells, equal, total = [], 0, 0
        for i in range(len(specs)):
            speed = [r[i].speedup for r in runs]
            cells.append(f"{statistics.median(speed):.3f} ({min(speed):.3f}-{max(speed):.3f})")
            equal += sum(r[i].identical_prompts for r in runs)
            total += sum(r[i].prompts for r in runs)
        lines.append(f"| {h.label} | " + " | ".join(cells) + f" | {equal}/{total} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", required=True, type=Path,
                        help="a run folder with exhaustive searches (repeat for several)")
    parser.add_argument("--measure", action="store_true",
                        help="also measure the choices on this machine's profiled hardware")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    from dreams_nas.supernet.core.runfolder import RunFolder

    hardware: list[Hardware] = []
    for run in args.run:
        if not (run / "run.json").is_file():
            print(f"error: {run} holds no run.json; give a run folder", file=sys.stderr)
            return 2
        hardware += load(run, RunFolder(run).space().size)
    if len(hardware) < 2:
        print("error: fewer than two searched hardware ids; profile and search exhaustively on "
              "at least two", file=sys.stderr)
        return 2
    lines = cross_table(hardware)
    if args.measure:
        lines += measure(hardware, args.prompts, args.repeats, args.max_new_tokens)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
