"""Storage URLs: journal files beside database URLs, and no password in any message."""

from __future__ import annotations

import pytest
from dreams_nas.nas import cli
from dreams_nas.nas.search.storage import (
    claims_url,
    journal_path,
    open_storage,
    redact,
    scrub,
    secrets_hidden,
)
from dreams_nas.supernet.core.errors import InputError

REFUSING = "127.0.0.1:1"  # nothing listens on port 1: the connection is refused at once


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://u:secret@db:5432/nas", "postgresql://u:***@db:5432/nas"),
    ("postgresql+psycopg2://u:p%40ss@db/nas", "postgresql+psycopg2://u:***@db/nas"),
    ("postgresql://u@db/nas?password=secret&sslmode=require",
     "postgresql://u@db/nas?password=***&sslmode=require"),
    ("postgresql://u@db/nas", "postgresql://u@db/nas"),
    ("postgresql://u:se@cret@db/nas", "postgresql://u:***@db/nas"),  # a raw "@" in it
    ("postgresql://u:a@b@c@db:5432/nas and mysql://v:x@h/d",
     "postgresql://u:***@db:5432/nas and mysql://v:***@h/d"),
    ("sqlite:////tmp/study.db", "sqlite:////tmp/study.db"),
    ("journal:/tmp/study.log", "journal:/tmp/study.log"),
    (None, None),
])
def test_redact_hides_only_the_password(url, shown) -> None:
    assert redact(url) == shown


def test_redact_and_scrub_work_inside_messages() -> None:
    url = "mysql://u:s%40cret@db/nas"
    text = f"engine {url} failed: access denied for u (using password s@cret)"
    assert redact(text).startswith("engine mysql://u:***@db/nas failed")
    assert "cret" not in scrub(text, url)


def test_an_exception_quoting_the_password_is_scrubbed() -> None:
    url = "postgresql://u:hunter2@db/nas"
    with pytest.raises(RuntimeError) as caught, secrets_hidden(url):
        raise RuntimeError(f"lost {url} (password hunter2)")
    assert "hunter2" not in str(caught.value) and "u:***@db" in str(caught.value)


@pytest.mark.parametrize(("url", "path"), [
    ("journal:/x/study.log", "/x/study.log"),
    ("journal:study.db", "study.db"),
    ("/x/study.journal", "/x/study.journal"),
    ("runs/study.log", "runs/study.log"),
    ("sqlite:////x/study.log", None),
    ("postgresql://u@h/db", None),
])
def test_journal_paths(url, path) -> None:
    got = journal_path(url)
    assert (None if got is None else got.as_posix()) == path


def test_the_claims_of_a_journal_go_to_sqlite_beside_it(tmp_path) -> None:
    journal = tmp_path / "s.log"
    assert claims_url(f"journal:{journal}") == f"sqlite:///{journal}.claims.db"
    assert claims_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_a_journal_in_a_missing_folder_is_one_line(tmp_path) -> None:
    with pytest.raises(InputError, match=r"the folder .*nowhere does not exist; create it"):
        open_storage(f"journal:{tmp_path / 'nowhere' / 's.log'}")


def _search(argv, tmp_path, capsys):
    code = cli.main(["search", *argv, "--run", str(tmp_path / "dreams-run")])
    out, err = capsys.readouterr()
    return code, out + err


@pytest.mark.parametrize("driver", ["postgresql", "postgresql+psycopg2"])
def test_an_unreachable_storage_is_one_line_without_its_password(driver, tmp_path,
                                                                   capsys) -> None:
    code, text = _search(["--storage", f"{driver}://u:secret@{REFUSING}/db"], tmp_path, capsys)
    assert code == 2, text
    assert text.count("\n") == 1 and text.startswith("dreams-nas search: error: cannot open")
    assert "secret" not in text and f"{driver}://u:***@{REFUSING}/db" in text
    assert not (tmp_path / "dreams-run").exists()  # refused before any work


def test_the_storage_may_come_from_the_environment(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("DREAMS_NAS_STORAGE", f"postgresql+psycopg2://u:secret@{REFUSING}/db")
    code, text = _search([], tmp_path, capsys)
    assert code == 2 and "secret" not in text and "u:***@127.0.0.1:1/db" in text
    code, text = _search(["--storage", "not-a-url"], tmp_path, capsys)  # the flag wins
    assert code == 2 and "--storage 'not-a-url' is neither a database URL nor a journal" in text
