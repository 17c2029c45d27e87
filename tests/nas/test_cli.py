from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
from dreams_nas.nas import cli
from dreams_nas.supernet.core.errors import InputError


def _fake_command(behaviour):
    module = types.ModuleType("fake_cmd")
    module.HELP = "a fake command for tests"

    def add_arguments(parser):
        parser.add_argument("--value", type=int, default=1)

    def run(args):
        return behaviour(args)

    module.add_arguments = add_arguments
    module.run = run
    return module


@pytest.fixture
def fake(monkeypatch):
    def install(behaviour):
        monkeypatch.setitem(sys.modules, "fake_cmd", _fake_command(behaviour))
        monkeypatch.setattr(cli, "COMMANDS", {**cli.COMMANDS, "fake": "fake_cmd"})

    return install


def test_json_summary_is_one_line_on_stdout(fake, capsys, tmp_path) -> None:
    fake(lambda a: {"value": a.value, "run": a.run, "seed": a.seed})
    assert cli.main(["fake", "--value", "3", "--json", "--run", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert json.loads(out) == {"value": 3, "run": str(tmp_path), "seed": 0}


def test_defaults_detected_by_none(fake, capsys) -> None:
    fake(lambda a: {"run": a.run, "seed": a.seed})
    assert cli.main(["fake", "--json", "--seed", "0"]) == 0
    assert json.loads(capsys.readouterr().out) == {"run": "dreams-run", "seed": 0}


def test_input_error_is_one_line_exit_2(fake, capsys) -> None:
    def boom(_):
        raise InputError("heads=5 is not allowed;\n pick 4")

    fake(boom)
    assert cli.main(["fake"]) == 2
    err = capsys.readouterr().err
    assert err == "dreams-nas fake: error: heads=5 is not allowed; pick 4\n"


def test_traceback_only_with_verbose(fake, capsys) -> None:
    def boom(_):
        raise InputError("bad")

    fake(boom)
    assert cli.main(["fake", "-v"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_internal_error_exit_1(fake, capsys) -> None:
    def boom(_):
        raise RuntimeError("kaput")

    fake(boom)
    assert cli.main(["fake"]) == 1
    err = capsys.readouterr().err
    assert "internal error: RuntimeError: kaput" in err and "Traceback" not in err


def test_argparse_errors_are_one_line_exit_2(fake, capsys) -> None:
    fake(lambda a: {})
    assert cli.main(["fake", "--value", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid int value: 'x'" in err
    assert cli.main(["no-such-command"]) == 2
    assert "invalid choice: 'no-such-command'" in capsys.readouterr().err


def test_help_lists_registered_commands(fake, capsys) -> None:
    fake(lambda a: {})
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args(["--help"])
    assert exc.value.code == 0
    assert "fake" in capsys.readouterr().out


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from dreams_nas.nas import cli\n"
        "try:\n"
        "    cli.main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "for name in cli.COMMANDS:\n"
        "    try:\n"
        "        cli.main([name, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('torch', 'transformers', 'optuna', 'sklearn', 'pandas')\n"
        "         if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "--lr", "-1"], "argument --lr: -1 is out of range: give a finite number > 0"),
    (["train", "--heads", "0"], "argument --heads: 0 is out of range: give a number >= 1"),
    (["train", "--lambda-distill", "-0.2"], "argument --lambda-distill: -0.2 is out of range"),
    (["train", "--max-new-tokens", "0"], "argument --max-new-tokens: 0 is out of range"),
    (["profile", "--threads", "0"], "argument --threads: 0 is out of range"),
    (["profile", "--holdout", "1"], "argument --holdout: 1 is out of range: give a finite "
                                    "number in [0, 1)"),
    (["profile", "--repeats", "many"], "argument --repeats: 'many' is not a whole number"),
    (["score", "--temperature", "nan"], "argument --temperature: nan is out of range"),
    (["search", "--verify", "-1"], "argument --verify: -1 is out of range: give a number >= 0"),
    (["search", "--max-draft-ms", "0"], "argument --max-draft-ms: 0 is out of range"),
    (["generate", "--top-p", "1.5"], "argument --top-p: 1.5 is out of range"),
    (["demo", "--context-lengths", "64", "-3"], "argument --context-lengths: -3 is out of range"),
])
def test_numbers_out_of_range_are_refused_before_anything_loads(capsys, argv, message) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
