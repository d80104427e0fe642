"""Conformance checks for your own session store or export sink.

A ``SessionStore`` (a database, a bucket) or an ``ExportSink`` of your own must
keep the same contract as the built-in ones; these checks exercise it, in plain
``async`` functions that raise ``AssertionError`` saying what differed (no test
framework needed). From pytest (with ``pytest-asyncio``)::

    import pytest
    from durable_agent.conformance import SINK_CHECKS, STORE_CHECKS

    @pytest.mark.parametrize("check", STORE_CHECKS.values(), ids=STORE_CHECKS.keys())
    async def test_my_store(check, tmp_path):
        await check(MyStore(tmp_path))  # a fresh, empty store for each check

    @pytest.mark.parametrize("check", SINK_CHECKS.values(), ids=SINK_CHECKS.keys())
    async def test_my_sink(check, tmp_path):
        await check(MySink(tmp_path))

Or all at once, from anywhere: ``await check_store(lambda: MyStore(...))`` and
``await check_sink(make_sink, make_failing_sink)``, which run every check on its
own fresh instance and raise ``ConformanceError`` naming each one that failed.
A check that does not apply (``fetch`` on a sink without it) raises ``CheckSkipped``.
"""

from durable_agent.conformance.checks import Check, CheckSkipped, ConformanceError, Factory, run_checks
from durable_agent.conformance.sink_checks import SINK_CHECKS, check_failing_sink, check_sink, sample_export
from durable_agent.conformance.store_checks import STORE_CHECKS, check_store

__all__ = [
    "SINK_CHECKS",
    "STORE_CHECKS",
    "Check",
    "CheckSkipped",
    "ConformanceError",
    "Factory",
    "check_failing_sink",
    "check_sink",
    "check_store",
    "run_checks",
    "sample_export",
]
