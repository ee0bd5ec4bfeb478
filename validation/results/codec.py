"""One codec between results.json's JSON and typed records: frozen dataclasses, decoded by their type hints and
encoded back, so that what a step kind records (its Result) is read as attributes, not by string keys.

    decode(Result, data, "steps.x.metrics")      a Result, its values checked against the field types; a
                                                 malformed value raises ResultsError naming its key path
    decode(Result, data, lenient=True)           the same, but a missing or malformed value takes the field's
                                                 default (None when it has none): what a report reads, since
                                                 results may be damaged and a report still renders; a
                                                 damaged record in a `Record | None` field keeps its good
                                                 fields (one bad value does not drop the record)
    encode(result)                               the JSON value: a dict per dataclass, its fields in order
    written(record)                              a record's JSON mapping, {} for a record of defaults (what a
                                                 writer that had nothing to say left): a mapping as it is

The types a field may have: str, int, float (an int is one too; NaN, infinity and an int beyond a float's range are
not), bool, None, Any (any JSON value), a dataclass,
list[X], tuple[X, ...], dict[str, X], X | None and Literal[...]. A dataclass with a field named ``extra`` (a dict)
keeps there the keys it does not declare, and encode writes them back after its own fields; without one such keys
are dropped on decode. A field made with ``absent()`` is left out of the JSON while it holds its default (a key
written only when it applies), unless its ``beside`` field is written (keys written together, a null among them:
``absent(beside="telemetry")``); every other field is always written. A record field made with ``blank()`` holds
None where its JSON is ``{}`` (a record that is all or nothing), and is written as ``{}`` while None. A field is
read from and written to the JSON key of its name, or the one ``keyed("from")`` (or ``absent(..., key="from")``,
``blank(key="from")``) gives it: a key that is no Python name (a keyword, a name with a dash).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Literal, TypeVar, Union

from validation.results.model import ResultsError

T = TypeVar("T")
EXTRA = "extra"
_ABSENT = "absent"
_BESIDE = "beside"
_BLANK = "blank"
_KEY = "key"


def absent(default: Any = None, beside: str | None = None, key: str | None = None, **kwargs: Any) -> Any:
    """A dataclass field left out of the JSON while it holds `default` (a `?` key of results.json); with `beside`,
    written whenever that field (its Python name) of the same record is written (a group of keys one writer adds
    together); `key`: its JSON key, where that is not the field's name (keyed)."""
    metadata = {_ABSENT: True, _BESIDE: beside, **({_KEY: key} if key is not None else {})}
    if isinstance(default, (list, dict)):
        factory = type(default)
        return dataclasses.field(default_factory=factory, metadata=metadata, **kwargs)
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def blank(key: str | None = None, **kwargs: Any) -> Any:
    """A record field (`Record | None`) that is None where the JSON holds `{}`, and written as `{}` while None;
    `key`: its JSON key, where that is not the field's name (keyed)."""
    return dataclasses.field(default=None, metadata={_BLANK: True, **({_KEY: key} if key is not None else {})},
                             **kwargs)


def keyed(key: str, default: Any = None, **kwargs: Any) -> Any:
    """A dataclass field read from and written to JSON key `key` instead of its own name (a key that cannot be one:
    `source: str | None = keyed("from")` holds the JSON's "from"); always written, like a plain field."""
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=type(default), metadata={_KEY: key}, **kwargs)
    return dataclasses.field(default=default, metadata={_KEY: key}, **kwargs)


def json_key(f: dataclasses.Field) -> str:
    """The JSON key of dataclass field `f`: the one keyed() (or absent's or blank's `key`) gave it, else its name."""
    return str(f.metadata.get(_KEY) or f.name)


def decode(cls: type[T], value: Any, path: str = "", *, lenient: bool = False) -> T:
    """`value` (parsed JSON) as an instance of dataclass `cls`; ResultsError naming the key path when it does not
    fit (lenient: the field's default instead)."""
    return _decode(cls, value, path or cls.__name__, lenient)


def encode(obj: Any) -> Any:
    """A record (dataclass), or a structure of them, as JSON: dicts in field order, absent() fields at their default
    left out, `extra` merged after the declared fields."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(obj)}
        for f in fields.values():
            value = getattr(obj, f.name)
            if f.name == EXTRA and isinstance(value, dict):
                extra = value
            elif f.metadata.get(_BLANK) and value is None:
                out[json_key(f)] = {}
            elif not _left_out(obj, f, fields):
                out[json_key(f)] = encode(value)
        out.update({k: encode(v) for k, v in extra.items() if k not in out})
        return out
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ResultsError(f"{obj!r} is not JSON (results.json holds no NaN or infinity)")
    return obj


def written(record: Any) -> dict[str, Any]:
    """A record (or a mapping) as results.json would hold it: {} for a record of its defaults only, or for a value
    that is neither."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {} if record == type(record)() else encode(record)
    return dict(record) if isinstance(record, dict) else {}


def _left_out(obj: Any, f: dataclasses.Field, fields: dict[str, dataclasses.Field]) -> bool:
    """Whether encode leaves field `f` of `obj` out: an absent() field at its default, its `beside` field (if any)
    left out too."""
    if not (f.metadata.get(_ABSENT) and getattr(obj, f.name) == _default_of(f)):
        return False
    beside = f.metadata.get(_BESIDE)
    return beside is None or _left_out(obj, fields[beside], fields)


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """A record's field types, resolved once per class (its annotations are strings: evaluating them for every
    record of a list, a file per pytest step, is the decoder's main cost)."""
    return typing.get_type_hints(cls)


@functools.cache
def _keys(cls: type) -> dict[str, str]:
    """{field name: its JSON key} of a record's fields but `extra`, once per class."""
    return {f.name: json_key(f) for f in dataclasses.fields(cls) if f.name != EXTRA}


@functools.cache
def _declared(cls: type) -> frozenset[str]:
    """The JSON keys a record's fields read (and `extra`'s name): every other key goes to its `extra`."""
    return frozenset(_keys(cls).values()) | {EXTRA}


def _decode(hint: Any, value: Any, path: str, lenient: bool) -> Any:
    if dataclasses.is_dataclass(hint):
        return _decode_record(hint, value, path, lenient)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        refused: dict[Any, ResultsError] = {}
        for option in options:
            try:
                return _decode(option, value, path, False)
            except ResultsError as exc:
                refused[option] = exc
        if lenient and isinstance(value, dict) and len(options) == 1 and dataclasses.is_dataclass(options[0]):
            return _decode_record(options[0], value, path, True)  # a damaged record: its good fields kept
        if float in refused and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise refused[float]  # a number, not a finite one: say so
        return _wrong(path, value, hint)
    if origin is Literal:
        return value if value in args else _wrong(path, value, hint)
    if origin in (list, tuple):
        if not isinstance(value, list):
            return _wrong(path, value, hint)
        item = args[0] if args else Any
        out = [_decode(item, v, f"{path}[{i}]", lenient) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            return _wrong(path, value, hint)
        item = args[1] if len(args) == 2 else Any
        return {k: _decode(item, v, f"{path}.{k}", lenient) for k, v in value.items()}
    if hint is list:
        return value if isinstance(value, list) else _wrong(path, value, hint)
    if hint is float:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            return _wrong(path, value, hint)
        try:
            number = float(value)
        except OverflowError:  # an integer beyond a float's range
            number = math.inf
        if not math.isfinite(number):
            shown = repr(value) if isinstance(value, float) else "an integer beyond a float's range"
            raise ResultsError(f"{path}: {shown} is not a finite number (results.json holds finite numbers only)")
        return number
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _wrong(path, value, hint)
    if hint in (str, bool):
        return value if isinstance(value, hint) else _wrong(path, value, hint)
    if hint is type(None):
        return value if value is None else _wrong(path, value, hint)
    raise TypeError(f"{path}: the codec has no rule for {hint!r}")


def _decode_record(cls: type, value: Any, path: str, lenient: bool) -> Any:
    if not isinstance(value, dict):
        if lenient:
            value = {}
        else:
            _wrong(path, value, cls)
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    keys = _keys(cls)
    for name, f in fields.items():
        if name == EXTRA:
            continue
        key = keys[name]
        where = f"{path}.{key}"
        if key not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and not lenient:
                raise ResultsError(f"{where}: missing")
            kwargs[name] = _default_of(f)
            continue
        if f.metadata.get(_BLANK) and value[key] == {}:
            kwargs[name] = None
            continue
        try:
            kwargs[name] = _decode(hints[name], value[key], where, lenient)
        except ResultsError:
            if not lenient:
                raise
            kwargs[name] = _default_of(f)
    if EXTRA in fields:
        declared = _declared(cls)
        kwargs[EXTRA] = {k: v for k, v in value.items() if k not in declared}
    return cls(**kwargs)


def _wrong(path: str, value: Any, hint: Any) -> Any:
    shown = "null" if value is None else type(value).__name__
    if typing.get_origin(hint) is Literal:
        name, shown = "one of " + ", ".join(map(repr, typing.get_args(hint))), repr(value)
    else:
        name = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
    raise ResultsError(f"{path}: expected {name}, got {shown}")


def given(record: T | None) -> T | None:
    """A decoded record, or None where it is missing or blank ({}, or not a mapping: decoded leniently as its
    defaults), as a report treats an empty record."""
    return None if record is None or record == type(record)() else record
