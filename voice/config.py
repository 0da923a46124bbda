"""Configuration: the documented defaults (config/voice.toml), the user's
file layered over them, then command-line overrides.

Only keys present in the defaults are accepted, each with the defaults'
type; anything else fails at start with one line naming the key, the value
and what is allowed.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path
from typing import Any

from voice.errors import UsageError
from voice.paths import config_dir

_PACKAGED = Path(__file__).with_name("voice.toml")  # in a wheel
_SOURCE = Path(__file__).resolve().parents[1] / "config" / "voice.toml"  # in a checkout


def defaults_path() -> Path:
    return _PACKAGED if _PACKAGED.exists() else _SOURCE


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}") from None


def _type_name(value: Any) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}.get(
        type(value), type(value).__name__
    )


def _merge(base: dict[str, Any], over: dict[str, Any], where: str, prefix: str = "") -> None:
    for key, value in over.items():
        name = f"{prefix}{key}"
        if key not in base:
            allowed = ", ".join(f"{prefix}{k}" for k in base)
            raise UsageError(f"{where}: unknown key {name!r} (= {value!r}); allowed: {allowed}")
        default = base[key]
        if isinstance(default, dict):
            if not isinstance(value, dict):
                raise UsageError(f"{where}: {name} = {value!r} must be a table")
            if not default:  # an open table (e.g. a list of named commands)
                base[key] = value
            else:
                _merge(default, value, where, name + ".")
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            base[key] = float(value)
        elif type(value) is not type(default):
            raise UsageError(f"{where}: {name} = {value!r} must be {_type_name(default)}")
        else:
            base[key] = value


def load_config(path: str | Path | None = None) -> dict[str, Any]:
    """Defaults, then the user's file (explicit `path`, else the XDG one if it exists)."""
    config = _read(defaults_path())
    user = Path(path) if path else config_dir() / "voice.toml"
    if path or user.exists():
        _merge(config, _read(user), str(user))
    return config


def with_override(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    config = copy.deepcopy(config)
    *parents, leaf = dotted.split(".")
    node = config
    for p in parents:
        node = node[p]
    node[leaf] = value
    return config
