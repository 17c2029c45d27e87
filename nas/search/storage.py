"""Where a study lives: parsing `--storage`, opening it, and keeping its password out of sight.

Three kinds of storage:

* an RDB URL (``sqlite:///PATH``, ``postgresql+psycopg2://user@host/db``, ``mysql+pymysql://...``):
  Optuna's `RDBStorage`; the claims table (`claims.py`) lives in the same database;
* ``journal:PATH`` (or a bare path ending in ``.log`` / ``.journal``): Optuna's file journal
  (`JournalStorage(JournalFileBackend(PATH))`), several processes on one machine (or on a file
  system with working locks) without a server; the claims go to the SQLite file
  ``PATH.claims.db`` beside it;
* nothing: an in-memory study (one process).

A URL may carry a password. `redact` is the one function that hides it: every message, log
line, exception and artefact that could show a storage URL goes through it (`scrub` also
removes the literal password from a driver's own text).
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from dreams_nas.supernet.core.errors import InputError

if TYPE_CHECKING:
    import optuna

ENV = "DREAMS_NAS_STORAGE"  # the storage URL when --storage is not given
JOURNAL_PREFIX = "journal:"
JOURNAL_SUFFIXES = (".log", ".journal")
EXAMPLES = ("sqlite:///dreams-run/search/<hw>/study.db, postgresql+psycopg2://user@host/db "
            f"(password from PGPASSWORD or ~/.pgpass, or the URL in ${ENV}) or "
            "journal:/path/study.log")

# the password runs to the authority's last "@" (a raw "@" in it would otherwise leak its tail)
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)[^/?#\s]*"
                           r"(?=@[^@/?#\s]*(?:[/?#\s]|$))")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&;\s](?:password|passwd|pwd)=)[^&\s]*",
                             re.IGNORECASE)


def redact(text: str | None) -> str | None:
    """`text` (a URL, or a message holding some) with every URL password replaced by ***."""
    if text is None:
        return None
    text = _URL_PASSWORD.sub(r"\g<head>***", text)
    return _QUERY_PASSWORD.sub(r"\g<head>***", text)


def password_of(url: str | None) -> str | None:
    """The password `url` carries (None when it has none or is not a URL)."""
    if not url or "://" not in url:
        return None
    rest = url.split("://", 1)[1].split("/", 1)[0]
    if "@" not in rest:
        return None
    creds = rest.rsplit("@", 1)[0]
    return creds.split(":", 1)[1] if ":" in creds else None


def scrub(text: str, url: str | None) -> str:
    """`text` redacted, and without the literal password of `url` (drivers echo it raw)."""
    clean = redact(text) or ""
    secret = password_of(url)
    for form in {secret, unquote(secret)} if secret else ():
        if form:
            clean = clean.replace(form, "***")
    return clean


def one_line(text: str) -> str:
    return " ".join(text.split())


def journal_path(url: str) -> Path | None:
    """The journal file `url` names (``journal:PATH`` or a path ending .log/.journal), else
    None."""
    if url.startswith(JOURNAL_PREFIX):
        return Path(url[len(JOURNAL_PREFIX):]).expanduser()
    if "://" not in url and url.endswith(JOURNAL_SUFFIXES):
        return Path(url).expanduser()
    return None


def claims_url(url: str) -> str:
    """The SQLAlchemy URL of the claims table for the study storage `url`."""
    path = journal_path(url)
    return url if path is None else f"sqlite:///{path.resolve()}.claims.db"


def open_storage(url: str | None) -> optuna.storages.BaseStorage:
    """The Optuna storage `url` names; an unreachable or malformed one is one redacted line."""
    import optuna

    if url is None:
        return optuna.storages.InMemoryStorage()
    with storage_errors(url):
        return _open(url)


def _open(url: str) -> optuna.storages.BaseStorage:
    journal = journal_path(url)
    if journal is not None:
        return _journal(journal, url)
    if "://" not in url:
        raise InputError(f"--storage {url!r} is neither a database URL nor a journal file; "
                         f"give one such as {EXAMPLES}")
    return _rdb(url)


def _journal(path: Path, url: str) -> optuna.storages.BaseStorage:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    if not path.parent.is_dir():
        raise InputError(f"--storage {url!r}: the folder {path.parent} does not exist; create "
                         "it or give a journal file in an existing folder")
    return optuna.storages.JournalStorage(JournalFileBackend(str(path)))


def _rdb(url: str) -> optuna.storages.BaseStorage:
    import optuna

    for attempt in range(5):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                # a trial whose worker stops beating for 5 min is failed and run again
                return optuna.storages.RDBStorage(
                    url, engine_kwargs={"pool_pre_ping": True}, heartbeat_interval=60,
                    grace_period=300,
                    heartbeat_stale_trial_callback=optuna.storages.RetryHeartbeatStaleTrialCallback(
                        max_retry=2),
                )
        except Exception as exc:
            # Workers starting together on a fresh database race to create Optuna's tables;
            # the losers see a unique violation and find the tables there on the next try.
            if _lost_creation_race(exc):
                time.sleep(0.2 * (attempt + 1))
                continue
            raise
    raise InputError(f"cannot create Optuna's tables in {redact(url)!r} after 5 tries; retry "
                     "the command")


def _lost_creation_race(exc: BaseException) -> bool:
    """True if `exc` says another worker created the same tables or rows first."""
    text = f"{exc!r} {exc}"
    return any(sign in text for sign in ("UniqueViolation", "already exists",
                                         "UNIQUE constraint failed"))


@contextmanager
def storage_errors(url: str | None) -> Iterator[None]:
    """Turn any failure to reach the storage into one InputError line naming the redacted URL
    (a driver's message may span lines and quote the password)."""
    try:
        yield
    except InputError as exc:
        raise InputError(one_line(scrub(str(exc), url))) from None
    except Exception as exc:  # noqa: BLE001 - any driver/connection error becomes one line
        missing = _missing_module(exc)
        if missing is not None:
            raise InputError(
                f"cannot open the Optuna storage {redact(url)!r}: its database driver "
                f"{missing!r} is not installed; pip install it, or name an installed driver "
                "in the URL (e.g. postgresql+psycopg2://...)"
            ) from None
        raise InputError(
            f"cannot open the Optuna storage {redact(url)!r}: {type(exc).__name__}: "
            f"{one_line(scrub(str(exc), url))}; give a storage such as {EXAMPLES}"
        ) from None


def _missing_module(exc: BaseException) -> str | None:
    """The module whose absence caused `exc` (Optuna re-raises the driver's ImportError with
    a generic text), else None."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            return seen.name
        seen = seen.__cause__ or seen.__context__
    return None


def check_storage(url: str | None) -> None:
    """Open `url` once and close it: an unreachable storage fails before any work is done."""
    storage = open_storage(url)
    engine = getattr(storage, "engine", None)
    if engine is not None:
        engine.dispose()


@contextmanager
def secrets_hidden(url: str | None) -> Iterator[None]:
    """Re-raise an exception whose text shows `url`'s password with that text scrubbed."""
    try:
        yield
    except Exception as exc:
        text = str(exc)
        clean = scrub(text, url)
        if clean == text:
            raise
        try:
            hidden = type(exc)(clean)
        except Exception:  # noqa: BLE001 - an exception type with another signature
            hidden = RuntimeError(f"{type(exc).__name__}: {clean}")
        raise hidden from None
