"""The session store: a running run's log and header, and a session's ended runs.

The workflow never passes a run's whole conversation through Temporal: it
appends what is new to the run's log here (``durable_agent.core.run_log``), and the
activities read the rest from here. The filesystem store is the default; a
shared store (PostgreSQL, an S3-compatible bucket) implements the same
protocol, and the workflow does not change.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from durable_agent.core.export import RunRecord
from durable_agent.core.run_log import GENESIS, LogEntry, LogRef, RunHeader, StateMissing


class SessionStore(Protocol):
    """Where runs keep their state between activities, on any worker that shares it.

    Implementations make every write durable before returning and every
    operation safe to repeat (activities run at least once). A run's log is a
    chain of entries by version: ``append_log`` refuses, with ``StateMissing``,
    an entry that does not follow what is stored, and an entry written at a
    version replaces the one there and drops those after it (a run that went
    back, e.g. after a Temporal reset, overwrites its abandoned branch).

    Any method may raise ``OSError`` (or the database's error) when the storage fails: the
    activity then fails, and Temporal retries it as its retry policy allows.
    ``durable_agent.conformance.check_store`` holds an implementation to this contract.
    """

    async def save_header(self, header: RunHeader) -> None:
        """Keep a run's header.

        Args:
            header: What does not change while the run runs; stored by ``header.run_id``,
                replacing any header there.
        """
        ...

    async def load_header(self, run_id: str) -> RunHeader | None:
        """A run's header.

        Args:
            run_id: The run.

        Returns:
            Its header, or ``None`` when the store has none.
        """
        ...

    async def append_log(self, run_id: str, entries: Sequence[LogEntry]) -> None:
        """Store contiguous ``entries``; the first follows the stored entry before it,
        or starts the log (version 1 on ``GENESIS``), or replaces the state outright.

        Args:
            run_id: The run.
            entries: Contiguous entries (none: nothing to do). The first follows the stored
                entry before it (its ``parent`` is that entry's digest; ``GENESIS`` at
                version 1), or is a ``delta.replace`` entry, taken at any version. An entry
                at a version already stored replaces it, and the entries after the last one
                given are dropped.

        Raises:
            StateMissing: The first entry does not follow what is stored (nothing is
                stored then); its ``head`` is the newest entry the store holds (``None``:
                none).
        """
        ...

    async def read_log(self, run_id: str, after: int, upto: int) -> list[LogEntry]:
        """Stored entries with ``after < version <= upto``, in order; missing ones are left out.

        Args:
            run_id: The run.
            after: The entries above this version...
            upto: ...up to and including this one.

        Returns:
            The stored entries in that range, in version order, equal to those appended
                (empty for a run with no log).
        """
        ...

    async def log_head(self, run_id: str) -> LogRef | None:
        """The newest stored entry of the run's log, ``None`` when it has none.

        Args:
            run_id: The run.

        Returns:
            A ``LogRef`` to the newest stored entry (its version and digest), or ``None``
                when the run has no log.
        """
        ...

    async def stage_text(self, run_id: str, digest: str, text: str) -> None:
        """Keep a tool's output by its digest until the save that names it.

        Args:
            run_id: The run the text belongs to.
            digest: ``sha256:`` and the hex SHA-256 of the text's UTF-8 bytes.
            text: A tool's output, a model's message, or a tool's image (its base64 data).
        """
        ...

    async def staged_text(self, run_id: str, digest: str) -> str | None:
        """A text ``stage_text`` kept.

        Args:
            run_id: The run the text belongs to.
            digest: The digest it was kept under.

        Returns:
            The text kept for ``run_id`` under ``digest``, or ``None``.
        """
        ...

    async def drop_run(self, run_id: str) -> None:
        """Forget an ended run's header, log and staged outputs (its record stays).

        Args:
            run_id: An ended run, whose record was saved.
        """
        ...

    async def save_run_record(self, record: RunRecord) -> None:
        """Keep an ended run's record with its session.

        Args:
            record: The run's record (its snapshot and events), kept under
                ``record.snapshot.session_id`` by ``record.snapshot.id``, replacing one
                saved before.
        """
        ...

    async def load_run_records(self, session_id: str) -> list[RunRecord]:
        """The ended runs of a session.

        Args:
            session_id: The session.

        Returns:
            The records saved for the session, ordered by creation time
                (``snapshot.created_at_ms``), then run id; empty for an unknown session.
        """
        ...


@runtime_checkable
class Connectable(Protocol):
    """A part that opens connections (a PostgreSQL store or sink): ``AgentActivities.connect``
    opens them at a worker's start, so bad credentials fail there, not at a run's first step."""

    async def connect(self) -> None:
        """Open the connections now and check they can be used.

        Raises:
            OSError: The service is not reachable (yet), or did not answer in time.
        """
        ...


@runtime_checkable
class Closable(Protocol):
    """A part that holds what must be released (a connection pool, a server process): a
    store, a sink, a model provider or the MCP servers. ``AgentActivities.aclose`` closes it."""

    async def aclose(self) -> None:
        """Release what the part holds; it is not used afterwards."""
        ...


# Characters a key keeps as they are in a file name; every other one is escaped.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
# What a name keeps as it is on a file system that does not tell case apart: no upper case.
_PLAIN_CASELESS = frozenset(c for c in _PLAIN if not c.isupper())
# The longest file name most file systems take (ext4, XFS, APFS: 255 bytes).
NAME_MAX = 255
# An escaped name longer than this is cut and ends with the key's digest instead.
_ESCAPED_MAX = 200


def safe_name(key: str, suffix: str = "", *, caseless: bool = False) -> str:
    """A file name for ``key`` that cannot climb out of its folder, one a key (injective).

    A key of letters, digits, ``.``, ``_`` and ``-`` (not only dots) is its own name, as
    it always was, so the folders of existing stores and sinks keep their names. Any
    other key has each other character (each UTF-8 byte of it) written ``~XX`` in hex,
    ``~`` itself included: ``team/alpha`` is ``team~2Falpha``, never ``team_alpha``'s
    folder. A name that would pass ``NAME_MAX`` bytes with ``suffix`` (which the caller
    appends) is cut, and ends with ``~~`` and the SHA-256 of the key. The three forms
    cannot meet: a plain name has no ``~``, an escaped one has no ``~~``.

    ``caseless``: for a folder on a file system that does not tell ``A`` from ``a`` (macOS's
    and Windows' by default): letters in upper case are escaped too (``Team`` is ``~54eam``),
    so keys that differ only in case never meet there either (the escapes' hex digits are
    always upper case, and every ``~`` of a key is escaped).

    Args:
        key: a session id, run id or digest, as given.
        suffix: what the caller appends to the name (``".run.json"``), counted in the bound.
        caseless: whether the name is made on such a file system (``name_under`` finds out).

    Returns:
        The file name (without ``suffix``).
    """
    room = NAME_MAX - len(suffix.encode("utf-8"))
    plain = _PLAIN_CASELESS if caseless else _PLAIN
    if key.strip(".") and len(key) <= room and all(c in plain for c in key):
        return key
    if not key.strip("."):
        escaped = "~2E" * len(key) or "~"  # "", ".", "..": never a name of their own
    else:
        escaped = "".join(c if c in plain else _escape(c) for c in key)
    if len(escaped) <= min(room, _ESCAPED_MAX):
        return escaped
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    cut = escaped[: min(room, _ESCAPED_MAX) - len(digest) - 2]
    cut = cut[: cut.rfind("~")] if "~" in cut[-2:] else cut  # never half an escape
    return f"{cut}~~{digest}"


def name_under(folder: Path, key: str, suffix: str = "") -> str:
    """``safe_name`` for a file or folder made in ``folder``, case-escaped where its file system
    does not tell case apart (``caseless``).

    Args:
        folder: Where the name is made (it need not exist yet: its nearest folder that does is
            asked).
        key: A session id, run id or digest, as given.
        suffix: What the caller appends to the name.

    Returns:
        The file name (without ``suffix``).
    """
    return safe_name(key, suffix, caseless=caseless(folder))


def caseless(folder: Path) -> bool:
    """Whether the file system of ``folder`` (or of its nearest folder that exists) takes
    ``A`` and ``a`` for one name, found out once a folder by making a file there and asking
    for it in upper case (kept by the folder's name: a store names files on every write)."""
    return _caseless_at(str(folder.absolute()))


@functools.lru_cache(maxsize=1024)
def _caseless_at(folder: str) -> bool:
    existing = Path(folder)
    while not existing.is_dir() and existing != existing.parent:
        existing = existing.parent
    return _caseless(str(existing))


@functools.cache
def _caseless(folder: str) -> bool:
    probe = Path(folder) / f".case-probe-{uuid.uuid4().hex}"
    try:
        probe.touch(exist_ok=False)
    except OSError:  # a folder this process cannot write in: it makes no names there either
        return False
    try:
        return probe.with_name(probe.name.upper()).exists()
    finally:
        probe.unlink(missing_ok=True)


def legacy_name(key: str) -> str:
    """The name earlier versions gave ``key`` (every other character ``_``): several keys
    shared it. Read only, where a folder under ``safe_name`` is not there yet, and only what
    names ``key`` itself (a record's session, an export's descriptor)."""
    name = "".join(c if c in _PLAIN else "_" for c in key)
    return name if name.strip(".") else "_" + name


def _escape(char: str) -> str:
    return "".join(f"~{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))


def follows(first: LogEntry, before: LogEntry | None) -> bool:
    """Whether ``first`` may be stored after ``before`` (the stored entry at its version - 1)."""
    if first.delta.replace:
        return True
    return first.parent == (GENESIS if first.version == 1 else (before.digest if before else None))


def not_following(run_id: str, first: LogEntry, head: LogRef | None) -> StateMissing:
    return StateMissing(
        f"the store does not hold version {first.version - 1} of run {run_id!r}'s log "
        f"with digest {first.parent}",
        head,
    )
