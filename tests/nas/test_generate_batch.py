"""`dreams-nas generate --prompts FILE.jsonl --batch-size B`: one line per request, in input
order, each what the request gets alone; a bad request fails alone."""

from __future__ import annotations

import json

import pytest
from dreams_nas.nas import cli

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """(target folder, spec folder, prompts file): six requests, the fourth's image missing,
    the fifth not JSON."""
    from _support.trained import trained_run
    from dreams_nas.supernet.core.io import atomic_write_json
    from dreams_nas.supernet.core.spec import SubnetSpec
    from dreams_nas.supernet.draft.extract import extract
    from dreams_nas.supernet.draft.saving import load_supernet

    run, examples = trained_run(tmp_path_factory)
    root = tmp_path_factory.mktemp("batch")
    spec = SubnetSpec(4, 1.0, 2, 3)
    folder = root / "specs" / spec.id
    extract(load_supernet(run.root / "supernet"), spec).save_pretrained(folder)
    atomic_write_json(folder / "spec.json", {"schema_version": 1, "spec": spec.to_dict()})
    lines = [json.dumps({"id": ex.id, "image": ex.image_path, "conversations": [
        {"from": "human", "value": f"<image>\n{ex.prompt}"}]}) for ex in examples]
    lines[3] = lines[3].replace(examples[3].image_path, "missing.png")
    lines.insert(4, "{not json")
    path = root / "requests.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return run.root.parent / "target", folder, path, examples[0]


def _generate(capsys, *argv: str) -> tuple[list[dict], dict]:
    code = cli.main(["generate", *argv, "--max-new-tokens", "10", "--device", "cpu", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    *lines, summary = [json.loads(line) for line in out.out.splitlines()]
    return lines, summary


def test_each_line_is_the_requests_own_answer(prompts, capsys, tmp_path) -> None:
    target, spec, path, first = prompts
    base = ["--target", str(target), "--prompts", str(path)]
    alone, summary = _generate(capsys, *base, "--batch-size", "1")
    assert summary["requests"] == 7 and summary["failed"] == 2 and summary["draft_len"] == 0
    assert [line["id"] for line in alone] == ["0", "1", "2", "3", "line 5", "4", "5"]
    assert "missing.png" in alone[3]["error"] and "not valid JSON" in alone[4]["error"]
    assert all("\n" not in line.get("error", "") for line in alone)
    answers = [line for line in alone if "error" not in line]
    assert all(line["new_tokens"] == len(line["tokens"]) > 0 for line in answers)
    for batch in ("3", "4"):
        lines, summary = _generate(capsys, *base, "--batch-size", batch, "--drafter", str(spec))
        assert lines == alone and summary["draft_len"] == 3 and summary["tau"] >= 1.0
    lines, summary = _generate(capsys, *base, "--batch-size", "3", "--drafter", str(spec),
                               "--tree", "2x1")  # a token tree per row
    assert lines == alone and summary["tree"] == "2x1" and summary["draft_len"] == 2
    # --out: the lines in a file, the summary alone on stdout
    out = tmp_path / "answers.jsonl"
    lines, summary = _generate(capsys, *base, "--batch-size", "2", "--out", str(out))
    assert lines == [] and summary["out"] == str(out)
    assert [json.loads(line) for line in out.read_text().splitlines()] == alone
    # the single-request command answers the first request as its line does
    printed, single = _generate(capsys, "--target", str(target), "--image", first.image_path,
                                "--prompt", first.prompt, "--drafter", "none")
    assert printed == [] and single["tokens"] == alone[0]["tokens"]


@pytest.mark.parametrize(("extra", "match"), [
    (["--drafter", "lookup"], "--drafter lookup drafts one request at a time"),
    (["--image", "x.png"], "drop --image/--prompt"),
    (["--batch-size", "0"], "argument --batch-size: 0 is out of range"),
])
def test_bad_batch_input_is_one_line_exit_2(prompts, capsys, extra, match) -> None:
    import re

    target, _, path, _ = prompts
    code = cli.main(["generate", "--target", str(target), "--prompts", str(path), *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and re.search(match, err), err
