"""What every body is (voice.log.events has the whole story): a frozen
dataclass whose fields are a payload's keys, registered by its `TYPE`;
`optional()` fields are written only when given."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Self

# -- payload values that are plain JSON ---------------------------------------

Route = dict[str, Any]  # {"provider", "model", "base_url"}: where a model request went
ContentBlock = dict[str, Any]  # {"type": "text" | "reasoning", "text"}
TimedDelta = list[Any]  # [offset_ms, kind, data]: one delta of the provider stream as it came
OpenAIToolCall = dict[str, Any]  # {"id", "type": "function", "function": {"name", "arguments"}}

_OPTIONAL = "optional"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()  # an optional field its writer did not give (constructors take it too)


def optional(default: Any = None) -> Any:
    """A field whose key is written only when its writer gives it (null
    included); not given, or absent from a row read back, it holds
    `default`."""
    return field(default=UNSET, metadata={_OPTIONAL: True, "absent": default})


def blocks_text(content: list[ContentBlock]) -> str:
    """The text of content blocks (reasoning left out)."""
    return "".join(b.get("text", "") for b in content if b.get("type") == "text")


# -- bodies --------------------------------------------------------------------

BODIES: dict[str, type[Body]] = {}


@dataclass(frozen=True, kw_only=True)
class Body:
    """A payload with its type. Subclasses set `TYPE` (and `DURABLE` /
    `SURFACE` where it applies) and are registered by it."""

    TYPE: ClassVar[str] = ""
    # Committed with an fsync (synchronous=FULL): an effect in the world
    # starts only once its dispatch (and so every event before it) is on
    # disk, and what is known of it afterwards survives an OS crash too.
    DURABLE: ClassVar[bool] = False
    SURFACE: ClassVar[bool] = False  # model history is derived from it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.TYPE:
            return  # a base of several bodies
        if cls.TYPE in BODIES:
            raise TypeError(f"two bodies for the event type {cls.TYPE!r}")
        BODIES[cls.TYPE] = cls

    def __post_init__(self) -> None:
        given = set()
        for name, absent in _shape(type(self)).optional:
            if getattr(self, name) is UNSET:
                object.__setattr__(self, name, absent)
            else:
                given.add(name)
        self.__dict__["_given"] = frozenset(given)  # (not a field: equality ignores it)

    def given(self, name: str) -> bool:
        """Whether the field `name` is in the row: always for a plain field;
        for an `optional()` one, whether its writer gave it (null included)."""
        optional_ = dict(_shape(type(self)).fields)[name]
        return not optional_ or name in self.__dict__["_given"]

    def payload(self) -> dict[str, Any]:
        given = self.__dict__["_given"]
        return {name: getattr(self, name) for name, optional_ in _shape(type(self)).fields
                if not optional_ or name in given}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Self:
        shape = _shape(cls)
        if not shape.required.issubset(payload):
            missing = ", ".join(n for n, _ in shape.fields if n in shape.required and n not in payload)
            raise ValueError(f"a {cls.TYPE} payload lacks {missing}: {payload}")
        return cls(**{k: v for k, v in payload.items() if k in shape.names})


@dataclass(frozen=True)
class _Shape:
    fields: tuple[tuple[str, bool], ...]  # (name, optional) in order
    optional: tuple[tuple[str, Any], ...]  # (name, value when absent)
    names: frozenset[str]
    required: frozenset[str]  # no default: a payload without it is refused


_SHAPES: dict[type[Body], _Shape] = {}


def _shape(cls: type[Body]) -> _Shape:
    """A body's fields, looked up once (every row read back passes here)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        all_ = fields(cls)
        shape = _SHAPES[cls] = _Shape(
            tuple((f.name, bool(f.metadata.get(_OPTIONAL))) for f in all_),
            tuple((f.name, f.metadata["absent"]) for f in all_ if f.metadata.get(_OPTIONAL)),
            frozenset(f.name for f in all_),
            frozenset(f.name for f in all_ if f.default is MISSING and f.default_factory is MISSING))
    return shape
