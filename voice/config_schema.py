"""What each config value may be: types come from the documented defaults
(config/voice.toml); this module adds the ranges and enumerations, so a
wrong value is refused when the config loads, with what is allowed, and
nothing (models, audio, the log) has started yet.

A key without a rule here is still checked against its default's type (and
a list against its default's element type); a rule narrows that.
"""

from __future__ import annotations

import importlib.util
import json
import re
from urllib.parse import urlsplit
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from voice.errors import UsageError


@dataclass(frozen=True)
class Rule:
    allowed: str  # completes "must be ...": what the error says is allowed
    ok: Callable[[Any], bool]


def one_of(*values: str) -> Rule:
    return Rule("one of " + ", ".join(json.dumps(v) for v in values), lambda v: v in values)


def number(lo: float, hi: float | None = None, *, above: bool = False) -> Rule:
    """lo < v (above) or lo <= v, and v <= hi."""
    low = f"above {lo:g}" if above else f"at least {lo:g}"
    text = f"{low} and at most {hi:g}" if hi is not None else low
    return Rule(text, lambda v: (v > lo if above else v >= lo) and (hi is None or v <= hi))


def _is_url(v: str) -> bool:
    return re.fullmatch(r"https?://[^\s/]+(/\S*)?", v) is not None


URL = Rule('an http(s) URL such as "http://127.0.0.1:11434/v1"', _is_url)
NON_EMPTY = Rule("a non-empty string", lambda v: bool(v.strip()))
ARGV = Rule('a non-empty list of strings: the program and its arguments, no shell '
            '(e.g. ["rsync", "-a", "/home/me/docs/", "/media/usb/docs/"])',
            lambda v: isinstance(v, list) and bool(v) and all(isinstance(a, str) and a for a in v))
# An approval policy (voice.settings.Approve): an MCP server's `approve`, the configured commands'.
APPROVE = one_of("destructive", "writes", "never")
PHRASES = Rule("a list of non-empty phrases", lambda v: all(w.strip() for w in v))


def wake_words() -> list[str]:
    """The wake-word models pymicro-wakeword ships, found without importing it
    (that loads TensorFlow Lite): each needs its .json and .tflite."""
    spec = importlib.util.find_spec("pymicro_wakeword")
    if spec is None or not spec.submodule_search_locations:
        return []
    models = Path(list(spec.submodule_search_locations)[0]) / "models"
    return sorted(p.stem for p in models.glob("*.json") if p.with_suffix(".tflite").is_file())


def _wake_word() -> Rule:
    names = wake_words()
    return Rule("one of " + ", ".join(names) if names else "a wake word model (pymicro-wakeword is not installed)",
                lambda v: v in names)


RULES: dict[str, Rule | Callable[[], Rule]] = {
    "llm.provider": Rule('"auto", "openai", an http(s) URL or "scripted:FILE"',
                         lambda v: v in ("auto", "openai") or _is_url(v) or (v.startswith("scripted:") and len(v) > 9)),
    "llm.base_url": URL,
    "llm.model": NON_EMPTY,
    "llm.api_key_env": Rule("an environment variable name (letters, digits, _)",
                            lambda v: re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v) is not None),
    "llm.timeout_s": number(0, 600, above=True),
    "llm.retries": number(0, 10),
    "llm.retry_backoff_s": number(0, 60),
    "llm.max_steps": number(1, 100),
    "llm.context_tokens": number(256, 1048576),
    "llm.reply_tokens": number(16, 524288),
    "conversation.idle_gap_s": number(10, 604800),
    "conversation.new_phrases": PHRASES,
    "vad.confidence": number(0, 1, above=True),
    "vad.start_secs": number(0, 2, above=True),
    "vad.stop_secs": number(0, 10, above=True),
    "vad.min_volume": number(0, 1),
    "stt.model": one_of("base", "tiny.en"),
    "stt.threads": number(1, 64),
    "stt.base_url": Rule('"" (recognise locally) or an http(s) URL such as "http://127.0.0.1:8000/v1"',
                         lambda v: v == "" or _is_url(v)),
    "stt.remote_model": NON_EMPTY,
    "stt.timeout_s": number(0, 120, above=True),
    "turn_end.speculate_s": number(0, 2),
    "turn_end.end_s": number(0, 10),
    "tools.kill_after_s": number(0, 300, above=True),
    "tools.approval_timeout_s": number(1, 600),
    "tools.commands.*": ARGV,
    "tools.approve": APPROVE,
    "tools.approve_commands.*": APPROVE,
    "tools.command_env": Rule("a list of environment variable names (letters, digits, _)",
                              lambda v: all(isinstance(n, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n)
                                            for n in v)),
    "service.shutdown_s": number(0, 300, above=True),
    "service.socket": Rule('"" (the default place) or an absolute path', lambda v: v == "" or v.startswith("/")),
    "barge_in.confirm_ms": number(0, 10000, above=True),
    "barge_in.resume_ms": number(0, 60000, above=True),
    "barge_in.stop_phrases": PHRASES,
    "listen.mode": one_of("wake", "open"),
    "listen.wake_word": _wake_word,
    "listen.window_s": number(0, 3600),
    "record.ring_s": number(0, 3600),
    "mcp.servers.*": Rule("a table of the server's keys (see config/voice.toml, [mcp.servers])",
                          lambda v: isinstance(v, dict)),
}


def type_name(value: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(value), type(value).__name__)


def _shown(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)  # TOML-like: "text", 1, true, [..]


def validate(config: dict[str, Any], sources: dict[str, str]) -> None:
    """Every value against its rule; the first one that breaks is a
    UsageError naming where it came from, the key, the value and what is
    allowed."""
    for key, value in _values(config):
        rule = RULES.get(key) or RULES.get(key.rsplit(".", 1)[0] + ".*")
        if rule is None:
            continue
        rule = rule() if not isinstance(rule, Rule) else rule
        if not rule.ok(value):
            raise UsageError(f"{sources.get(key, 'default')}: {key} = {_shown(value)} must be {rule.allowed}")
    _cross_keys(config, sources)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SERVER_NAME = re.compile(r"(?!.*__)[A-Za-z0-9][A-Za-z0-9_-]{0,31}")  # no "__": it separates server and tool
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) and x for x in v)


def _string_table(v: Any, keys: re.Pattern[str], values: Callable[[Any], bool]) -> bool:
    return isinstance(v, dict) and all(keys.fullmatch(k) and values(x) for k, x in v.items())


# The keys of one [mcp.servers.NAME] table (voice.settings.McpServerSettings holds their defaults).
MCP_SERVER_KEYS: dict[str, Rule] = {
    "command": Rule('a program to run, e.g. "uvx" or "/usr/bin/node" (a stdio server)',
                    lambda v: isinstance(v, str)),
    "args": Rule("a list of non-empty strings (the program's arguments)", _strings),
    "env": Rule('a table of environment variables for the server, NAME = "value"',
                lambda v: _string_table(v, _ENV_NAME, lambda x: isinstance(x, str))),
    "cwd": Rule('"" or an absolute path', lambda v: isinstance(v, str) and (v == "" or v.startswith("/"))),
    "url": Rule('"" or an http(s) URL of a Streamable HTTP endpoint, e.g. "http://homeassistant.local:8123/api/mcp"',
                lambda v: isinstance(v, str) and (v == "" or _is_url(v))),
    "headers": Rule('a table of HTTP headers, each naming the environment variable that holds its value, '
                    'e.g. { Authorization = "HA_AUTHORIZATION" }',
                    lambda v: _string_table(v, _HEADER_NAME, lambda x: isinstance(x, str)
                                            and _ENV_NAME.fullmatch(x) is not None)),
    "allow": Rule("a list of the server's tool names to offer (empty: all)", _strings),
    "deny": Rule("a list of the server's tool names never to offer", _strings),
    "trust_annotations": Rule("true/false", lambda v: isinstance(v, bool)),
    "read_tools": Rule("a list of the server's tool names that only read", _strings),
    "timeout_s": Rule("a number above 0 and at most 3600",
                      lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 3600),
    "approve": APPROVE,
    "max_result_chars": Rule("an integer from 200 to 1000000",
                             lambda v: isinstance(v, int) and not isinstance(v, bool) and 200 <= v <= 1000000),
    "enabled": Rule("true/false", lambda v: isinstance(v, bool)),
    "start_timeout_s": Rule("a number above 0 and at most 600",
                            lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 600),
}
_SECRET_KEYS = ("env",)  # their values may hold tokens: an error names the keys only


def check_mcp_servers(config: dict[str, Any], sources: dict[str, str]) -> None:
    """Each [mcp.servers.NAME]: its name, every key and value, and exactly
    one of `command` (stdio) or `url` (Streamable HTTP)."""
    servers = config.get("mcp", {}).get("servers", {})
    for name, table in servers.items():
        where = sources.get(f"mcp.servers.{name}", "default")
        if not _SERVER_NAME.fullmatch(name):
            raise UsageError(f"{where}: [mcp.servers.{name}]: a server's name must be 1 to 32 letters, digits, "
                             "_ or -, starting with a letter or digit, without \"__\" (it prefixes its tools' names)")
        for key, value in table.items():
            rule = MCP_SERVER_KEYS.get(key)
            shown = _shown(value) if key not in _SECRET_KEYS and not isinstance(value, dict) else (
                "{" + ", ".join(f"{k} = ..." for k in value) + "}" if isinstance(value, dict) else "...")
            if rule is None:
                raise UsageError(f"{where}: unknown key 'mcp.servers.{name}.{key}' (= {shown}); allowed: "
                                 + ", ".join(MCP_SERVER_KEYS))
            if not rule.ok(value):
                raise UsageError(f"{where}: mcp.servers.{name}.{key} = {shown} must be {rule.allowed}")
        command, url = str(table.get("command", "")).strip(), table.get("url")
        if bool(command) == bool(url):
            raise UsageError(f"{where}: [mcp.servers.{name}] needs exactly one of command (a stdio server) or url "
                             "(a Streamable HTTP server)")
        if url and (table.get("args") or table.get("env") or table.get("cwd")):
            raise UsageError(f"{where}: [mcp.servers.{name}] has a url: args, env and cwd are for a stdio server "
                             "(command); remove them")
        if command and table.get("headers"):
            raise UsageError(f"{where}: [mcp.servers.{name}] has a command: headers are for a Streamable HTTP "
                             "server (url); remove them")
        if url and (urlsplit(url).username or urlsplit(url).password):
            raise UsageError(f"{where}: mcp.servers.{name}.url holds a user name or password: put the credentials "
                             "in an environment variable and name it in headers (e.g. Authorization)")


def _cross_keys(config: dict[str, Any], sources: dict[str, str]) -> None:
    """Rules between keys: the reply's reserve must leave the conversation
    at least half the context; each MCP server's table; a command's own
    approval names a configured command."""
    check_mcp_servers(config, sources)
    tools = config.get("tools", {})
    for name in tools.get("approve_commands", {}):
        if name not in tools.get("commands", {}):
            key = f"tools.approve_commands.{name}"
            configured = ", ".join(sorted(tools.get("commands", {}))) or "none are configured"
            raise UsageError(f"{sources.get(key, 'default')}: {key} names no command of [tools.commands] "
                             f"(configured: {configured}): add the command or remove the line")
    llm = config.get("llm", {})
    reply, context = llm.get("reply_tokens"), llm.get("context_tokens")
    if isinstance(reply, int) and isinstance(context, int) and reply * 2 > context:
        where = sources.get("llm.reply_tokens") or sources.get("llm.context_tokens", "default")
        raise UsageError(f"{where}: llm.reply_tokens = {reply} must be at most half of llm.context_tokens = "
                         f"{context}: lower it, or raise context_tokens")


def _values(table: dict[str, Any], prefix: str = ""):
    """(dotted key, value) of every value; the entries of an open table
    (a rule named "table.*") are values whatever their type."""
    open_table = prefix + "*" in RULES
    for k, v in table.items():
        if isinstance(v, dict) and not open_table:
            yield from _values(v, f"{prefix}{k}.")
        else:
            yield prefix + k, v
