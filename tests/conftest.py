"""One real Temporal dev server for the whole session (or ``TEMPORAL_ADDRESS``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client

from durable_agent.client import connect, ensure_search_attributes
from durable_agent.devserver import start_ephemeral_server


@pytest.fixture(scope="session")
async def temporal_client() -> AsyncIterator[Client]:
    if os.environ.get("TEMPORAL_ADDRESS"):
        client = await connect()  # TEMPORAL_ADDRESS / TEMPORAL_NAMESPACE, as Temporal's tools read them
        await ensure_search_attributes(client)
        yield client
        return
    env = await start_ephemeral_server()
    try:
        yield env.client
    finally:
        await env.shutdown()


@pytest.fixture
def client(temporal_client: Client) -> Client:
    return temporal_client
