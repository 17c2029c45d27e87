"""The house's limits, held on every commit: module, function and signature sizes in the four
packages, one name per idea (the retired spellings never come back), and the docs' lengths."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("supernet", "latency", "nas", "reports")
MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_PUBLIC_PARAMS = 400, 80, 8

# Spellings that a rename retired (docs/glossary.md names what replaced each).
RETIRED_IDENTIFIERS = {
    # tokens drafted per cycle: draft_len
    "gamma", "gamma_max", "gammas", "default_gamma", "lookup_gamma", "room", "max_depth",
    # the built-in target
    "DemoVariant", "DemoTrainConfig", "DEMO_VERSION", "ensure_demo_target",
    "ensure_demo_target_with_metrics", "build_demo_target", "demo_target_dir",
    # two ideas under one name each
    "Batch", "METHODS",
    # the latency model's second API and its old names
    "LatencyCache", "BatchLatencyModel", "predict_ms", "cycle_profiled", "first_draft_ms_of",
    "StepLatencyModel", "make_latency_model", "TargetStepTable",
    # the architecture, not a "triple" (the storage's claim names keep the word)
    "triple_of", "triple_key", "score_triple", "triples_scored",
}
RETIRED_MODULES = ("supernet/demo", "latency/store.py", "latency/predictor.py",
                   "latency/step_model.py", "latency/target_steps.py", "latency/estimators.py",
                   "latency/cycle_steps.py", "supernet/draft/store.py",
                   "supernet/training/store.py")
RETIRED_CLI = {"--run-dir", "build-demo", "--gamma"}


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_no_module_function_or_signature_over_the_limits() -> None:
    over = []
    for path in _modules():
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT).as_posix()
        if source.count("\n") > MAX_MODULE_LINES:
            over.append(f"{name}: {source.count(chr(10))} lines")
        for fn in _functions(ast.parse(source)):
            lines = fn.end_lineno - fn.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                over.append(f"{name}:{fn.lineno} {fn.name}: {lines} lines")
            args = fn.args
            params = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)
                      if a.arg not in ("self", "cls")]
            params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
            if not fn.name.startswith("_") and len(params) > MAX_PUBLIC_PARAMS:
                over.append(f"{name}:{fn.lineno} {fn.name}: {len(params)} parameters")
    assert not over, "over the house limits (modules <= 400 lines, functions <= 80, public " \
                     "functions <= 8 parameters):\n" + "\n".join(over)


def _identifiers(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.keyword) and node.arg:
            names.add(node.arg)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.rsplit(".", 1)[-1])
    return names


def test_retired_names_do_not_come_back() -> None:
    found = []
    for path in _modules():
        back = _identifiers(ast.parse(path.read_text(encoding="utf-8"))) & RETIRED_IDENTIFIERS
        found += [f"{path.relative_to(ROOT).as_posix()}: {name}" for name in sorted(back)]
    found += [m for m in RETIRED_MODULES if (ROOT / m).exists()]
    assert not found, "retired names are back (docs/glossary.md names their successors):\n" + \
        "\n".join(found)


def _cli_words() -> set[str]:
    from dreams_nas.nas.cli import build_parser

    words: set[str] = set()
    stack = [build_parser()]
    while stack:
        parser = stack.pop()
        for action in parser._actions:
            words.update(action.option_strings)
            if isinstance(action.choices, dict):  # subcommands
                words.update(action.choices)
                stack.extend(action.choices.values())
            elif action.choices is not None:
                words.update(str(c) for c in action.choices)
    return words


def test_the_cli_speaks_the_glossary_and_names_a_retired_spelling(capsys) -> None:
    from dreams_nas.nas.cli import main

    words = _cli_words()
    assert {"--run", "--draft-len", "--depth", "build-builtin"} <= words
    assert not words & RETIRED_CLI
    for argv, new in ((["score", "--run-dir", "x"], "--run DIR"),
                      (["score", "--run-dir=x"], "--run DIR"),
                      (["target", "build-demo"], "dreams-nas target build-builtin")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "was renamed" in err and new in err, err
    # a value that happens to spell a retired word is not an option
    from dreams_nas.nas.cli import retired_spelling

    assert retired_spelling(["generate", "--prompt", "build-demo"]) is None
    assert retired_spelling(["score", "--", "--run-dir"]) is None


def test_the_glossary_names_each_idea_once() -> None:
    rows = re.findall(r"^\| ([^|]+?) \|", (ROOT / "docs" / "glossary.md").read_text(), re.M)
    names = [r for r in rows if r not in ("name", "---")]
    assert len(names) == len(set(names)) and {"`draft_len`", "`depth`", "built-in target"} <= \
        set(names)


# --- the docs --------------------------------------------------------------------------------
def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_the_readme_is_a_front_door() -> None:
    readme = _lines(ROOT / "README.md")
    assert len(readme) <= 250
    start = readme.index("## Results")
    end = next(i for i in range(start + 1, len(readme)) if readme[i].startswith("## "))
    rows = [line for line in readme[start:end] if line.startswith("| [")]
    assert 0 < len(rows) <= 12
    assert all(len(row) <= 200 and "BENCHMARKS.md#" in row for row in rows), rows


@pytest.mark.parametrize("name", ["BENCHMARKS.md", *(f"docs/{p.name}" for p in
                                                      sorted((ROOT / "docs").glob("*.md")))])
def test_benchmarks_and_guides_stay_short(name: str) -> None:
    limit = 600 if name == "BENCHMARKS.md" else 300
    assert len(_lines(ROOT / name)) <= limit


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_links_between_the_docs_resolve_and_name_no_retired_target() -> None:
    pages = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "SCHEMAS.md",
             *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not re.search(r"demo-v[0-9]|build-demo|--run-dir", text), page.name
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.suffix == ".md":
                headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
                if anchor not in headings:
                    broken.append(f"{page.name}: {target}")
    assert not broken, broken


def test_the_package_map_lists_every_module() -> None:
    listed = set(re.findall(r"^\| `([\w/]+\.py)` \|", (ROOT / "docs" / "layout.md").read_text(),
                            re.M))
    modules = {p.relative_to(ROOT).as_posix() for p in _modules()}
    assert not modules - listed, f"missing from docs/layout.md: {sorted(modules - listed)}"
    assert not listed - modules, f"docs/layout.md lists no such module: {sorted(listed - modules)}"
