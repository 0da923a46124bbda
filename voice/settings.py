"""The configuration, typed: one frozen dataclass per section of
config/voice.toml, gathered in one frozen `Settings`.

`Settings.from_config` reads a config that voice.config has loaded and
checked (voice.config_schema: types, ranges, choices, the cross-key rules)
once, at the entry point; from there down every part gets the section it
needs, as attributes, never a dict read by key. A section's fields are its
TOML keys, in the file's order (`table` gives them back, for a saved
recording's config.toml); lists become tuples.

The paths a config decides (the log, the control socket, the data folder)
are computed here, from voice.paths, and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from voice.paths import control_socket, data_dir, event_log


@dataclass(frozen=True)
class LlmSettings:
    provider: str = "auto"
    base_url: str = "http://127.0.0.1:11434/v1"
    model: str = "llama3.2"
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 30.0
    retries: int = 1
    retry_backoff_s: float = 0.5
    max_steps: int = 8
    context_tokens: int = 4096
    reply_tokens: int = 512
    warm_cache: bool = True
    system_prompt: str = ""


@dataclass(frozen=True)
class ConversationSettings:
    """When a spoken conversation ends ([conversation])."""

    idle_gap_s: float | None = None  # None: only when asked
    new_phrases: tuple[str, ...] = ()  # what the person says to start a new one
    new_reply: str = ""  # said back ("" says nothing)


@dataclass(frozen=True)
class PathsSettings:
    db: str = ""  # "": the XDG default

    def db_path(self, given: str | Path | None = None) -> Path:
        """The log: `given` (--db), else the config's, else the XDG default."""
        return event_log(given or self.db)


@dataclass(frozen=True)
class ChatSettings:
    show_reasoning: bool = True


@dataclass(frozen=True)
class AudioSettings:
    input: str = ""
    output: str = ""
    echo_cancellation: bool = True


@dataclass(frozen=True)
class VadSettings:
    confidence: float = 0.7
    start_secs: float = 0.05
    stop_secs: float = 0.6
    min_volume: float = 0.4


@dataclass(frozen=True)
class TurnEndSettings:
    enabled: bool = True
    speculate_s: float = 0.05  # pause after which the utterance so far is transcribed (and the silence kept)
    end_s: float = 0.45  # silence that ends a complete request (the VAD's stop_secs ends any other)
    # Not a config key (a field for tests): fewer words never end early, "Stop.", "Wait." often start more.
    min_words: int = field(default=3, metadata={"config": False})


@dataclass(frozen=True)
class SttSettings:
    model: str = "base"
    threads: int = 2
    base_url: str = ""  # "": recognise locally
    remote_model: str = "whisper-1"
    timeout_s: float = 10.0


@dataclass(frozen=True)
class TtsSettings:
    alignments: bool = True


# When a write asks the person first (voice.agent.approvals.needs_approval): an MCP server's
# `approve`, and the configured commands' (`tools.approve`, `tools.approve_commands`).
Approve = Literal["destructive", "writes", "never"]


@dataclass(frozen=True)
class ToolsSettings:
    kill_after_s: float = 2.0
    approval_timeout_s: float = 20.0
    command_env: tuple[str, ...] = ()
    commands: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: MappingProxyType({}))  # NAME -> argv
    approve: Approve = "writes"  # whether a configured command asks first
    approve_commands: Mapping[str, Approve] = field(default_factory=lambda: MappingProxyType({}))  # NAME -> policy

    def command_approve(self, name: str) -> Approve:
        """The approval policy of the configured command `name`."""
        return self.approve_commands.get(name, self.approve)


@dataclass(frozen=True)
class ServiceSettings:
    shutdown_s: float = 5.0
    socket: str = ""  # "": the default place

    @property
    def socket_path(self) -> Path:
        return control_socket(self.socket)


@dataclass(frozen=True)
class BargeInSettings:
    confirm_ms: float = 500.0
    resume_ms: float = 2000.0
    stop_phrases: tuple[str, ...] = ()  # (the documented ones: voice.speech.judge.STOP_PHRASES)


@dataclass(frozen=True)
class ListenSettings:
    mode: str = "wake"  # "wake": a wake word (or the conversation window) first; "open": everything
    wake_word: str = "okay_nabu"
    window_s: float = 8.0


@dataclass(frozen=True)
class RecordSettings:
    ring_s: float = 120.0


@dataclass(frozen=True)
class McpServerSettings:
    """One `[mcp.servers.NAME]` table (voice.agent.mcp.settings.ServerSpec
    adds what an editor gives and what is done with it)."""

    name: str
    command: str = ""  # stdio: the program (with `args`)
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # stdio: added to the `tools.command_env` variables
    cwd: str = ""
    url: str = ""  # Streamable HTTP
    headers: tuple[tuple[str, str], ...] = ()  # (header, the environment variable holding its value)
    allow: tuple[str, ...] = ()  # offer only these tools (empty: all)
    deny: tuple[str, ...] = ()  # never offer these
    trust_annotations: bool = False  # the server's readOnly/destructive/idempotent hints are believed
    read_tools: tuple[str, ...] = ()  # the person says these only read
    timeout_s: float = 30.0
    approve: Approve = "destructive"
    max_result_chars: int = 4000
    enabled: bool = True
    start_timeout_s: float = 10.0  # the handshake and the tool list (a first `npx` or `uvx` run fetches first)

    @classmethod
    def from_table(cls, name: str, table: Mapping[str, Any]) -> McpServerSettings:
        """A checked table (voice.config_schema.check_mcp_servers); a key it
        leaves out has its default."""
        values: dict[str, Any] = {"name": name}
        for f in fields(cls):
            if f.name in table:
                value = table[f.name]
                if isinstance(value, Mapping):  # env, headers: in name order
                    value = tuple(sorted(value.items()))
                elif isinstance(value, list):
                    value = tuple(value)
                elif f.name in ("timeout_s", "start_timeout_s"):
                    value = float(value)
                values[f.name] = value
        return cls(**values)


@dataclass(frozen=True)
class McpSettings:
    servers: tuple[McpServerSettings, ...] = ()  # in name order: the tool schemas, the request's prefix, stay put


@dataclass(frozen=True)
class Settings:
    """The whole configuration, checked (see the module docstring)."""

    llm: LlmSettings = field(default_factory=LlmSettings)
    conversation: ConversationSettings = field(default_factory=ConversationSettings)
    paths: PathsSettings = field(default_factory=PathsSettings)
    chat: ChatSettings = field(default_factory=ChatSettings)
    audio: AudioSettings = field(default_factory=AudioSettings)
    vad: VadSettings = field(default_factory=VadSettings)
    turn_end: TurnEndSettings = field(default_factory=TurnEndSettings)
    stt: SttSettings = field(default_factory=SttSettings)
    tts: TtsSettings = field(default_factory=TtsSettings)
    tools: ToolsSettings = field(default_factory=ToolsSettings)
    service: ServiceSettings = field(default_factory=ServiceSettings)
    barge_in: BargeInSettings = field(default_factory=BargeInSettings)
    listen: ListenSettings = field(default_factory=ListenSettings)
    record: RecordSettings = field(default_factory=RecordSettings)
    mcp: McpSettings = field(default_factory=McpSettings)

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """Read a loaded, checked config (voice.config.load_config) once."""
        sections: dict[str, Any] = {}
        for f in fields(cls):
            kind = _SECTIONS[f.name]
            table = config.get(f.name, {})
            if kind is McpSettings:
                servers = table.get("servers", {})
                sections[f.name] = McpSettings(tuple(McpServerSettings.from_table(name, servers[name])
                                                     for name in sorted(servers)))
                continue
            values = {k.name: _frozen(table[k.name]) for k in fields(kind) if k.name in table}
            sections[f.name] = kind(**values)
        return cls(**sections)

    @property
    def data_dir(self) -> Path:
        """Where notes go (the XDG data folder)."""
        return data_dir()

    def table(self, section: str) -> dict[str, Any]:
        """A section as its TOML table (lists for tuples): what a saved
        recording's config.toml holds."""
        values = getattr(self, section)
        return {f.name: _plain(getattr(values, f.name)) for f in fields(values) if f.metadata.get("config", True)}


_SECTIONS = {f.name: f.default_factory for f in fields(Settings)}  # type: ignore[misc]


def _frozen(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, Mapping):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value
