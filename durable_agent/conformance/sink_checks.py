"""Conformance checks for an ``ExportSink`` (``durable_agent.activities.sinks``).

Each check in ``SINK_CHECKS`` takes a fresh, empty sink:

- ``deliver`` returns once the export is held, and treats a repeat digest as done
  (no error, nothing changed);
- a sink with ``fetch`` gives back, for a delivered export's descriptor, the same
  export: the same descriptor and byte-identical canonical content, which opens
  (validates) to the same payload; and ``None`` for an export it was never given.
  A sink without ``fetch`` skips those checks (``CheckSkipped``).
- a sink with ``deliver_parts`` (``PartedSink``) takes a run's successive exports as
  parts, each a repeat-safe delivery, and ``fetch`` gives each back whole, byte for byte
  (skipped for a sink without ``deliver_parts`` or without ``fetch``).
- a sink that holds workspace objects (``ObjectSink``) holds what ``put_objects`` took:
  ``missing_objects`` then names none of them (and, in order, the ids it was never given),
  ``get_objects`` gives each back byte for byte, and leaves out those it lacks; a repeated
  ``put_objects`` is harmless (skipped for a sink that holds no objects).

``check_failing_sink`` takes a sink set up so that it cannot hold an export (an
unwritable folder, a closed bucket) and checks that ``deliver`` says so with
``SinkError``, the one exception the export activity turns into a retry or a
failed export.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Awaitable, Callable

from durable_agent.activities.sinks import ExportSink, FetchingSink, ObjectSink, PartedSink, SinkError
from durable_agent.conformance.checks import Check, CheckSkipped, Factory, fresh, registry, run_checks
from durable_agent.conformance.store_checks import header, rich_chain
from durable_agent.core.export import ExportDescriptor, SessionCheckpointExportV1
from durable_agent.core.export_parts import ExportEncoder, PartedExport, build_parted
from durable_agent.core.models import TokenUsage
from durable_agent.core.run_log import ExportFacts, RunLog, build_export, export_payload

SESSION = "conformance-session"


def _facts(turn: int) -> ExportFacts:
    return ExportFacts(
        turn=turn,
        checkpoint_ms=10_000 + turn,
        updated_at_ms=10_000 + turn,
        usage=TokenUsage(prompt_tokens=10 * turn, completion_tokens=turn, total_tokens=11 * turn),
    )


def sample_export(
    turn: int, run_id: str = "conformance-run", session_id: str = SESSION
) -> SessionCheckpointExportV1:
    """A valid export of a small run after ``turn`` boundaries (1 to 3): same arguments, same bytes."""
    log = RunLog(run_id)
    log.apply_all(rich_chain(run_id)[:turn])
    return build_export(header(run_id, session_id), log, (), _facts(turn))


def sample_parted(run_id: str = "conformance-run", session_id: str = SESSION) -> list[PartedExport]:
    """The exports of ``sample_export``'s run after each of its three boundaries, as parts."""
    log, encoder, out = RunLog(run_id), ExportEncoder(), []
    for turn, entry in enumerate(rich_chain(run_id)[:3], start=1):
        log.apply(entry)
        out.append(build_parted(encoder, export_payload(header(run_id, session_id), log, (), _facts(turn))))
    return out


def _fetcher(sink: ExportSink) -> Callable[[ExportDescriptor], Awaitable[SessionCheckpointExportV1 | None]]:
    if not isinstance(sink, FetchingSink):
        raise CheckSkipped("the sink has no fetch")
    return sink.fetch


async def gives_back(sink: ExportSink, export: SessionCheckpointExportV1, what: str) -> None:
    """``fetch`` gives back ``export``: its descriptor and its content, byte for byte."""
    fetched = await _fetcher(sink)(export.descriptor)
    assert fetched is not None, f"{what}: fetch gives None for an export that was delivered"
    assert fetched.descriptor == export.descriptor, f"{what}: fetch gives back another descriptor"
    assert fetched.content.encode("utf-8") == export.content.encode("utf-8"), (
        f"{what}: fetch gives back other content bytes than were delivered"
    )
    assert fetched.open() == export.open(), f"{what}: the fetched export opens to another payload"


#: Every check of a working sink, by name, in the order defined: ``await SINK_CHECKS[name](fresh_sink)``.
SINK_CHECKS: dict[str, Check[ExportSink]] = {}
_sink_check = registry(SINK_CHECKS)


@_sink_check
async def delivered_exports_come_back_whole(sink: ExportSink) -> None:
    """What ``fetch`` gives for a delivered export's descriptor is that export, byte for byte."""
    _fetcher(sink)
    export = sample_export(2)
    await sink.deliver(export)
    await gives_back(sink, export, "after one delivery")


@_sink_check
async def a_repeated_delivery_is_harmless(sink: ExportSink) -> None:
    """Delivering an export again (the same digest, as an activity's retry does) is done, not an error."""
    export = sample_export(1)
    await sink.deliver(export)
    await sink.deliver(export)
    copy = SessionCheckpointExportV1.model_validate_json(export.model_dump_json())
    await sink.deliver(copy)  # an equal export, not the same object
    if isinstance(sink, FetchingSink):
        await gives_back(sink, export, "after three deliveries of one export")


@_sink_check
async def an_unknown_export_is_not_fetched(sink: ExportSink) -> None:
    """``fetch`` gives ``None`` for an export the sink was never given, also beside one it was."""
    fetch = _fetcher(sink)
    never = sample_export(3)
    assert await fetch(never.descriptor) is None, "fetch on an empty sink gives something"
    await sink.deliver(sample_export(1))
    await sink.deliver(sample_export(2))
    assert await fetch(never.descriptor) is None, "fetch gives something for an export never delivered"
    forged = never.descriptor.model_copy(update={"content_digest": "sha256:" + "e" * 64})
    assert await fetch(forged) is None, "fetch gives something for a digest never delivered"


@_sink_check
async def exports_are_kept_apart(sink: ExportSink) -> None:
    """Exports of several turns, runs and sessions are each given back as delivered."""
    exports = [
        sample_export(1),
        sample_export(2),
        sample_export(3),
        sample_export(2, run_id="conformance-other-run"),
        sample_export(2, session_id="conformance-session-2"),
    ]
    assert len({e.descriptor.content_digest for e in exports}) == len(exports)
    for export in exports:
        await sink.deliver(export)
    if isinstance(sink, FetchingSink):
        for export in exports:
            d = export.descriptor
            await gives_back(sink, export, f"export of {d.session_id}/{d.run_id} turn {d.turn}")


@_sink_check
async def exports_delivered_as_parts_come_back_whole(sink: ExportSink) -> None:
    """A run's successive exports, delivered as parts (twice each), come back whole."""
    if not isinstance(sink, PartedSink):
        raise CheckSkipped("the sink has no deliver_parts")
    _fetcher(sink)
    parted = sample_parted()
    for export in parted:
        await sink.deliver_parts(export)
        await sink.deliver_parts(export)
    for turn, export in enumerate(parted, start=1):
        whole = export.whole()
        assert whole == sample_export(turn), f"turn {turn}: the parts are not the export built whole"
        await gives_back(sink, whole, f"turn {turn}, delivered as parts")


def sample_object(body: bytes, kind: str = "blob") -> tuple[str, bytes]:
    """A git loose object of ``body``: its id (SHA-1) and its bytes (zlib), as a sink holds them."""
    raw = f"{kind} {len(body)}".encode() + b"\0" + body
    return hashlib.sha1(raw).hexdigest(), zlib.compress(raw)  # git names objects by their SHA-1


@_sink_check
async def objects_put_come_back_byte_for_byte(sink: ExportSink) -> None:
    """``put_objects`` then ``missing_objects`` names none of them, ``get_objects`` gives them back."""
    if not isinstance(sink, ObjectSink):
        raise CheckSkipped("the sink holds no workspace objects")
    objects = dict(sample_object(f"file {i}\n".encode() * (i + 1)) for i in range(5))
    objects.update([sample_object(b"\0\xff" * 70_000)])  # binary, past a page
    never = [sample_object(b"never put")[0], sample_object(b"nor this")[0]]
    ids = list(objects)
    assert await sink.missing_objects([never[1], *ids, never[0]]) == [never[1], *ids, never[0]], (
        "an empty sink does not name every id missing, in order"
    )
    assert await sink.get_objects(ids) == {}, "an empty sink gives objects back"
    await sink.put_objects(dict(list(objects.items())[:2]))
    await sink.put_objects(objects)  # two of them again: harmless
    assert await sink.missing_objects(ids) == [], "objects put are still named missing"
    assert await sink.missing_objects([ids[0], never[0], ids[1], never[1]]) == never, (
        "missing_objects does not name exactly the ids never put, in order"
    )
    got = await sink.get_objects([*ids, *never])
    assert set(got) == set(ids), "get_objects gives other ids than were put"
    for oid, data in objects.items():
        assert got[oid] == data, f"object {oid} comes back with other bytes than were put"
    await sink.put_objects({})


async def check_failing_sink(sink: ExportSink) -> None:
    """``sink`` cannot hold an export (set up so): its ``deliver`` must raise ``SinkError``."""
    try:
        await sink.deliver(sample_export(1))
    except SinkError:
        return
    except Exception as error:
        raise AssertionError(
            f"a failing deliver must raise SinkError, not {type(error).__name__}: {error}"
        ) from error
    raise AssertionError("deliver returned although the sink could not hold the export")


async def check_sink(
    make_sink: Factory[ExportSink], make_failing_sink: Factory[ExportSink] | None = None
) -> list[str]:
    """Run every check in ``SINK_CHECKS`` on a fresh sink each, and ``check_failing_sink`` on
    one from ``make_failing_sink`` when given; return the names of the checks skipped.

    Args:
        make_sink: Gives a fresh, empty sink, one per check: a plain callable, or one whose
            result is awaited (an async function).
        make_failing_sink: Gives a sink that cannot hold an export (an unwritable folder, a
            closed bucket): its ``deliver`` must raise ``SinkError``. Not given: that check
            is not run.

    Returns:
        The names of the checks skipped: the ``fetch`` checks for a sink without
            ``fetch``, the parts check for a sink without ``deliver_parts``, the objects check
            for a sink that holds no workspace objects.

    Raises:
        ConformanceError: Naming each check that failed (an ``AssertionError``); every check
            runs first.
    """
    checks = dict(SINK_CHECKS)
    if make_failing_sink is not None:
        failing = make_failing_sink

        async def a_failing_delivery_raises_sink_error(_: ExportSink) -> None:
            await check_failing_sink(await fresh(failing))

        checks["a_failing_delivery_raises_sink_error"] = a_failing_delivery_raises_sink_error
    return await run_checks("the export sink", checks, make_sink)


__all__ = [
    "SINK_CHECKS",
    "check_failing_sink",
    "check_sink",
    "sample_export",
    "sample_object",
    "sample_parted",
]
