"""Reading a TOML file a person gave (the config, a replay scenario, a
scripted-reply file): whatever is wrong is one line that names the file,
the problem and the fix."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The file's tables; ValueError with one line otherwise. `what` names
    the file in that line ("config file", "scenario", ...)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {path} is a directory: give the path of a TOML file") from None
    except NotADirectoryError:
        raise ValueError(f"{what} {path}: a part of the path before the file name is a file, "
                         "not a directory") from None
    except PermissionError:
        raise ValueError(f"{what} {path} cannot be read (permission denied): "
                         f"chmod u+r {path}, or give another file") from None
    except OSError as exc:
        raise ValueError(f"{what} {path} cannot be read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} {path} is not valid TOML: {exc}") from None
