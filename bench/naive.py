"""The naive design, for comparison: the whole conversation in every model call.

``NaiveAgentRun`` keeps the conversation in the workflow and hands all of it
to a model activity at every step, so step k's input holds k tool outputs and
the history grows with the square of the run's length. No checkpoints, no
exports, no continue-as-new. Its tool calls go through ``agent.tool_call``, as
``AgentRun``'s do; its model calls through the same scripted provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from durable_agent.activities.providers import ModelProvider
    from durable_agent.core.activity_api import TOOL_CALL, ModelCallInput, ToolCallInput, ToolOutput
    from durable_agent.core.models import (
        Frozen,
        Message,
        ModelResponse,
        TextBlock,
        ToolDefinition,
        ToolResultBlock,
        ToolUseBlock,
    )

NAIVE_WORKFLOW = "NaiveAgentRun"
NAIVE_MODEL = "bench.naive_model_call"


class NaiveInput(Frozen):
    prompt: str
    workspace: str
    model: str
    system_prompt: str
    tools: tuple[ToolDefinition, ...]
    max_steps: int


class NaiveModel:
    """The naive design's model activity: one provider call with the whole conversation."""

    def __init__(self, providers: Mapping[str, ModelProvider]) -> None:
        self.providers = providers

    @activity.defn(name=NAIVE_MODEL)
    async def model_call(self, call: ModelCallInput) -> ModelResponse:
        provider, _, model = call.model.partition("/")
        return await self.providers[provider].complete(call, model, lambda _text: None)


@workflow.defn(name=NAIVE_WORKFLOW)
class NaiveAgentRun:
    """Runs the scripted conversation to its end; returns the number of tool boundaries."""

    @workflow.run
    async def run(self, inp: NaiveInput) -> int:
        conversation = [Message(role="user", content=(TextBlock(text=inp.prompt),))]
        boundaries = 0
        for _ in range(inp.max_steps):
            call = ModelCallInput(
                run_id=workflow.info().run_id,
                model=inp.model,
                system_prompt=inp.system_prompt,
                messages=tuple(conversation),
                tools=inp.tools,
            )
            response = await workflow.execute_activity(
                NAIVE_MODEL,
                call,
                result_type=ModelResponse,
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            conversation.append(response.message)
            uses = response.message.tool_uses()
            if not uses:
                return boundaries
            results = [await self._tool(inp, use) for use in uses]
            conversation.append(Message(role="user", content=tuple(results)))
            boundaries += len(results)
        raise ApplicationError(f"more than max_steps={inp.max_steps} model steps", non_retryable=True)

    async def _tool(self, inp: NaiveInput, use: ToolUseBlock) -> ToolResultBlock:
        output = await workflow.execute_activity(
            TOOL_CALL.name,
            ToolCallInput(
                run_id=workflow.info().run_id,
                workspace=inp.workspace,
                call_id=use.id,
                name=use.name,
                arguments=use.input,
            ),
            result_type=ToolOutput,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
        return ToolResultBlock(tool_use_id=use.id, content=output.content, is_error=output.is_error)
