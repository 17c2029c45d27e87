from __future__ import annotations

import json

import pytest
from dreams_nas.nas import cli
from dreams_nas.supernet.builtin.word_tokenizer import build_word_tokenizer
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.data.prompts import (
    builtin_dataset,
    check_data,
    load_llava_jsonl,
    strip_image_marker,
    write_synthetic,
)
from dreams_nas.supernet.data.synth import (
    CELL,
    GRID,
    IMAGE_SIZE,
    TASKS,
    TRAIN_TASKS,
    make_sample,
    sample_seed,
    vocabulary_texts,
)


def test_samples_are_deterministic_and_cover_every_task() -> None:
    a = [make_sample("train", 3, i) for i in range(10)]
    b = [make_sample("train", 3, i) for i in range(10)]
    assert [(s.prompt, s.answer, s.image.tobytes()) for s in a] == [
        (s.prompt, s.answer, s.image.tobytes()) for s in b]
    assert {s.task for s in a} == set(TASKS)
    assert all(s.image.size == (IMAGE_SIZE, IMAGE_SIZE) == (CELL * GRID,) * 2 for s in a)


def test_train_and_eval_never_share_a_seed() -> None:
    train = {sample_seed("train", s, i) for s in range(3) for i in range(2000)}
    evals = {sample_seed("eval", s, i) for s in range(3) for i in range(2000)}
    assert not train & evals
    with pytest.raises(InputError, match="split 'test' is not one of"):
        sample_seed("test", 0, 0)


def test_answers_depend_on_the_image_and_have_sentence_length() -> None:
    tok = build_word_tokenizer(vocabulary_texts())
    for task in TASKS:
        samples = [make_sample("eval", 0, i, (task,)) for i in range(30)]
        answers = {s.answer for s in samples}
        # the image, not the question, decides the answer (a count has six: one to six shapes)
        assert len(answers) >= (5 if task == "count" else 20), task
        for s in samples:
            n = len(tok(s.answer, add_special_tokens=False)["input_ids"])
            assert 10 <= n <= 60, (task, n, s.answer)


def _filled_cells(image) -> int:
    import numpy as np
    from dreams_nas.supernet.data.synth import BACKGROUND

    pixels = np.asarray(image)  # (H, W, 3)
    ink = (pixels != np.array(BACKGROUND, dtype=np.uint8)).any(-1)  # (H, W)
    cells = ink.reshape(GRID, CELL, GRID, CELL).any(axis=(1, 3))  # (GRID, GRID)
    return int(cells.sum())


def test_each_object_or_glyph_fills_its_own_cell() -> None:
    from dreams_nas.supernet.data.synth import NUMBER_WORDS

    for i in range(20):
        scene = make_sample("train", 0, i, ("scene",))
        n = NUMBER_WORDS.index(scene.answer.split()[3])  # "The image shows <n> objects."
        assert _filled_cells(scene.image) == n, scene.answer
        ocr = make_sample("train", 0, i, ("ocr",))
        code = ocr.answer.split(" reads ")[1].split(",")[0].split()
        assert _filled_cells(ocr.image) == len(code), ocr.answer
        assert _filled_cells(make_sample("train", 0, i, ("math",)).image) == 3


def test_synth_output_is_byte_identical_for_the_same_seed(tmp_path) -> None:
    def files(root):
        return {p.relative_to(root).as_posix(): p.read_bytes()
                for p in sorted(root.rglob("*")) if p.is_file()}

    write_synthetic(tmp_path / "a", 12, "eval", seed=5)
    write_synthetic(tmp_path / "b", 12, "eval", seed=5)
    write_synthetic(tmp_path / "c", 12, "eval", seed=6)
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert files(tmp_path / "a") != files(tmp_path / "c")


def test_jsonl_round_trips_through_the_loader(tmp_path) -> None:
    from PIL import Image

    jsonl = write_synthetic(tmp_path, 10, "train", seed=1)
    examples = load_llava_jsonl(jsonl)
    assert len(examples) == 10
    for index, example in enumerate(examples):
        sample = make_sample("train", 1, index)
        assert example.id == sample.id
        assert example.prompt == sample.prompt and "<image>" not in example.prompt
        assert example.answer == sample.answer
        assert Image.open(example.image_path).convert("RGB").tobytes() == sample.image.tobytes()
    record = json.loads(jsonl.read_text().splitlines()[0])
    assert record["conversations"][0] == {"from": "human",
                                          "value": "<image>\n" + examples[0].prompt}


def test_strip_image_marker() -> None:
    assert strip_image_marker("<image>\nWhat is it?") == "What is it?"
    assert strip_image_marker("What is <image> it?") == "What is it?"


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", r"data\.jsonl:2: not valid JSON"),
        ("[1, 2]", r"data\.jsonl:2: expected a JSON object"),
        ('{"id": "x", "image": "a.png"}', r"data\.jsonl:2: missing key\(s\) \['conversations'\]"),
        ('{"id": "x", "image": "a.png", "conversations": [{"from": "human", "value": "q"}]}',
         r"data\.jsonl:2: conversations need a human turn followed by a gpt turn"),
        ('{"id": "x", "image": "a.png", "conversations": "hi"}',
         r"data\.jsonl:2: conversations must be a list"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, line, match) -> None:
    (tmp_path / "a.png").write_bytes(b"")
    good = ('{"id": "ok", "image": "a.png", "conversations": [{"from": "human", "value": '
            '"<image>\\nq"}, {"from": "gpt", "value": "a"}]}')
    path = tmp_path / "data.jsonl"
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(InputError, match=match):
        load_llava_jsonl(path)


_GOOD = ('{"id": "ok", "image": "a.png", "conversations": [{"from": "human", "value": '
         '"<image>\\nq"}, {"from": "gpt", "value": "a"}]}')


def test_non_utf8_jsonl_names_file_line_and_byte(tmp_path) -> None:
    (tmp_path / "a.png").write_bytes(b"")
    path = tmp_path / "data.jsonl"
    first = (_GOOD + "\n").encode()
    bad = _GOOD.replace('"ok"', '"caf\xe9"').encode("latin-1") + b"\n"  # a Latin-1 e-acute
    path.write_bytes(first + bad)
    at = len(first) + bad.index(b"\xe9")
    with pytest.raises(InputError, match=rf"data\.jsonl:2: byte {at} \(0xe9\) is not UTF-8; "
                                         "save the file as UTF-8"):
        load_llava_jsonl(path)
    path.write_bytes(first + first.replace(b'"ok"', b'"two"'))  # UTF-8 reads as before
    assert [e.id for e in load_llava_jsonl(path)] == ["ok", "two"]


def test_check_data_reads_the_whole_file_and_skips_builtin(tmp_path) -> None:
    check_data("builtin")  # nothing to read: renders nothing either
    assert not any(tmp_path.iterdir())
    with pytest.raises(InputError, match="neither builtin nor a .jsonl file"):
        check_data(str(tmp_path / "notes.txt"))
    (tmp_path / "a.png").write_bytes(b"")
    path = tmp_path / "data.jsonl"
    path.write_text(_GOOD + "\n" * 40 + "{broken\n")
    with pytest.raises(InputError, match=r"data\.jsonl:41: not valid JSON"):
        check_data(str(path))
    path.write_text(_GOOD + "\n")
    check_data(str(path))


def test_missing_image_and_missing_file(tmp_path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"id": "x", "image": "nope.png", "conversations": [{"from": "human", '
                    '"value": "q"}, {"from": "gpt", "value": "a"}]}\n')
    with pytest.raises(MissingArtefactError, match=r"d\.jsonl:1: image file .*nope\.png does not"):
        load_llava_jsonl(path)
    assert load_llava_jsonl(path, check_images=False)[0].answer == "a"
    with pytest.raises(MissingArtefactError, match="does not exist"):
        load_llava_jsonl(tmp_path / "absent.jsonl")


def test_builtin_dataset_is_cached(tmp_path) -> None:
    first = builtin_dataset("eval", 6, seed=2, cache_dir=tmp_path)
    png = first[0].image_path
    stamp = png.stat().st_mtime_ns
    second = builtin_dataset("eval", 6, seed=2, cache_dir=tmp_path)
    assert first == second and png.stat().st_mtime_ns == stamp
    assert [e.answer for e in first] == [make_sample("eval", 2, i).answer for i in range(6)]


def test_the_builtin_train_split_draws_ocr_three_times_in_seven(tmp_path) -> None:
    """The draft's training prompts weight OCR (the skill a one-layer draft misses by chance);
    the evaluation split keeps each task once, in a cache folder of its own."""
    train = builtin_dataset("train", 14, seed=2, cache_dir=tmp_path)
    assert [e.answer for e in train] == [make_sample("train", 2, i, TRAIN_TASKS).answer
                                         for i in range(14)]
    assert sum("text in the image reads" in e.answer for e in train) == 6
    assert sorted(TRAIN_TASKS) == sorted([*TASKS, "ocr", "ocr"])
    folders = {p.name for p in (tmp_path / "synth").iterdir() if not p.name.startswith(".")}
    assert folders == {"synth-v1-train-scene1-count1-ocr3-chart1-math1-n14-s2"}
    marker = json.loads((tmp_path / "synth" / folders.pop() / "complete.json").read_text())
    assert marker["tasks"] == list(TRAIN_TASKS)


def test_cli_data_synth(tmp_path, capsys) -> None:
    out = tmp_path / "synth"
    code = cli.main(["data", "synth", "--out", str(out), "--n", "5", "--split", "eval", "--json",
                     "-q"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["n"] == 5 and summary["split"] == "eval"
    assert len(load_llava_jsonl(summary["jsonl"])) == 5
    assert cli.main(["data", "synth", "--out", str(out), "--n", "0"]) == 2
    assert "argument --n: 0 is out of range: give a number >= 1" in capsys.readouterr().err
    # the train split's default is the built-in training mix; --tasks weights by repetition
    assert cli.main(["data", "synth", "--out", str(out), "--n", "7", "--json", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["tasks"] == list(TRAIN_TASKS)
    assert cli.main(["data", "synth", "--out", str(out), "--n", "3", "--tasks", "ocr,ocr,math",
                     "--json", "-q"]) == 0
    answers = [e.answer for e in load_llava_jsonl(out / "train.jsonl")]
    assert ["text in the image reads" in a for a in answers] == [True, True, False]
    assert cli.main(["data", "synth", "--out", str(out), "--tasks", ","]) == 2
    err = capsys.readouterr().err.strip()
    assert "no task given" in err and len(err.splitlines()) == 1
