"""The package map of docs/ARCHITECTURE.md holds: imports point one way
(service and cli on top; speech over audio, agent and log; agent over log;
log and audio import nothing else of ours), and the repository stands
alone (nothing points at a file outside it)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEAVES = {"config", "config_schema", "settings", "errors", "paths", "logs", "cli_args", "toml_file"}
ALLOWED = {  # layer -> the layers of ours it may import (besides itself and the leaves)
    "log": set(),
    "audio": set(),
    "agent": {"log"},
    "speech": {"audio", "agent", "log"},
    "surfaces": {"agent"},
    "show": {"log", "audio"},
    "app": {"agent", "log"},
    "service": {"app", "speech", "surfaces", "agent", "audio", "log", "show", "voice"},
    "cli": {"app", "service", "speech", "surfaces", "agent", "audio", "log", "show"},
    "__main__": {"cli"},
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "voice"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "voice"}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == "voice":
            found.add(node.module)
    return found


def test_imports_point_one_way():
    wrong = []
    for path in sorted((ROOT / "voice").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        layer = _layer(module)
        if layer in LEAVES or layer == "voice":
            continue
        for imported in _imports(path):
            target = _layer(imported)
            if target == layer or target in LEAVES:
                continue
            if target not in ALLOWED.get(layer, set()):
                wrong.append(f"{module} imports {imported} ({layer} -> {target})")
    assert not wrong, "imports against the package map (docs/ARCHITECTURE.md):\n" + "\n".join(wrong)


def test_the_event_vocabulary_imports_nothing_of_ours():
    # (#25 split the bodies by family into voice/log/bodies/: the vocabulary
    # is events.py and those, and imports nothing of ours beyond itself.)
    vocabulary = [ROOT / "voice" / "log" / "events.py", *(ROOT / "voice" / "log" / "bodies").glob("*.py")]
    for path in vocabulary:
        assert not {m for m in _imports(path) if not m.startswith("voice.log.bodies")}, path


def test_nothing_points_outside_the_repository():
    """A clone has nothing beside it: every file the project needs is in it."""
    outside = ["shared" + "/"]  # the issue's own check; not spelled out, as this file is searched too
    out = subprocess.run(["git", "grep", "-n", "-I", *(a for p in outside for a in ("-e", p)), "--", ".", ":!.ci"],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr  # 1: nothing found
    assert out.stdout == "", "these lines point outside the repository:\n" + out.stdout


# -- one writer per event type (issue #25) -------------------------------------

# Callers in modules that another change of #25 rewrites: they move to the
# one writer named here when those changes merge (then this dict is emptied).
AWAITING_MERGE: dict[str, set[str]] = {}  # (emptied when #25's changes merged: every writer is one module)


def _body_classes() -> set[str]:
    from voice.log import events

    return {cls.__name__ for cls in events.BODIES.values()}


def _constructed(path: Path, bodies: set[str]) -> set[str]:
    """The body classes a module calls (`X(...)`, `X.ctor(...)`, `ev.X(...)`,
    `ev.X.ctor(...)`), through names it imported from voice.log."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: dict[str, str] = {}  # local name -> body class
    modules: set[str] = set()  # local names of voice.log modules
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("voice.log"):
            for a in node.names:
                if a.name in bodies:
                    names[a.asname or a.name] = a.name
                elif node.module == "voice.log":
                    modules.add(a.asname or a.name)
        elif isinstance(node, ast.Import):
            modules |= {a.asname for a in node.names if a.name.startswith("voice.log.") and a.asname}

    def body_of(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Name):
            return names.get(expr.id)
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in modules:
            return expr.attr if expr.attr in bodies else None
        return None

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            kind = body_of(f) or (body_of(f.value) if isinstance(f, ast.Attribute) else None)
            if kind:
                found.add(kind)
    return found


def test_each_event_type_is_built_in_one_module():
    """Each body is constructed for recording in exactly one module (its
    writer, through `EventStore.record`); every other caller goes through
    that module's writer function."""
    bodies = _body_classes()
    defining = {"voice/log/events.py", *(p.relative_to(ROOT).as_posix()
                                         for p in (ROOT / "voice" / "log" / "bodies").glob("*.py"))}
    builders: dict[str, set[str]] = {}
    for path in sorted((ROOT / "voice").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in defining:
            continue
        for kind in _constructed(path, bodies):
            if rel not in AWAITING_MERGE.get(kind, set()):
                builders.setdefault(kind, set()).add(rel)
    several = {k: sorted(v) for k, v in builders.items() if len(v) > 1}
    assert not several, f"event types built in more than one module: {several}"


def test_the_store_has_one_recording_path():
    from voice.log.store import EventStore

    assert not hasattr(EventStore, "append"), "the untyped EventStore.append is gone: record a body"

# The modules that read the config as a dict: the loader, its rules, and the typed settings it is read into.
CONFIG_READERS = {"voice/config.py", "voice/config_schema.py", "voice/settings.py"}


def _subscripts_of_config(path: Path) -> list[int]:
    """Lines where a name `config` (or an attribute `.config`) is read by key."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Subscript):
            target = node.value
            name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else None
            if name == "config":
                lines.append(node.lineno)
    return lines


def test_nothing_but_the_settings_reads_the_config_by_key():
    """The config is read once into typed settings (voice/settings.py); every
    other module gets the section it needs as attributes."""
    found = []
    for path in sorted((ROOT / "voice").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in CONFIG_READERS:
            continue
        found += [f"{rel}:{n}" for n in _subscripts_of_config(path)]
        found += [f"{rel}: config[" for line in path.read_text(encoding="utf-8").splitlines() if "config[" in line]
    assert not found, "the config read by key outside voice/settings.py:\n" + "\n".join(found)


def _calls(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            f = node.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def test_the_daemon_and_the_replay_are_one_voice_assembly_on_open_app():
    """`voice run` and `voice replay` both open their voice through
    open_voice, which opens the app (provider and log included) through
    open_app; neither opens a provider, a log or the models itself."""
    service = ROOT / "voice" / "service"
    assert "open_app" in _calls(service / "assembly.py")
    for entry in ("daemon.py", "replay.py"):
        calls = _calls(service / entry)
        assert "open_voice" in calls, entry
        assert not calls & {"open_app", "open_provider", "EventStore", "open_store", "load_models",
                            "build_voice_session"}, (entry, calls & {"open_app", "open_provider", "EventStore",
                                                                     "open_store", "load_models", "build_voice_session"})
        assert "nonlocal" not in (service / entry).read_text(encoding="utf-8"), entry


# -- the voice session runs the pipeline and implements Assistant (issue #25) ----

def test_the_voice_session_writes_no_log_rows_and_keeps_no_replay_helpers():
    """Speech rows reach the log through one observer (speech/speech_log.py),
    not `session.log_*`; what only a replay needs lives in the replay."""
    from voice.speech.session import VoiceSession

    assert not [n for n in vars(VoiceSession) if n.startswith("log_") or n in ("late", "speech_span")]
    tree = ast.parse((ROOT / "voice" / "speech" / "session.py").read_text(encoding="utf-8"))
    writes = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute)
              and n.attr in ("record", "start_turn", "end_turn")]
    assert not writes, f"voice/speech/session.py writes to the log itself at lines {writes}"


# Modules allowed over the line limit, each with why (none today).
LONG_MODULES: dict[str, str] = {}


def test_no_module_is_over_450_lines_unless_it_says_why():
    long = {path.relative_to(ROOT).as_posix(): n for path in (ROOT / "voice").rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 450}
    assert set(long) <= set(LONG_MODULES), f"over 450 lines: {long}"


def test_signals_are_taken_in_one_place():
    """#39: the signal-handling loop was written four times (daemon, acp,
    chat, control); every entry point now ends through
    voice.service.signals.cancel_on_signal."""
    writers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "voice").rglob("*.py")
                     if "open_signal_receiver" in p.read_text(encoding="utf-8"))
    assert writers == ["voice/service/signals.py"], writers
