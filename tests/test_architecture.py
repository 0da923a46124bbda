"""The package map of docs/ARCHITECTURE.md holds: imports point one way
(service and cli on top; speech over audio, agent and log; agent over log;
log and audio import nothing else of ours), and the repository stands
alone (nothing points at a file outside it)."""

from __future__ import annotations

import ast
import functools
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


# -- parts with whole contracts (issue #39) ----------------------------------
# No line cap: a cap made the loop one class spread over three files (mixins
# calling names only the loop defined). What is checked instead is the design:
# a class states what it uses.

_OBJECT_NAMES = set(dir(object))
_OPEN_BASES = {"object", "Protocol", "Generic", "ABC"}  # bases that define nothing a subclass's methods use


def _classes() -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Every class in voice/, by name: (module path, its definition)."""
    found: dict[str, list[tuple[str, ast.ClassDef]]] = {}
    for path in sorted((ROOT / "voice").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append((path.relative_to(ROOT).as_posix(), node))
    return found


def _base_names(cls: ast.ClassDef) -> list[str]:
    names = []
    for b in cls.bases:
        b = b.value if isinstance(b, ast.Subscript) else b
        names.append(b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "?")
    return names


def _class_defines(cls: ast.ClassDef) -> set[str]:
    """What a class defines itself: methods, class attributes and
    annotations, and what its methods assign to `self.X`."""
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for node in ast.walk(cls):
        if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name) and node.value.id == "self"):
            names.add(node.attr)
    return names


def _class_uses(cls: ast.ClassDef) -> dict[str, int]:
    """The `self.X` names a class's methods read or call, with a line each."""
    return {node.attr: node.lineno for node in ast.walk(cls)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
            and isinstance(node.value, ast.Name) and node.value.id == "self"}


def _undefined(cls: ast.ClassDef, classes: dict[str, list[tuple[str, ast.ClassDef]]]) -> dict[str, int] | None:
    """The `self.X` names `cls` uses that neither it nor its bases define;
    None when a base is not ours (it may define anything)."""
    defined = set(_class_defines(cls))
    for base in _base_names(cls):
        if base in _OPEN_BASES:
            continue
        if base not in classes or len(classes[base]) != 1:
            return None
        inherited = _undefined(classes[base][0][1], classes)
        if inherited is None:
            return None
        defined |= _class_defines(classes[base][0][1]) | set(_class_uses(classes[base][0][1]))
    return {n: line for n, line in _class_uses(cls).items()
            if n not in defined and n not in _OBJECT_NAMES and not (n.startswith("__") and n.endswith("__"))}


def test_no_class_inherits_from_one_that_uses_names_it_does_not_define():
    """A base class of ours is a whole part: its methods use only what it
    defines (or declares, as `ShowsText` declares `_units`), never names a
    subclass happens to have: no mixins."""
    classes = _classes()
    found = []
    for name, defs in classes.items():
        for module, cls in defs:
            for base in _base_names(cls):
                if base in _OPEN_BASES or base not in classes or len(classes[base]) != 1:
                    continue
                base_module, base_cls = classes[base][0]
                missing = _undefined(base_cls, classes)
                if missing:
                    found.append(f"{module}: {name} inherits from {base} ({base_module}), whose methods use "
                                 f"{sorted(missing)} it does not define")
    assert not found, "\n".join(found)


def test_the_agent_loop_composes_parts_each_with_its_own_state():
    """#39: `AgentLoop` inherits nothing; its questions and tool calls are
    parts it builds and holds, each given what it uses in its constructor."""
    from voice.agent.asking import Questions
    from voice.agent.calls import ToolCalls
    from voice.agent.loop import AgentLoop

    assert AgentLoop.__bases__ == (object,), AgentLoop.__bases__
    assert Questions.__bases__ == (object,) and ToolCalls.__bases__ == (object,)
    classes = _classes()
    for module in ("voice/agent/loop.py", "voice/agent/calls.py", "voice/agent/asking.py"):
        for _, cls in (d for defs in classes.values() for d in defs if d[0] == module):
            missing = _undefined(cls, classes)
            assert missing == {}, f"{module}: {cls.name} uses self.{sorted(missing or {})}, which it does not define"


# The things a capability was probed on: a surface, a provider, an audio device, an announcer.
_PROBED = {"surface", "provider", "device", "inner", "announce"}


def _probes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and node.args):
            target = node.args[0]
            name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
            if name in _PROBED:
                where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
                found.append(f"{where}:{node.lineno}: {node.func.id}({name}, ...)")
    return found


def test_no_capability_is_probed_by_name():
    """#39: what a surface, a provider or a device can do is declared
    (voice.agent.surface's capability protocols, CountsTokens and
    ChecksReachable beside Provider, AudioDevice) and asked with
    isinstance: a misspelt getattr silently turned a feature off."""
    found = [line for path in sorted((ROOT / "voice").rglob("*.py")) for line in _probes(path)]
    assert not found, "capabilities probed by name:\n" + "\n".join(found)


def test_the_probe_check_sees_a_probe(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text('show = getattr(self.surface, "tool_state", None)\nok = getattr(body, "route", None)\n',
                     encoding="utf-8")
    assert _probes(probe) == [f"{probe}:1: getattr(surface, ...)"]


def test_tool_services_are_named_and_typed():
    """#39: the loop and the session reach the timers, the approvals and the
    MCP servers as named fields of ToolServices, and a tool its timers as a
    field of its ToolContext, not through a string-keyed dict (a misspelt
    key was a feature silently off)."""
    from dataclasses import fields

    from voice.agent.loop_settings import ToolEnv, ToolServices
    from voice.agent.timer_service import TimerService
    from voice.agent.tools.base import ToolContext

    assert isinstance(ToolEnv().services, ToolServices) and not isinstance(ToolEnv().services, dict)
    assert {f.name for f in fields(ToolServices)} == {"timers", "approvals", "mcp"}
    # a tool is given the one service tools use, by name
    assert {f.name: f.type for f in fields(ToolContext)}["timers"] == "TimerService | None"
    assert "services" not in {f.name for f in fields(ToolContext)}
    timers = TimerService.__new__(TimerService)
    assert ToolEnv(services=ToolServices(timers=timers)).context("c", 1, "call_1_0_0_0").timers is timers
    found = [f"{path.relative_to(ROOT).as_posix()}:{n}" for path in sorted((ROOT / "voice").rglob("*.py"))
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "services.get(" in line or "services[" in line]
    assert not found, "services looked up by key:\n" + "\n".join(found)


def test_signals_are_taken_in_one_place():
    """#39: the signal-handling loop was written four times (daemon, acp,
    chat, control); every entry point now ends through
    voice.service.signals.cancel_on_signal."""
    writers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "voice").rglob("*.py")
                     if "open_signal_receiver" in p.read_text(encoding="utf-8"))
    assert writers == ["voice/service/signals.py"], writers


# -- every import from the name's home (issue #39) -----------------------------

def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@functools.cache
def _module_path(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _defined(path: Path) -> frozenset[str]:
    """The names a module defines itself at its top level (def, class, an
    assignment), in any if/try/with block there; names it imports are not
    its own."""
    names: set[str] = set()

    def targets(node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, (ast.Tuple, ast.List)):
            for elt in node.elts:
                targets(elt)
        elif isinstance(node, ast.Starred):
            targets(node.value)

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    targets(t)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets(node.target)
            for field in ("body", "orelse", "finalbody"):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    walk(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                walk(handler.body)

    walk(ast.parse(path.read_text(encoding="utf-8")).body)
    return frozenset(names)


def _voice_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """Every import of ours a module makes, wherever it stands (top level,
    under TYPE_CHECKING, inside a function): (line, module, name), name None
    for `import voice.x`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "voice"]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] == "voice":
                found += [(node.lineno, node.module, a.name) for a in node.names]
    return found


def _voice_modules() -> list[Path]:
    return sorted((ROOT / "voice").rglob("*.py"))


# The one module that stands for others: the event vocabulary is imported
# from voice.log.events (docs/EVENTS.md), its bodies written by family in
# voice/log/bodies/. Nothing else gives out names it did not define.
VOCABULARY = ("voice.log.events", ROOT / "voice" / "log" / "bodies")


def _defined_by(module: str, home: Path) -> frozenset[str]:
    names = _defined(home)
    if module == VOCABULARY[0]:
        names |= {n for family in VOCABULARY[1].glob("*.py") for n in _defined(family)}
    return names


def _attributes_from_elsewhere(path: Path) -> list[str]:
    """`m.N` on a module of ours imported as `m`, where that module does not
    define N (the same re-export, reached through the module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules: dict[str, str] = {}  # local name -> module of ours
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "voice":
            modules |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names
                        if _module_path(f"{node.module}.{a.name}") is not None}
        elif isinstance(node, ast.Import):
            modules |= {a.asname: a.name for a in node.names if a.name.split(".")[0] == "voice" and a.asname}
    wrong = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            module = modules[node.value.id]
            home = _module_path(module)
            if home and _module_path(f"{module}.{node.attr}") is None and node.attr not in _defined_by(module, home):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}, "
                             f"which {module} does not define")
    return wrong


def test_every_name_is_imported_from_the_module_that_defines_it():
    """#39: no re-export shims. A name comes from its home module (where it
    is a def, a class or an assignment), or is a submodule of the package
    named; never from a module that itself imported it. The tests and the
    benchmarks import from the homes too."""
    wrong = []
    for path in [*_voice_modules(), *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "benchmarks").rglob("*.py"))]:
        for line, module, name in _voice_imports(path):
            if name is None or _module_path(f"{module}.{name}") is not None:
                continue  # a module, imported as one
            home = _module_path(module)
            if home is None:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {module} is not a module of ours")
            elif name == "*" or name not in _defined_by(module, home):
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {name} from {module}, which does not define it")
        wrong += _attributes_from_elsewhere(path)
    assert not wrong, "imports from a module that is not the name's home:\n" + "\n".join(wrong)


def test_no_private_name_is_imported_across_modules():
    """#39: a `_name` is its module's own; one that another module needs is
    public in its home."""
    wrong = [f"{path.relative_to(ROOT)}:{line}: {name} from {module}"
             for path in _voice_modules() for line, module, name in _voice_imports(path)
             if name is not None and name.startswith("_") and _module_path(f"{module}.{name}") is None]
    assert not wrong, "private names imported from another module:\n" + "\n".join(wrong)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports, counting imports under
    TYPE_CHECKING and inside functions (a circle there is still a circle)."""
    graph: dict[str, set[str]] = {}
    for path in _voice_modules():
        module = _module_name(path)
        edges = graph.setdefault(module, set())
        for _, imported, name in _voice_imports(path):
            if name is not None and _module_path(f"{imported}.{name}") is not None:
                imported = f"{imported}.{name}"
            if imported != module:
                edges.add(imported)
    return graph


def test_no_import_circles():
    """#39: imports form no circle, type-only and function-local ones
    included: each module can be read knowing only what it imports."""
    graph = _import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    assert not circles, "modules that import each other (directly or round a circle):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_production_takes_the_typed_settings_only():
    """#39: no signature takes "`Settings | Mapping`, as tests give one": a
    test builds the typed value (`Settings.from_config`)."""
    found = [f"{p.relative_to(ROOT)}:{n}" for p in _voice_modules()
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if "Settings | Mapping" in line or "TurnStart | dict" in line]
    assert not found, "signatures that take a dict beside the typed value:\n" + "\n".join(found)


# -- construction in dependency order (issue #39.4) ----------------------------

def _function(path: Path, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return next(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name)


def _forward_references(function: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """Lambdas and nested functions in `function` that use a local name it
    assigns only further down: a part handed out before it exists."""
    first: dict[str, int] = {}  # local name -> the line it is first assigned on
    for node in ast.walk(function):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign, ast.NamedExpr)):
            targets = [node.target]
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.withitem)):
            targets = [node.target if not isinstance(node, ast.withitem) else node.optional_vars]
        for target in targets:
            for name in ast.walk(target) if target is not None else ():
                if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store):
                    first[name.id] = min(first.get(name.id, name.lineno), name.lineno)
    found = []
    for node in ast.walk(function):
        if node is function or not isinstance(node, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        found += [f"line {node.lineno}: uses {name}, made on line {first[name]}"
                  for name in sorted(used) if first.get(name, 0) > node.lineno]
    return found


def _wiring_after_construction(function: ast.FunctionDef | ast.AsyncFunctionDef, allowed: set[tuple[str, str]]) -> list[str]:
    """Attributes set on a part after it was made (`part.x = ...`), and
    calls of a `wire` method, other than the declared hooks in `allowed`."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and (target.value.id, target.attr) not in allowed:
                    found.append(f"line {node.lineno}: {target.value.id}.{target.attr} = ...")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wire":
            found.append(f"line {node.lineno}: .wire(...)")
    return sorted(found, key=lambda line: int(line.split(":")[0].removeprefix("line ")))


def test_the_voice_session_is_built_in_dependency_order():
    """#39.4: each part of a voice session is made after the parts it needs
    and takes them in its constructor. No lambda hands out a part not yet
    made (`lambda: agent.conversation` before the agent), no session is
    wired after it was made; where the data go round (the person's words to
    the agent, its sentences back through the pipeline) a stream cuts the
    loop. The one hook set after construction is the agent loop's declared
    `before_turn_end` (the barge-in controller needs the agent, and the
    agent calls it as a turn ends)."""
    builder = _function(ROOT / "voice" / "speech" / "builder.py", "build_voice_session")
    assert not _forward_references(builder), _forward_references(builder)
    late = _wiring_after_construction(builder, allowed={("agent", "before_turn_end")})
    assert not late, f"build_voice_session sets parts up after making them: {late}"
    from voice.speech.session import VoiceSession

    assert "wire" not in vars(VoiceSession)


def test_the_dependency_order_check_sees_a_forward_lambda(tmp_path):
    source = tmp_path / "build.py"
    source.write_text("def build(store):\n    log = Log(store, conversation=lambda: agent.conversation)\n"
                      "    agent = Agent(log)\n    session = Session()\n    session.wire(agent)\n"
                      "    agent.hook = log.write\n    return session\n", encoding="utf-8")
    function = _function(source, "build")
    assert _forward_references(function) == ["line 2: uses agent, made on line 3"]
    assert _wiring_after_construction(function, allowed=set()) == ["line 5: .wire(...)", "line 6: agent.hook = ..."]


def _outer_names(annotation: ast.expr) -> list[str]:
    """The types an annotation names at its top (`A | None`: A and None;
    `Callable[[int], None]`: Callable)."""
    if isinstance(annotation, ast.BinOp):
        return _outer_names(annotation.left) + _outer_names(annotation.right)
    if isinstance(annotation, ast.Subscript):
        return _outer_names(annotation.value)
    if isinstance(annotation, ast.Attribute):
        return [annotation.attr]
    if isinstance(annotation, ast.Name):
        return [annotation.id]
    return [repr(getattr(annotation, "value", annotation))]


def test_the_listener_takes_whole_parts_not_their_settings():
    """#39.4: the ListenProcessor runs the listener's parts in order; each
    part (the Listener, VoiceActivity, Addressing, TurnEndTracker, the
    barge-in controller, the speculation) is made by the builder with its
    own settings and handed in whole. So its constructor takes no settings,
    numbers, flags or optional collaborators (the 14 parameters of before:
    start_secs, preroll_s, stt, turn_end settings, stop_phrases,
    report_ignored, wake, gate, ...), and makes none of the models itself."""
    tree = ast.parse((ROOT / "voice" / "speech" / "pipeline.py").read_text(encoding="utf-8"))
    listen = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "ListenProcessor")
    init = next(n for n in listen.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    arguments = init.args.args[1:] + init.args.kwonlyargs
    settings = [a.arg for a in arguments if a.annotation is None or any(
        name in {"float", "int", "bool", "str", "tuple", "None"} or name.endswith("Settings")
        for name in _outer_names(a.annotation))]
    assert not settings, f"ListenProcessor takes settings or values a part owns: {settings}"
    assert not init.args.defaults and not [d for d in init.args.kw_defaults if d is not None], \
        "ListenProcessor has optional collaborators: a part it may lack is a part of its own, handed in"
    made = {n.func.id for n in ast.walk(init) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not made & {"Listener", "TurnEndTracker", "VadGate", "OnsetDetector", "VoiceActivity", "Addressing",
                       "WakeWordDetector", "ListenGate"}, made


def test_open_voice_takes_its_options_grouped():
    """#39.4: `open_voice(settings, device, options)`: the choices grouped by
    what they are about (VoiceOptions: the speech models, what the session
    keeps, where the app keeps its state), not sixteen loose keywords and
    **app_options passed on unread."""
    function = _function(ROOT / "voice" / "service" / "assembly.py", "open_voice")
    args = function.args
    assert args.kwarg is None and not args.kwonlyargs, "open_voice takes loose keywords"
    assert [a.arg for a in args.args] == ["settings", "device", "options"]


def test_a_command_with_no_mcp_server_does_not_import_the_mcp_sdk(tmp_path):
    """The MCP SDK is 0.9 s of every `voice` command's start (#37): the app,
    the agent loop, the ACP server and doctor import it only for a server to
    run. Seen from the outside: `voice chat` and `voice doctor` under
    `python -X importtime`, with no MCP server configured."""
    import os
    import sys

    script = tmp_path / "reply.toml"
    script.write_text('[[reply]]\ntext = "Hello."\n')
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_STATE_HOME": str(tmp_path / "state"),
           "HF_HUB_OFFLINE": "1"}
    for args in (["chat", "--db", str(tmp_path / "ev.db"), "--new"], ["doctor", "--no-load"]):
        run = subprocess.run([sys.executable, "-X", "importtime", "-m", "voice", *args, "--llm", f"scripted:{script}"],
                             cwd=ROOT, env=env, input="hello\n", capture_output=True, text=True, timeout=60)
        imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
        assert "voice.cli" in imported, run.stderr[-2000:]
        sdk = sorted(m for m in imported if m == "mcp" or m.startswith("mcp."))
        assert not sdk, f"voice {args[0]} imported the MCP SDK with no server configured: {sdk[:5]}"
