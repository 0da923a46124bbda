"""docs/EVENTS.md is the table of every event type: its body, its fields
and the modules that write it. This keeps it from drifting from
voice/log/events.py: a type added, a field renamed or a new writer without
its row fails here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from voice.log import events as ev

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "EVENTS.md"
DURABLE_MARK = "⚓"
# Written through the store's own method, which builds the body.
VIA = {ev.TurnStart: "start_turn(", ev.TurnEnd: "end_turn("}


def rows() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    section = DOC.read_text()  # the whole page is the table's home
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        kind = re.fullmatch(rf"`([^`]+)`( {DURABLE_MARK})?", cells[0])
        assert kind, f"docs/EVENTS.md: a row's first cell is not a `type`: {line}"
        assert kind[1] not in found, f"docs/EVENTS.md: {kind[1]} has two rows"
        found[kind[1]] = [cells[0], *cells[1:]]
    return found


def field_entry(f: dataclasses.Field) -> str:
    if f.metadata.get("optional"):  # "?": written only with a value, so "| None" goes without saying
        return f"{f.name}?: {str(f.type).removesuffix(' | None')}"
    return f"{f.name}: {f.type}"


def code(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_every_event_type_has_a_row():
    assert set(rows()) == set(ev.EVENT_TYPES), "docs/EVENTS.md must have one row per type in voice/log/events.py"


@pytest.mark.parametrize("type_", sorted(ev.EVENT_TYPES))
def test_the_row_says_what_the_body_is(type_):
    row = rows().get(type_)
    assert row is not None, f"docs/EVENTS.md has no row for {type_}"
    first, body, fields, _writers, meaning = row
    cls = ev.BODIES[type_]
    assert code(body) == [cls.__name__]
    assert (DURABLE_MARK in first) == cls.DURABLE, f"{type_}: mark it {DURABLE_MARK} exactly when it is durable"
    assert code(fields) == [field_entry(f) for f in dataclasses.fields(cls)], f"{type_}: the fields of {cls.__name__}"
    assert meaning


def _source(path: str) -> str:
    return (ROOT / path).read_text()


@pytest.mark.parametrize("type_", sorted(ev.EVENT_TYPES))
def test_the_writers_named_write_it(type_):
    cls = ev.BODIES[type_]
    constant = next(k for k, v in vars(ev).items() if k.isupper() and v == type_)
    writers = code(rows()[type_][3])
    assert writers, f"{type_}: name its writer"
    for path in writers:
        assert (ROOT / path).is_file(), f"{type_}: no module {path}"
        text = _source(path)
        mentions = [rf"\b{cls.__name__}\b", rf"\bev\.{constant}\b"] + ([re.escape(VIA[cls])] if cls in VIA else [])
        assert any(re.search(m, text) for m in mentions), f"{path} does not write {type_}"


def builds(text: str, cls: type[ev.Body]) -> bool:
    """Whether module text calls the body's constructor (or a classmethod of
    it), through `ev.` or a name imported from voice.log.events."""
    call = rf"{cls.__name__}(\.\w+)?\("
    if re.search(rf"\bev\.{call}", text):
        return True
    imports = re.findall(r"from voice\.log\.events import (\([^)]*\)|[^\n]*)", text)
    imported = set(re.findall(r"\w+", " ".join(imports)))
    return cls.__name__ in imported and re.search(rf"(?<![\w.]){call}", text) is not None


def test_every_module_that_builds_a_body_is_named_its_writer():
    named = {t: set(code(r[3])) for t, r in rows().items()}
    for path in sorted((ROOT / "voice").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "voice/log/events.py":
            continue
        text = path.read_text()
        for type_, cls in ev.BODIES.items():
            if rel == "voice/log/store.py" and cls in VIA:
                continue  # built for the callers of start_turn / end_turn, who are named
            if builds(text, cls):
                assert rel in named[type_], f"{rel} builds {cls.__name__}: name it as a writer of {type_}"
