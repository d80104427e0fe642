"""The worker's configuration: a TOML file named by ``AGENT_CONFIG``.

Credentials never appear in the file: a provider names the environment
variable that holds its key (``api_key_env``) and the worker reads it.
Relative paths are taken relative to the config file's folder.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from durable_agent.core.errors import DurableAgentError, validation_problems
from durable_agent.core.hooks import HooksConfig
from durable_agent.core.models import QualifiedModel
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.plan import Limits, Timeouts
from durable_agent.core.subagents import DEFAULT_ANSWER_CHARS, AgentType
from durable_agent.core.tool_args import WEB_FETCH_DEFAULT_MAX_BYTES, WEB_FETCH_DEFAULT_TIMEOUT

DATA_DIR = Path(__file__).parent / "data"


class ConfigError(DurableAgentError, ValueError):
    """The config is invalid; the message says where and why."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Rewritten(_Strict):
    """A ``_Strict`` model whose table is rewritten (``_rewrite``) before it is validated: keys
    written where TOML reads them most easily, moved to where the model keeps them."""

    @model_validator(mode="before")
    @classmethod
    def _rewritten(cls, data: Any) -> Any:
        # only a table as TOML gives it; a model instance (a default) is validated as it is
        return cls._rewrite(dict(data)) if isinstance(data, dict) else data

    @classmethod
    def _rewrite(cls, data: dict[str, Any]) -> dict[str, Any]:
        """The table ``data`` (a copy: change it freely) as the model's fields take it."""
        return data


# A price in USD per million tokens (a provider's or a model's); unset: not priced here.
UsdPerMTok = Annotated[float | None, Field(ge=0)]


class ScriptedProviderConfig(_Strict):
    """Responses come from a JSON file: offline demos, tests, agent tests of your own."""

    kind: Literal["scripted"]
    script: Path
    # Optional, as for real providers: the worker must find it set, and it never
    # leaves the worker (used to prove that credentials stay out of history).
    api_key_env: str | None = None
    # Prices for the run's cost budget, as on HTTP providers.
    input_usd_per_mtok: UsdPerMTok = None
    output_usd_per_mtok: UsdPerMTok = None
    cache_read_usd_per_mtok: UsdPerMTok = None
    cache_write_usd_per_mtok: UsdPerMTok = None
    # The model's context window in tokens; unset, a scripted run's context is not managed.
    context_window: int | None = Field(None, ge=1)
    # The scripted model takes images (tests of what a model with ``attachment`` is sent).
    attachment: bool = False
    models: dict[str, ModelSettings] = Field(default_factory=dict)


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class ModelSettings(_Strict):
    """Overrides for one model of a provider; unset fields inherit the provider's."""

    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    headers: dict[str, str] = Field(default_factory=dict)
    context_window: int | None = Field(None, ge=1)  # tokens; unset: the provider's, or the table's
    # USD per million prompt / completion tokens: a run's cost budget (``max_cost_usd``); prompt
    # tokens read from or written to the provider's cache at their own prices (unset: the input's)
    input_usd_per_mtok: UsdPerMTok = None
    output_usd_per_mtok: UsdPerMTok = None
    cache_read_usd_per_mtok: UsdPerMTok = None
    cache_write_usd_per_mtok: UsdPerMTok = None
    # A reasoning model: its reasoning is kept and passed back on every later request
    # (``thinking`` blocks, ``reasoning_content``, Responses reasoning items).
    reasoning: bool | None = None
    # Sent where the API takes it (Chat Completions' ``reasoning_effort``, Responses'
    # ``reasoning.effort``).
    reasoning_effort: ReasoningEffort | None = None
    # Anthropic: extended thinking with this budget; ``max_tokens`` grows to fit it.
    thinking_budget_tokens: int | None = Field(None, ge=1024)
    # The model takes images: a tool's image reaches it as an image, not as a note.
    attachment: bool | None = None
    # Prompt caching: Anthropic ``cache_control`` breakpoints, OpenAI's ``prompt_cache_key``.
    prompt_cache: bool | None = None


class ResolvedModelSettings(_Strict):
    """What one call to one model sends: the provider's settings with the model's overrides."""

    max_tokens: int | None
    temperature: float | None
    headers: dict[str, str]
    reasoning: bool = False
    reasoning_effort: ReasoningEffort | None = None
    thinking_budget_tokens: int | None = None
    attachment: bool = False
    prompt_cache: bool = True


def _first(*values: Any) -> Any:
    """The first value that is set (not None)."""
    return next((v for v in values if v is not None), None)


class HttpProviderConfig(_Strict):
    """Settings every HTTP provider kind takes; see each kind for its defaults."""

    base_url: str
    headers: dict[str, str] = Field(default_factory=dict)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    # How long to wait to connect, and then for each next piece of a streamed
    # answer; the model activity's own timeout bounds the whole call.
    timeout_seconds: float = Field(120, gt=0)
    models: dict[str, ModelSettings] = Field(default_factory=dict)
    # The context window of its models (tokens); unset: by model family
    # (``durable_agent.core.context.KNOWN_WINDOWS``), else 32,000.
    context_window: int | None = Field(None, ge=1)
    # USD per million prompt / completion / cache-read / cache-write tokens, for all its models
    # (a model's own wins); unset cache prices: cached tokens are priced as input
    input_usd_per_mtok: UsdPerMTok = None
    output_usd_per_mtok: UsdPerMTok = None
    cache_read_usd_per_mtok: UsdPerMTok = None
    cache_write_usd_per_mtok: UsdPerMTok = None
    # For all its models, as on ``ModelSettings`` (a model's own wins).
    reasoning: bool = False
    reasoning_effort: ReasoningEffort | None = None
    thinking_budget_tokens: int | None = Field(None, ge=1024)
    attachment: bool = False
    prompt_cache: bool = True

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {value!r}")
        return value.rstrip("/")

    def settings_for(self, model: str) -> ResolvedModelSettings:
        """The settings for ``model``: its ``[models."name"]`` entry over the provider's."""
        own = self.models.get(model, ModelSettings())
        headers = {k.lower(): v for k, v in self.headers.items()}
        headers.update({k.lower(): v for k, v in own.headers.items()})
        return ResolvedModelSettings(
            max_tokens=_first(own.max_tokens, self.max_tokens),
            temperature=_first(own.temperature, self.temperature),
            headers=headers,
            reasoning=_first(own.reasoning, self.reasoning),
            reasoning_effort=_first(own.reasoning_effort, self.reasoning_effort),
            thinking_budget_tokens=_first(own.thinking_budget_tokens, self.thinking_budget_tokens),
            attachment=_first(own.attachment, self.attachment),
            prompt_cache=_first(own.prompt_cache, self.prompt_cache),
        )


class OpenAIProviderConfig(HttpProviderConfig):
    """The Chat Completions wire protocol: OpenAI, and vLLM, Ollama, OpenRouter and the like."""

    kind: Literal["openai"]
    base_url: str = "https://api.openai.com/v1"
    # Optional: local servers (Ollama, vLLM, LM Studio) often take no key.
    api_key_env: str | None = None
    # Unset: the server's default (reasoning models refuse an explicit ``max_tokens``).
    max_tokens: int | None = Field(None, ge=1)
    # "chat": ``/chat/completions`` (OpenAI and every compatible server); "responses":
    # OpenAI's ``/responses``, the only way GPT-5 and o-series keep their reasoning between
    # tool calls (encrypted reasoning items under ``store: false``).
    api: Literal["chat", "responses"] = "chat"


class AnthropicProviderConfig(HttpProviderConfig):
    """The Anthropic Messages wire protocol."""

    kind: Literal["anthropic"]
    base_url: str = "https://api.anthropic.com"
    api_key_env: str
    # The Messages API requires a limit; 4096 is within every current model's.
    max_tokens: int = Field(4096, ge=1)


ProviderConfig = Annotated[
    ScriptedProviderConfig | OpenAIProviderConfig | AnthropicProviderConfig, Field(discriminator="kind")
]


def _demo_providers() -> dict[str, ProviderConfig]:
    return {"scripted": ScriptedProviderConfig(kind="scripted", script=DATA_DIR / "demo_script.json")}


class FilesystemStoreConfig(_Strict):
    kind: Literal["filesystem"] = "filesystem"
    path: Path = Path(".agent/store")


class PostgresStoreConfig(_Strict):
    """The session store on PostgreSQL, shared by workers on many machines. The connection
    string is read from the environment variable ``dsn_env`` names, never from this file."""

    kind: Literal["postgres"]
    dsn_env: str = Field("AGENT_PG_DSN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")


StoreConfig = Annotated[FilesystemStoreConfig | PostgresStoreConfig, Field(discriminator="kind")]


class FilesystemSinkConfig(_Strict):
    kind: Literal["filesystem"] = "filesystem"
    path: Path
    # days ``durable-agent gc`` keeps an export for (None: it keeps every export)
    retain_days: float | None = Field(None, gt=0)


class PostgresSinkConfig(_Strict):
    """Exports kept in PostgreSQL (the sink's name keeps its rows apart from other sinks')."""

    kind: Literal["postgres"]
    dsn_env: str = Field("AGENT_PG_DSN", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    # days ``durable-agent gc`` keeps an export for (None: it keeps every export)
    retain_days: float | None = Field(None, gt=0)


SinkConfig = Annotated[FilesystemSinkConfig | PostgresSinkConfig, Field(discriminator="kind")]


def _default_sink() -> SinkConfig:
    return FilesystemSinkConfig(path=Path(".agent/exports"))


def dsn_from_environment(what: str, variable: str) -> str:
    """The connection string in ``variable``; ``ConfigError`` naming ``what`` when it is unset."""
    dsn = os.environ.get(variable, "").strip()
    if not dsn:
        raise ConfigError(f"{what} is on PostgreSQL: set the environment variable {variable} to its DSN")
    return dsn


class SandboxConfig(_Strict):
    """Where the ``bash`` tool's commands run (``durable_agent.activities.tools.sandbox``).

    ``bubblewrap`` (the default) runs each command in a bubblewrap sandbox that
    shows only ``system_paths`` (read-only), the workspace, a private ``/tmp``
    and the ``read_only`` and ``writable`` paths; in a user namespace as
    ``uid``/``gid``; with no network unless ``network``; bounded by the
    ``max_*`` limits; in its own process tree that dies with the call.
    ``none`` runs it directly on the worker's machine, as the worker's user
    (the ``max_*`` limits but ``max_processes`` still apply).
    """

    kind: Literal["bubblewrap", "none"] = "bubblewrap"
    network: bool = False
    # Extra folders or files the command may read (shown even where the sandbox hides, as
    # the worker's home) or write, at the same path inside.
    read_only: tuple[Path, ...] = ()
    writable: tuple[Path, ...] = ()
    # The system folders shown read-only, those that exist (a link, as /bin -> usr/bin, is
    # shown as that link). An allow-list: nothing else of the host is there, so a toolchain
    # elsewhere (~/.cargo, /srv/jdk) goes in read_only.
    system_paths: tuple[Path, ...] = tuple(
        Path(p) for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
    ) + tuple(Path(p) for p in ("/etc", "/opt", "/nix", "/sys"))
    # Paths the command must not see, absolute or relative to the workspace (".env"). The
    # worker adds its session store and filesystem export sinks.
    hide: tuple[Path, ...] = ()
    # Whether the command may change the repository's .git/hooks and .git/config, which git
    # later runs and reads outside the sandbox. Read-only unless true.
    git_metadata_writable: bool = False
    # A user namespace in which the command is uid/gid: false only where the kernel allows
    # none (the probe says so): as root, the command is then uid 0 inside, without capabilities.
    user_namespace: bool = True
    uid: int = Field(1000, ge=1, le=2**32 - 2)
    gid: int = Field(1000, ge=1, le=2**32 - 2)
    # Who the command is on the host when the worker runs as root: the owner of the workspace
    # folder when that is not root (so it is never root on the host there), else root;
    # "worker": always the worker's user. A worker that is not root runs it as itself.
    run_as: Literal["workspace-owner", "worker"] = "workspace-owner"
    # Bounds of one call; 0: none. Processes (and threads) at once in the sandbox; address
    # space, file size and CPU time of each of its processes.
    max_processes: int = Field(1024, ge=0)
    max_memory_bytes: int = Field(4 * 1024**3, ge=0)
    max_file_bytes: int = Field(1024**3, ge=0)
    max_cpu_seconds: int = Field(3600, ge=0)

    @field_validator("system_paths")
    @classmethod
    def _absolute(cls, paths: tuple[Path, ...]) -> tuple[Path, ...]:
        for path in paths:
            if not path.is_absolute():
                raise ValueError(f"system_paths are absolute paths: {str(path)!r} is not")
        return paths

    @field_validator("max_memory_bytes")
    @classmethod
    def _enough_to_start(cls, value: int) -> int:
        smallest = 32 * 1024**2  # what a shell needs to start, with room for a small command
        if 0 < value < smallest:
            raise ValueError(f"below {smallest} bytes no shell starts (0: no limit)")
        return value


class ConversationConfig(_Strict):
    """Runs started with ``follow_ups``: how long one waits for the next prompt (none: for ever)."""

    idle_timeout_seconds: float | None = Field(3600, gt=0)


class InstructionsConfig(_Strict):
    """Project instructions: the files a run's system prompt takes in from the repository around
    its workspace, from the repository's root down to the workspace (see Context and conversations)."""

    # Read them: off, a run's system prompt is ``system_prompt`` (and its input's ``instructions``).
    project_files: bool = True
    # The names looked for in each folder: the first that is there is read, the others not.
    file_names: tuple[str, ...] = ("AGENTS.md", "CLAUDE.md")

    @field_validator("file_names")
    @classmethod
    def _plain_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
                raise ValueError(f"{name!r} is not a file name (a name in a folder, no path)")
        return names


class BudgetsConfig(_Strict):
    """Each run's default budgets (none by default); a run's input may set its own."""

    max_total_tokens: int | None = Field(None, ge=1)
    max_cost_usd: float | None = Field(None, gt=0)


class ModelPrices(_Strict):
    """USD per million tokens of one model; cache prices unset: those tokens cost the input's."""

    input: float | None = None
    output: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None


def model_prices(provider: ProviderConfig, model: str) -> ModelPrices:
    """The prices of ``model``: its own, else its provider's."""
    own = provider.models.get(model, ModelSettings())
    return ModelPrices(
        input=_first(own.input_usd_per_mtok, provider.input_usd_per_mtok),
        output=_first(own.output_usd_per_mtok, provider.output_usd_per_mtok),
        cache_read=_first(own.cache_read_usd_per_mtok, provider.cache_read_usd_per_mtok),
        cache_write=_first(own.cache_write_usd_per_mtok, provider.cache_write_usd_per_mtok),
    )


def takes_images(config: AgentConfig, qualified: str) -> bool:
    """Whether "provider/model" takes images (its ``attachment`` setting)."""
    provider_name, _, model = qualified.partition("/")
    provider = config.providers.get(provider_name)
    return provider is not None and model_settings(provider, model).attachment


def model_settings(provider: ProviderConfig, model: str) -> ResolvedModelSettings:
    """What a call to ``model`` sends (the scripted provider: only whether it takes images)."""
    if isinstance(provider, ScriptedProviderConfig):
        own = provider.models.get(model, ModelSettings())
        return ResolvedModelSettings(
            max_tokens=None,
            temperature=None,
            headers={},
            attachment=_first(own.attachment, provider.attachment),
        )
    return provider.settings_for(model)


class ContextConfig(_Strict):
    """Context management (``durable_agent.core.context``): compact before a request past
    ``compact_at`` of the usable window (the window less the answer's ``max_tokens``), down to
    ``compact_to`` of it; the newest ``keep_recent`` tool results are never elided; summaries
    are written by ``compaction_model`` ("provider/model"; unset: the run's model)."""

    # 0.9 -> 0.4: few, large compactions, so that the provider's prompt cache holds (see
    # ``durable_agent.core.context``)
    compact_at: float = Field(0.9, gt=0, le=1)
    compact_to: float = Field(0.4, gt=0, lt=1)
    keep_recent: int = Field(4, ge=0)
    compaction_model: QualifiedModel | None = None

    @model_validator(mode="after")
    def _down_from_above(self) -> ContextConfig:
        if self.compact_to >= self.compact_at:
            raise ValueError(
                f"compact_to ({self.compact_to}) must be below compact_at ({self.compact_at}): a "
                "compaction brings the request down from compact_at to compact_to"
            )
        return self


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


# Workflow tasks one worker process works on at once (``[worker] workflow_task_slots``).
WORKFLOW_TASK_SLOTS = 4


# Worker versioning's names (``[worker] deployment`` and ``build_id``, and the variables that
# override them): Temporal writes a version as ``<deployment>.<build>`` and its search attribute
# as ``<deployment>:<build>``, so a deployment's name holds neither; names starting ``__`` are
# the server's own (``__unversioned__``); and both are quoted in visibility queries
# (``durable-agent deploy status``), so neither holds a quote or a backslash.
DEPLOYMENT_NAME_PATTERN = r"^[A-Za-z0-9][^.:\s\"'\\]{0,254}$"
BUILD_ID_PATTERN = r"^[A-Za-z0-9][^\s\"'\\]{0,254}$"


class WorkerConfig(_Strict):
    """How one worker process runs (``build_worker`` and the plugin): how much it takes on at
    once, and the build it is of (worker versioning, ``durable_agent/deployments.py``)."""

    # Workflow tasks the process works on at once (Temporal's default is 100). A worker that takes
    # over a dead one's runs replays every run it polled at once, together: with 100 slots, ten
    # such replays each took longer than the 3 s task timeout and were tried again and again
    # (takeovers of 16 to 24 s); with 4, each is done in turn (docs/costs.md, Takeover). What
    # 4 costs in throughput (20 runs on one worker) was within the bench's noise, or up to a
    # fifth in some runs: docs/production.md.
    workflow_task_slots: int = Field(WORKFLOW_TASK_SLOTS, ge=2, le=1_000)  # the SDK's floor: 2
    # How many activities (tool and model calls, local ones too) the process runs at once:
    # "fixed", the SDK's 100 each; or "resource", the SDK's resource-based tuner, which starts
    # another while the machine's memory and CPU stay under ``target_memory`` and ``target_cpu``
    # (fractions of the whole). Workflow tasks stay ``workflow_task_slots`` either way: more of
    # them at once is what made takeovers slow, whatever the machine had left (docs/production.md).
    tuner: Literal["fixed", "resource"] = "fixed"
    target_memory: float = Field(0.8, gt=0, le=1)
    target_cpu: float = Field(0.9, gt=0, le=1)
    # The Temporal Worker Deployment this worker's build belongs to. Set: each run is pinned to
    # the build that started it, new runs go to the deployment's current build (``durable-agent
    # deploy promote``). Unset: unversioned, every worker takes every run, and a change to what
    # the workflow does needs a patch (docs/production.md, Deploys). ``AGENT_DEPLOYMENT``
    # overrides it.
    deployment: str | None = Field(None, pattern=DEPLOYMENT_NAME_PATTERN)
    # This worker's build within the deployment; unset: the package's version and a digest of its
    # source (``deployments.default_build_id``). ``AGENT_BUILD_ID`` overrides it.
    build_id: str | None = Field(None, pattern=BUILD_ID_PATTERN)


class MetricsConfig(_Strict):
    """``[metrics]``: the worker's Prometheus endpoint, with the Temporal SDK's metrics and the
    agent's (``durable_agent.telemetry``). Unset ``bind``: no endpoint."""

    bind: str | None = Field(None, pattern=r"^[^\s:]*:[0-9]{1,5}$")  # "0.0.0.0:9464"


class TelemetryConfig(_Strict):
    """``[telemetry]``: what the worker's trace spans may hold. Spans are exported where the
    standard ``OTEL_*`` variables name an OTLP endpoint, and off otherwise."""

    # Prompt, answer and tool output text in spans: off, since they hold source code and secrets.
    capture_content: bool = False


class CodecConfig(_Strict):
    """``[codec]``: encrypt every payload the client and worker send through Temporal
    (``durable_agent.codec``), AES-256-GCM. ``keys`` maps a key id to the environment variable
    that holds that key (32 bytes, base64); ``encrypt_with`` is the id new payloads are
    encrypted with, and every key in ``keys`` still decrypts (rotation: add the new key,
    encrypt with it, drop the old one once no history needs it). No keys: no encryption."""

    keys: dict[str, Annotated[str, Field(pattern=_ENV_NAME)]] = Field(default_factory=dict)
    encrypt_with: str | None = None
    # With keys, a worker refuses a run's start input and its updates when they come unencrypted
    # (a client without the keys); true takes them, for runs started before encryption was on.
    accept_plaintext: bool = False

    @field_validator("keys")
    @classmethod
    def _key_ids(cls, keys: dict[str, str]) -> dict[str, str]:
        for key_id in keys:
            if not key_id or len(key_id) > 64 or not all(c.isalnum() or c in "._-" for c in key_id):
                raise ValueError(f"key id {key_id!r}: use 1 to 64 letters, digits, '.', '_' or '-'")
        return keys

    @model_validator(mode="after")
    def _encrypt_with_known(self) -> CodecConfig:
        if self.keys and self.encrypt_with is None:
            raise ValueError(f"encrypt_with must name the key that encrypts, one of {sorted(self.keys)}")
        if self.encrypt_with is not None and self.encrypt_with not in self.keys:
            raise ValueError(
                f"encrypt_with {self.encrypt_with!r} is not a key id of [codec.keys] "
                f"({', '.join(sorted(self.keys)) or 'none'})"
            )
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.keys)


# A server's name is part of its tools' names (``mcp__NAME__TOOL``): no double underscore.
_MCP_NAME = r"^[A-Za-z0-9]+(?:[-_][A-Za-z0-9]+)*$"


class McpServerConfig(_Strict):
    """``[mcp.NAME]``: a Model Context Protocol server whose tools the model is offered as
    ``mcp__NAME__TOOL``. Either ``command`` (a process the worker starts, spoken to over its
    stdin/stdout) or ``url`` (streamable HTTP).

    Secrets never appear here: ``env`` maps a variable the server gets to the worker's variable
    that holds its value, and ``headers`` a header to the variable that holds its value.
    """

    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, Annotated[str, Field(pattern=_ENV_NAME)]] = Field(default_factory=dict)
    cwd: Path | None = None
    url: str | None = Field(None, pattern=r"^https?://")
    headers: dict[str, Annotated[str, Field(pattern=_ENV_NAME)]] = Field(default_factory=dict)
    # Whether a call cut short by the server's crash may run again ("safe": its tools can be
    # repeated), or comes back to the model as failed ("never": it may have done something).
    retry: Literal["safe", "never"] = "never"
    # How long one call may take, and how long starting (or reaching) the server may.
    timeout_seconds: float = Field(120, gt=0)
    connect_timeout_seconds: float = Field(15, gt=0)
    # Per tool, the argument permission rules match: ``mcp__db__query(select *)`` with
    # ``permission_args = { query = "sql" }`` judges a call by its ``sql`` argument.
    permission_args: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (streamable HTTP), not both")
        if self.url is not None and (self.args or self.env or self.cwd is not None):
            raise ValueError("args, env and cwd are for a stdio server (command); this one has a url")
        if self.command is not None and self.headers:
            raise ValueError("headers are for a streamable HTTP server (url); this one has a command")
        return self


class WorkspaceCheckpointsConfig(_Strict):
    """The workspace recorded with the checkpoint (docs/exports.md): after each call to a tool
    that may change files, the worker records the workspace's files as a git tree in a shadow
    repository of its own (never the workspace's `.git`) and puts the new objects in the run's
    export sink, which must be a filesystem one; the call's `tool_end` event holds the tree id.
    Files the workspace's `.gitignore` files ignore are left out, and so are `.git` folders."""

    # Record the workspace at each boundary of a tool that may change files.
    enabled: bool = True
    # Where the shadow repositories are kept (one a workspace); default:
    # `$XDG_STATE_HOME/durable-agent/shadow` (`~/.local/state/durable-agent/shadow`).
    path: Path | None = None
    # A larger file is left out of the tree (and named in the event's `left_out`).
    max_file_bytes: int = Field(10 * 1024 * 1024, ge=0)
    # When the files one boundary adds or changes together pass this, the largest of them are
    # left out until the rest fit.
    max_total_bytes: int = Field(1024 * 1024 * 1024, ge=0)


class WorkspacesConfig(_Strict):
    """The run's workspace on the worker's machines (docs/workspaces.md): a run whose workspace
    follows it records its tree when it starts, and every tool call makes its machine's copy
    equal to the tree the run expects before it runs, restoring it from the run's sink where it
    differs. It needs `[workspace_checkpoints]` on and an export sink that holds trees."""

    # Keep each run's workspace at its tree on whatever machine runs its calls.
    follow: bool = True
    # The workspaces are on a disk every worker shares (NFS and the like): never restored, and a
    # run's calls go to any worker.
    shared: bool = False
    # How long a call waits on the run's host's own task queue before any worker takes the run
    # over (restoring its copy): the host is busy or gone.
    host_wait_seconds: float = Field(5.0, gt=0, le=600)
    # Where a run's own folder is made, for a workspace from a source (`{git = ..., ref = ...}`,
    # `{tree = ...}`): `<root>/<session>/<run>`, and `<root>/.git-cache` the machine's mirrors.
    # The same path on every worker. Default: `$XDG_STATE_HOME/durable-agent/workspaces`.
    root: Path | None = None
    # A run's own folder (and its shadow repository) unused for this long is removed from the
    # machine: the run, should it act again, restores it from its sink. None: kept for ever.
    keep_hours: float | None = Field(168.0, gt=0)
    # The most a run's workspace may hold (its files in its tree): a call that leaves it larger
    # is a tool error, its changes undone and nothing recorded. None: no bound.
    max_bytes: int | None = Field(None, gt=0)
    # A command run in the sandbox in a copy before its first call on a machine, and again when
    # the files `setup_key` names change (`npm ci`, `uv sync`): what it makes should be ignored by
    # the workspace's .gitignore (the machine's cache, not the run's files). None: no setup.
    setup: str | None = Field(None, min_length=1)
    # The files (relative to the workspace) whose contents key the setup: a lockfile.
    setup_key: tuple[str, ...] = ()
    # The setup's time limit; it counts within the call's own ([timeouts] tool_seconds).
    setup_seconds: float = Field(240.0, gt=0, le=3600)
    # A run whose workspace came from a git source ends with a commit of its change, pushed to
    # `branch` of that repository, when the run's rules allow `git_push(<branch>)` (or a person
    # does, for `ask`). Credentials come from the worker's environment only.
    commit: bool = False
    # The branch: `{session}` is the run's session id.
    branch: str = Field("agent/{session}", min_length=1)


class WebFetchConfig(_Strict):
    """The ``web_fetch`` tool. Which hosts a run may fetch from is its permission rules'
    business (``web_fetch(domain:HOST)``, denied by default); this is what one fetch may do."""

    # Connect to private, loopback, link-local and other non-public addresses too (a service on
    # the worker's own network): off, so a page or a redirect never leads the worker into it.
    allow_private_addresses: bool = False
    # The body read at most (after decompression); the rest is cut, and the result says so.
    max_bytes: int = Field(WEB_FETCH_DEFAULT_MAX_BYTES, ge=1, le=100 * 1024 * 1024)
    # The whole fetch, redirects and name lookups included (keep it under ``[timeouts]`` ``tool_seconds``).
    timeout_seconds: float = Field(WEB_FETCH_DEFAULT_TIMEOUT, gt=0, le=600)


class ToolsConfig(_Strict):
    """Settings of the built-in tools, and which calls of one answer run together."""

    web_fetch: WebFetchConfig = WebFetchConfig()  # The `web_fetch` tool.
    # Run the calls of one model answer that are safe together at the same time: calls of tools
    # that only read (`read`, `ls`, `glob`, `grep`, `web_fetch`, a host's tool made with
    # `read_only=True`, an MCP tool whose server marks it `readOnlyHint`) and of the tools
    # `parallel` names. Each call's boundary is still exported in the answer's order. Off: every
    # call runs alone, in order.
    parallel_calls: bool = True
    # More tools whose calls may run together with the answer's other such calls, by the name
    # the model calls them by (`bash`, `mcp__github__search_code`): only for tools whose calls
    # never depend on one another (two `bash` lines of one answer then run at once).
    parallel: tuple[str, ...] = ()
    # Run calls of the quick built-in tools (`read`, `ls`, `glob`, `grep`) as local activities:
    # on the worker within the workflow task, with no task queue round trip, so a step costs one
    # workflow task. Their outputs are recorded in the history as the other tools' are; a worker
    # that dies in one times the workflow task out (3 s) and another runs the call again, and a
    # call whose boundary was already exported gets its recorded output back, not a new one.
    # Off: every tool call is an ordinary activity.
    local_calls: bool = True

    def runs_together(self, name: str, read_only: bool) -> bool:
        """Whether the calls of the tool ``name`` may run together with the other such calls of
        one answer.

        Args:
            name: the tool's name, as offered.
            read_only: whether the tool only reads.

        Returns:
            ``parallel_calls``, and the tool only reads or ``parallel`` names it.
        """
        return self.parallel_calls and (read_only or name in self.parallel)


class AgentsConfig(_Rewritten):
    """Subagents (docs/subagents.md): the `task` tool, which starts a child run whose answer is
    the call's result. `[agents.NAME]` tables define kinds of subagent the model may choose."""

    # Offer the `task` tool. Off: no run is offered it (its tools, and its exports' capability
    # binding, are as without subagents).
    enabled: bool = False
    # How deep children may go: 1, children of a run a host started are not offered `task`.
    max_depth: int = Field(1, ge=1, le=5)
    # Children one run may start in all; a `task` call past it is a tool error.
    max_children: int = Field(8, ge=1, le=1_000)
    # The most of a child's answer the parent's model reads (characters; the cut is said).
    max_answer_chars: int = Field(DEFAULT_ANSWER_CHARS, ge=100, le=200_000)
    # The kinds of subagent, by name: `[agents.NAME]` (written beside the keys above).
    types: dict[Annotated[str, Field(pattern=_MCP_NAME, max_length=64)], AgentType] = Field(
        default_factory=dict, json_schema_extra={"tables_here": True}
    )

    @classmethod
    def _rewrite(cls, data: dict[str, Any]) -> dict[str, Any]:
        """``[agents.NAME]`` tables are agent types: they go into ``types``."""
        types = dict(data.pop("types", None) or {})
        for name in [k for k, v in data.items() if isinstance(v, dict) and k not in cls.model_fields]:
            types[name] = data.pop(name)
        data["types"] = types
        return data


class AgentConfig(_Rewritten):
    """The worker's config: the TOML file ``AGENT_CONFIG`` names, as ``load_config`` reads it.
    Unknown keys are refused."""

    default_model: str = "scripted/demo"
    default_sink: str | None = "local"
    default_workspace: Path = Path(".")
    system_prompt: str = (
        "You are a careful coding agent. Use the tools to inspect the workspace "
        "before you answer, and say what you found."
    )
    max_tool_rounds: int = Field(50, ge=1, le=10_000)
    # How long a call that needs a person's approval waits before it is denied (none: for ever).
    approval_timeout_seconds: float | None = Field(None, gt=0)
    providers: dict[str, ProviderConfig] = Field(default_factory=_demo_providers)
    store: StoreConfig = FilesystemStoreConfig()
    sinks: dict[str, SinkConfig] = Field(default_factory=lambda: {"local": _default_sink()})
    permissions: PermissionPolicy = PermissionPolicy(allow=("read(**)", "ls(**)"))
    timeouts: Timeouts = Timeouts()
    limits: Limits = Limits()
    sandbox: SandboxConfig = SandboxConfig()
    tools: ToolsConfig = ToolsConfig()  # The tools: `[tools.web_fetch]`, which calls run together.
    conversation: ConversationConfig = ConversationConfig()
    budgets: BudgetsConfig = BudgetsConfig()
    # Project instructions: the AGENTS.md files a run's system prompt takes in.
    instructions: InstructionsConfig = InstructionsConfig()
    context: ContextConfig = ContextConfig()
    worker: WorkerConfig = WorkerConfig()  # How much one worker process takes on at once.
    metrics: MetricsConfig = MetricsConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    codec: CodecConfig = CodecConfig()
    mcp: dict[Annotated[str, Field(pattern=_MCP_NAME, max_length=32)], McpServerConfig] = Field(
        default_factory=dict
    )
    hooks: HooksConfig = HooksConfig()
    # The workspace's files recorded at each boundary, as git trees (docs/exports.md).
    workspace_checkpoints: WorkspaceCheckpointsConfig = WorkspaceCheckpointsConfig()
    # The workspace follows the run to whatever machine runs its calls (docs/workspaces.md).
    workspaces: WorkspacesConfig = WorkspacesConfig()
    # Subagents: the `task` tool and the kinds of subagent, `[agents.NAME]` (docs/subagents.md).
    agents: AgentsConfig = AgentsConfig()

    @classmethod
    def _rewrite(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A ``[store]`` or ``[sinks.NAME]`` without ``kind`` is a filesystem one, as before kinds."""
        if isinstance(data.get("store"), dict) and "kind" not in data["store"]:
            data["store"] = {**data["store"], "kind": "filesystem"}
        if isinstance(data.get("sinks"), dict):
            data["sinks"] = {
                name: {**sink, "kind": "filesystem"}
                if isinstance(sink, dict) and "kind" not in sink
                else sink
                for name, sink in data["sinks"].items()
            }
        return data

    @model_validator(mode="after")
    def _references_exist(self) -> AgentConfig:
        provider = self.default_model.partition("/")[0]
        if provider not in self.providers:
            raise ValueError(
                f"default_model {self.default_model!r} names provider {provider!r}, "
                f"which is not defined (providers: {', '.join(sorted(self.providers)) or 'none'})"
            )
        return self

    def with_base(self, base: Path) -> AgentConfig:
        """Resolve relative paths against ``base`` (the config file's folder).

        Args:
            base: The folder relative paths are taken from.

        Returns:
            A copy of the config with its relative paths (the default workspace, the store's
                and the sinks' folders, a scripted model's script, …) made absolute.
        """

        def fix(p: Path) -> Path:
            return p if p.is_absolute() else (base / p)

        providers = {
            name: p.model_copy(update={"script": fix(p.script)})
            if isinstance(p, ScriptedProviderConfig)
            else p
            for name, p in self.providers.items()
        }
        sinks = {
            name: s.model_copy(update={"path": fix(s.path)}) if isinstance(s, FilesystemSinkConfig) else s
            for name, s in self.sinks.items()
        }
        store = self.store
        if isinstance(store, FilesystemStoreConfig):
            store = store.model_copy(update={"path": fix(store.path)})
        sandbox = self.sandbox.model_copy(
            update={
                "read_only": tuple(fix(p) for p in self.sandbox.read_only),
                "writable": tuple(fix(p) for p in self.sandbox.writable),
            }
        )
        mcp = {
            name: m.model_copy(update={"cwd": fix(m.cwd)}) if m.cwd is not None else m
            for name, m in self.mcp.items()
        }
        shadow = self.workspace_checkpoints
        if shadow.path is not None:
            shadow = shadow.model_copy(update={"path": fix(shadow.path)})
        return self.model_copy(
            update={
                "workspace_checkpoints": shadow,
                "mcp": mcp,
                "providers": providers,
                "sinks": sinks,
                "store": store,
                "default_workspace": fix(self.default_workspace),
                "sandbox": sandbox,
            }
        )


def parse_config(data: dict[str, object], base: Path) -> AgentConfig:
    try:
        return AgentConfig.model_validate(data).with_base(base)
    except ValidationError as exc:
        lines = "\n".join(f"  {line}" for line in validation_problems(exc))
        raise ConfigError(f"invalid agent config:\n{lines}") from None


def load_config(path: str | os.PathLike[str] | None = None) -> AgentConfig:
    """Load the config named by ``path`` or ``AGENT_CONFIG``; the built-in default when unset.

    Args:
        path: The TOML file; default: the one ``AGENT_CONFIG`` names. Relative paths in it
            (the store's and the sinks' folders, the sandbox's, …) are taken from the
            file's folder.

    Returns:
        The validated config; with neither a path nor ``AGENT_CONFIG``, the built-in one
            (the scripted demo model, a filesystem store and sink), its paths relative to
            the current folder.

    Raises:
        ConfigError: The file does not exist, is not valid TOML, or is not a valid config
            (the message names each key that is wrong and why).
    """
    if path is None:
        path = os.environ.get("AGENT_CONFIG") or None
    if path is None:
        return parse_config({}, Path.cwd())
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"agent config file {str(file)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"agent config file {str(file)!r} is not valid TOML: {exc}") from None
    try:
        return parse_config(data, file.resolve().parent)
    except ConfigError as exc:
        raise ConfigError(f"{file}: {exc}") from None
