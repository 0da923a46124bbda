"""Configuration: the documented defaults (config/voice.toml), the user's
file layered over them, then `VOICE_<SECTION>_<KEY>` environment variables
(for the few keys a unit file needs, e.g. VOICE_LLM_BASE_URL).

Only keys present in the defaults are accepted, each with the defaults'
type and within the ranges and choices of `voice.config_schema`; anything
else fails when the config loads, before anything else starts, with one
line naming where the value came from, the key, the value and what is
allowed. Every value remembers where it came from (`voice config show`).
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voice.config_schema import type_name, validate
from voice.errors import UsageError, as_usage_error
from voice.paths import config_dir, shipped_file
from voice.toml_file import read_toml

ENV_PREFIX = "VOICE_"


def defaults_path() -> Path:
    return shipped_file(__file__, "voice.toml", "config")


def _read(path: Path) -> dict[str, Any]:
    with as_usage_error(ValueError):
        return read_toml(path, "config file")



def _merge(base: dict[str, Any], over: dict[str, Any], where: str, sources: dict[str, str], prefix: str = "") -> None:
    for key, value in over.items():
        name = f"{prefix}{key}"
        if key not in base:
            allowed = ", ".join(f"{prefix}{k}" for k in base)
            raise UsageError(f"{where}: unknown key {name!r} (= {value!r}); allowed: {allowed}")
        default = base[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise UsageError(f"{where}: {name} = {value!r} must be a table")
            if not default:  # an open table (e.g. named commands)
                base[key] = value
                for k in value:
                    sources[f"{name}.{k}"] = where
            else:
                _merge(default, value, where, sources, name + ".")
            continue
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        elif type(value) is not type(default):
            raise UsageError(f"{where}: {name} = {value!r} must be {type_name(default)}")
        elif isinstance(default, list) and default and any(type(v) is not type(default[0]) for v in value):
            raise UsageError(f"{where}: {name} = {value!r} must be a list, each item {type_name(default[0])}")
        base[key] = value
        sources[name] = where


def _env_overrides(config: dict[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """VOICE_LLM_BASE_URL=... -> {"llm": {"base_url": "..."}}; the value is
    read as TOML when the key is not a string (VOICE_VAD_START_SECS=0.2)."""
    over: dict[str, Any] = {}
    for var, raw in env.items():
        if not var.startswith(ENV_PREFIX):
            continue
        section, _, key = var[len(ENV_PREFIX):].lower().partition("_")
        if section not in config or not isinstance(config[section], dict):
            continue  # not a config variable (e.g. VOICE_DEBUG): not ours to judge
        if key not in config[section] or isinstance(config[section][key], dict):
            raise UsageError(f"environment: {var} names no key of [{section}]; allowed: "
                             + ", ".join(f"{ENV_PREFIX}{section.upper()}_{k.upper()}" for k in config[section]
                                         if not isinstance(config[section][k], dict)))
        if isinstance(config[section][key], str):
            value: Any = raw
        else:
            try:
                value = tomllib.loads(f"v = {raw}")["v"]
            except tomllib.TOMLDecodeError:
                raise UsageError(f"environment: {var} = {raw!r} must be {type_name(config[section][key])}") from None
        over.setdefault(section, {})[key] = value
    return over


def load_config_with_sources(path: str | Path | None = None,
                             env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    config = _read(defaults_path())
    sources: dict[str, str] = {}
    user = Path(path) if path else config_dir() / "voice.toml"
    if path or user.exists():
        _merge(config, _read(user), str(user), sources)
    env = os.environ if env is None else env
    over = _env_overrides(config, env)
    for section, values in over.items():
        for key, value in values.items():
            _merge(config, {section: {key: value}}, f"env {ENV_PREFIX}{section.upper()}_{key.upper()}", sources)
    validate(config, sources)
    return config, sources


def override(config: dict[str, Any], sources: dict[str, str], key: str, value: Any, where: str) -> None:
    """A command-line value (e.g. --llm-model) over the loaded config,
    checked by the same rules."""
    section, _, name = key.partition(".")
    _merge(config, {section: {name: value}}, where, sources)
    validate(config, sources)


def load_config(path: str | Path | None = None) -> dict[str, Any]:
    """Defaults, then the user's file (explicit `path`, else the XDG one if
    it exists), then VOICE_* environment overrides."""
    return load_config_with_sources(path)[0]


def _secret(key: str) -> bool:
    """An MCP server's environment values may hold tokens: never shown."""
    parts = key.split(".")
    return len(parts) == 5 and parts[:2] == ["mcp", "servers"] and parts[3] == "env"


def _mcp_url(key: str) -> bool:
    parts = key.split(".")
    return len(parts) == 4 and parts[:2] == ["mcp", "servers"] and parts[3] == "url"


def show(config: dict[str, Any], sources: dict[str, str]) -> str:
    """The effective config as TOML-ish lines, each with where it came from."""
    lines: list[str] = []

    def walk(table: dict[str, Any], prefix: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if scalars or not table:
            lines.append(f"[{prefix[:-1]}]")
            for k, v in scalars.items():
                name = prefix + k
                shown = json.dumps(v, ensure_ascii=False)  # TOML-compatible for strings, numbers, booleans, lists
                if _secret(name):
                    shown = '"(set; not shown)"'
                elif _mcp_url(name) and "?" in v:
                    shown = json.dumps(v.split("?", 1)[0] + "?(query not shown)")
                # The entries of an open table (a server's table) came from where the table did.
                where = sources.get(name) or sources.get(name.rsplit(".", 1)[0]) or sources.get(
                    ".".join(name.split(".")[:3]), "default")
                lines.append(f"{k} = {shown}  # {where}")
            lines.append("")
        for k, v in table.items():
            if isinstance(v, dict):
                walk(v, f"{prefix}{k}.")

    for section, table in config.items():
        walk(table, f"{section}.")
    return "\n".join(lines).rstrip() + "\n"
