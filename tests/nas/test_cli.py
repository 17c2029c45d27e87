from __future__ import annotations

import errno
import json
import os
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
    (["train", "--visual-context", "both"], "argument --visual-context: invalid choice: 'both'"),
    (["profile", "--threads", "0"], "argument --threads: 0 is out of range"),
    (["profile", "--holdout", "1"], "argument --holdout: 1 is out of range: give a finite "
                                    "number in [0, 1)"),
    (["profile", "--repeats", "many"], "argument --repeats: 'many' is not a whole number"),
    (["score", "--temperature", "nan"], "argument --temperature: nan is out of range"),
    (["search", "--verify", "-1"], "argument --verify: -1 is out of range: give a number >= 0"),
    (["search", "--max-draft-ms", "0"], "argument --max-draft-ms: 0 is out of range"),
    (["generate", "--top-p", "1.5"], "argument --top-p: 1.5 is out of range"),
    (["generate", "--compile", "always"], "argument --compile: invalid choice: 'always'"),
    (["demo", "--context-lengths", "64", "-3"], "argument --context-lengths: -3 is out of range"),
])
def test_numbers_out_of_range_are_refused_before_anything_loads(capsys, argv, message) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_version_prints_the_installed_distributions_version(capsys) -> None:
    from importlib.metadata import version

    assert cli.main(["--version"]) == 0
    assert capsys.readouterr().out == f"dreams-nas {version('dreams-nas')}\n"


def _strict(text: str):
    def refuse(name: str):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_json_summary_is_strict_json_with_null_for_non_finite(fake, capsys) -> None:
    import numpy as np

    fake(lambda a: {"kendall_tau": float("nan"), "worst": [float("inf"), 1.5],
                    "nested": {"mae": np.float64("nan"), "r2": np.float32(0.5),
                               "n": np.int64(3)}, "ok": True})
    assert cli.main(["fake", "--json"]) == 0
    out = capsys.readouterr().out
    assert "NaN" not in out and "Infinity" not in out
    assert _strict(out) == {"kendall_tau": None, "worst": [None, 1.5],
                            "nested": {"mae": None, "r2": 0.5, "n": 3}, "ok": True}


@pytest.mark.parametrize(("code", "fix"), [
    (errno.EROFS, "pass a folder on a writable disk"),
    (errno.EACCES, "permissions"),
    (errno.ENOSPC, "free some disk space"),
    (errno.EISDIR, "pass the path of a file"),
])
def test_os_errors_of_the_environment_are_one_line_exit_2(fake, capsys, tmp_path, code,
                                                          fix) -> None:
    path = tmp_path / "run" / "run.json"

    def boom(_):
        raise OSError(code, os.strerror(code), str(path))

    fake(boom)
    assert cli.main(["fake"]) == 2
    err = capsys.readouterr().err
    assert err == (f"dreams-nas fake: error: {path}: {os.strerror(code)} "
                   f"({errno.errorcode[code]}); {err.split('; ', 1)[1]}")
    assert err.count("\n") == 1 and fix in err and "internal error" not in err


def test_an_os_error_that_is_no_user_mistake_stays_internal(fake, capsys) -> None:
    def boom(_):
        raise OSError(errno.EIO, os.strerror(errno.EIO), "/dev/sda")

    fake(boom)
    assert cli.main(["fake"]) == 1
    assert "internal error: OSError" in capsys.readouterr().err


def test_a_read_only_output_folder_is_one_line_exit_2(capsys, monkeypatch, tmp_path) -> None:
    """`data synth` into a folder it may not write: a real chmod where it bites, else (root) the
    writer raises EROFS as a read-only mount would."""
    out = tmp_path / "out"
    (out / "images").mkdir(parents=True)
    os.chmod(out / "images", 0o555)
    if os.geteuid() == 0 or os.access(out / "images", os.W_OK):  # chmod does not bind root
        def read_only(path, data):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

        monkeypatch.setattr("dreams_nas.supernet.data.prompts.atomic_write_bytes", read_only)
    try:
        code = cli.main(["data", "synth", "--out", str(out), "--n", "1", "-q"])
    finally:
        os.chmod(out / "images", 0o755)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("dreams-nas data: error: ") and err.count("\n") == 1
    assert str(out / "images") in err
    assert os.strerror(errno.EROFS) in err or os.strerror(errno.EACCES) in err


def test_threads_above_the_logical_cores_are_refused(capsys, monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    for command in ("profile", "score", "search", "demo", "target"):
        argv = [command, "--threads", "99"] + (["build-builtin"] if command == "target" else [])
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert "argument --threads: 99 threads is more than this machine's 4 logical cores: " \
               "give at most 4" in err and err.count("\n") == 1, err
