"""A search worker process for the distributed tests, with `tests` on PYTHONPATH:
`python -m _support.search_worker CONFIG.json`.

It scores with the deterministic fake scorer (slowed a little so workers interleave), logs
every subnet it scores to its own file and prints its result as one JSON line. With `hang_after`
N it stops for good once N subnets are logged, inside the trial that scored them (their rows
not yet stored), and says so in `<log>.hung`: a test kills it there, mid-trial, whatever the
machine's load.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from _support.search import SMALL_SPACE, FakeLatency, FakeScorer, fake_params, run_search


class LoggingScorer(FakeScorer):
    def __init__(self, log: Path, delay_s: float, supernet_hash: str,
                 hang_after: int | None = None) -> None:
        super().__init__(supernet_hash)
        self.log, self.delay_s, self.hang_after = log, delay_s, hang_after

    def score(self, specs):
        rows = super().score(specs)
        time.sleep(self.delay_s)
        with self.log.open("a") as handle:
            for spec in specs:
                handle.write(spec.id + "\n")
                handle.flush()
        if self.hang_after is not None and len(self.calls) >= self.hang_after:
            hung_marker(self.log).write_text(f"{len(self.calls)}\n")
            time.sleep(3600)  # until the test's SIGKILL
        return rows


def hung_marker(log: Path) -> Path:
    """The file a worker with `hang_after` writes once it has stopped, mid-trial."""
    return log.with_name(log.name + ".hung")


def main(config_path: str) -> None:
    cfg = json.loads(Path(config_path).read_text())
    scorer = LoggingScorer(Path(cfg["log"]), cfg.get("delay_s", 0.01),
                           cfg.get("supernet_hash", "abc123"), cfg.get("hang_after"))
    result = run_search(SMALL_SPACE, scorer, FakeLatency(), fake_params, context_len=32,
                    objective=cfg.get("objective", "pareto"), method=cfg["method"],
                    n_trials=cfg.get("n_trials"), storage=cfg["storage"],
                    study_name=cfg.get("study_name"), seed=cfg.get("seed", 0),
                    show_progress=False, wait_s=120)
    print(json.dumps({
        "front": [[c.spec.id, c.speedup] for c in result.front],
        "best": result.best.spec.id if result.best else None,
        "n": result.n_evaluations, "n_scored": result.n_scored,
        "study_name": result.study_name,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
