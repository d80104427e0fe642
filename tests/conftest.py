"""One real Temporal dev server for the whole session (or ``TEMPORAL_ADDRESS``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from durable_agent.client import ensure_search_attributes
from durable_agent.devserver import temporal_binary
from durable_agent.run_io import SA_RUN_STATUS, SA_SESSION_ID


@pytest.fixture(scope="session")
async def temporal_client() -> AsyncIterator[Client]:
    address = os.environ.get("TEMPORAL_ADDRESS")
    if address:
        client = await Client.connect(
            address,
            namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
            data_converter=pydantic_data_converter,
        )
        await ensure_search_attributes(client)
        yield client
        return
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=[
            SearchAttributeKey.for_keyword(SA_SESSION_ID),
            SearchAttributeKey.for_keyword(SA_RUN_STATUS),
        ],
    )
    try:
        yield env.client
    finally:
        await env.shutdown()


@pytest.fixture
def client(temporal_client: Client) -> Client:
    return temporal_client
