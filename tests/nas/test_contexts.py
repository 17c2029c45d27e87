"""The profile's contexts from the data (nas/stages/contexts.py): visual tokens and prompt
lengths read off the evaluation prompts through the target's processor."""

from __future__ import annotations

from types import SimpleNamespace

from dreams_nas.nas.stages.contexts import DataContexts, measure_data_contexts
from PIL import Image


def test_the_grid_spans_the_shortest_prompt_to_the_longest_plus_an_answer() -> None:
    data = DataContexts("builtin", visual_tokens=(36, 36, 40), prompt_lens=(60, 52, 75),
                        max_new_tokens=64)
    assert data.span() == (52, 139) and data.median_visual_tokens == 36
    grid = data.grid()
    assert grid[0] == 52 and grid[-1] == 139 and len(grid) == 5 and grid == sorted(grid)
    assert DataContexts("x", (4,), (10,), 1).grid(points=5) == [10, 11]
    doc = data.to_dict()
    assert doc["visual_tokens"] == {"min": 36, "median": 36, "max": 40}
    assert doc["prompt_len"]["max"] == 75 and doc["span"] == [52, 139]


def _examples(tmp_path, sizes):
    out = []
    for i, (w, h) in enumerate(sizes):
        path = tmp_path / f"{i}.png"
        Image.new("RGB", (w, h), (40 * i, 90, 160)).save(path)
        out.append(SimpleNamespace(id=str(i), image_path=path, prompt="What is shown?" + " x" * i))
    return out


def test_qwen2_vl_visual_tokens_follow_each_image(tiny_target, tmp_path) -> None:
    """Qwen2-VL's count depends on the image's size: a grey square of the config's image_size
    says nothing about the prompts decoded."""
    target = tiny_target("qwen2_vl")
    examples = _examples(tmp_path, [(56, 56), (112, 56), (112, 112)])
    data = measure_data_contexts(target, examples, "mine.jsonl", 16)
    assert data is not None
    expected = [int((target.build_inputs(e.image_path, e.prompt)["input_ids"]
                     == target.info.image_token_id).sum()) for e in examples]
    assert list(data.visual_tokens) == expected and len(set(expected)) >= 2
    assert data.median_visual_tokens == sorted(expected)[1]  # the middle of three
    assert max(data.prompt_lens) + 16 == data.span()[1]


def test_no_processor_means_no_data_contexts(tiny_target, tmp_path) -> None:
    target = SimpleNamespace(processor=None)
    assert measure_data_contexts(target, _examples(tmp_path, [(8, 8)]), "builtin", 8) is None
    assert measure_data_contexts(tiny_target("llava"), [], "builtin", 8) is None
