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


# What _decode does with a type hint (the first item of its _shape)
_RECORD, _ANY, _UNION, _LITERAL, _SEQUENCE, _MAPPING, _LIST, _FLOAT, _INT, _EXACT, _NONE, _UNKNOWN = range(12)
_FLOAT_INT_LIMIT = 2 ** 1023  # an int at or beyond it may not fit a float: left to the value-by-value path


def _shape(hint: Any) -> tuple[int, Any]:
    """(what _decode does with `hint`, what it needs for that: the shapes of a union's options and of a list's or
    a mapping's items included), worked out once per hint: asking typing for a hint's origin and arguments at every
    value, and hashing the hint to look that up, were most of the time a run's results took to decode. A hint that
    cannot be hashed (a Literal of a list) is worked out at each call, as before."""
    try:
        return _cached_shape(hint)
    except TypeError:
        return _shape_of(hint)


@functools.cache
def _cached_shape(hint: Any) -> tuple[int, Any]:
    return _shape_of(hint)


def _shape_of(hint: Any) -> tuple[int, Any]:
    if dataclasses.is_dataclass(hint):
        return _RECORD, hint
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return _ANY, None
    if origin in (Union, types.UnionType):
        return _UNION, (type(None) in args, tuple((a, _shape(a)) for a in args if a is not type(None)))
    if origin is Literal:
        return _LITERAL, args
    if origin in (list, tuple):
        item = args[0] if args else Any
        return _SEQUENCE, (item, _shape(item), origin is tuple)
    if origin is dict or hint is dict:
        item = args[1] if len(args) == 2 else Any
        return _MAPPING, (item, _shape(item))
    if hint is list:
        return _LIST, None
    if hint is float:
        return _FLOAT, None
    if hint is int:
        return _INT, None
    if hint in (str, bool):
        return _EXACT, hint
    if hint is type(None):
        return _NONE, None
    return _UNKNOWN, None


def _decode(hint: Any, value: Any, path: str, lenient: bool) -> Any:
    return _decode_as(hint, _shape(hint), value, path, lenient)


def _decode_as(hint: Any, shape: tuple[int, Any], value: Any, path: str, lenient: bool) -> Any:
    """`value` decoded as `hint`, whose _shape is `shape`."""
    kind, info = shape
    if kind == _EXACT:
        return value if isinstance(value, info) else _wrong(path, value, hint)
    if kind == _UNION:
        nullable, options = info
        if value is None and nullable:
            return None
        refused: dict[Any, ResultsError] = {}
        for option, option_shape in options:
            if not _may_fit(option_shape, value):  # a scalar of another type: refused without raising
                continue
            try:
                return _decode_as(option, option_shape, value, path, False)
            except ResultsError as exc:
                refused[option] = exc
        if lenient and isinstance(value, dict) and len(options) == 1 and options[0][1][0] == _RECORD:
            return _decode_record(options[0][0], value, path, True)  # a damaged record: its good fields kept
        if float in refused and isinstance(value, (int, float)) and not isinstance(value, bool):
            raise refused[float]  # a number, not a finite one: say so
        return _wrong(path, value, hint)
    if kind == _RECORD:
        return _decode_record(info, value, path, lenient)
    if kind == _ANY:
        return value
    if kind == _FLOAT:
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
    if kind == _INT:
        return value if isinstance(value, int) and not isinstance(value, bool) else _wrong(path, value, hint)
    if kind == _LITERAL:
        return value if value in info else _wrong(path, value, hint)
    if kind == _SEQUENCE:
        if not isinstance(value, list):
            return _wrong(path, value, hint)
        item, item_shape, is_tuple = info
        out = _scalars(item_shape, value)
        if out is None:  # not all plain scalars of the type: item by item (what does not fit says where)
            out = [_decode_as(item, item_shape, v, f"{path}[{i}]", lenient) for i, v in enumerate(value)]
        return tuple(out) if is_tuple else out
    if kind == _MAPPING:
        if not isinstance(value, dict):
            return _wrong(path, value, hint)
        item, item_shape = info
        if item_shape[0] == _ANY:
            return dict(value)
        return {k: _decode_as(item, item_shape, v, f"{path}.{k}", lenient) for k, v in value.items()}
    if kind == _LIST:
        return value if isinstance(value, list) else _wrong(path, value, hint)
    if kind == _NONE:
        return value if value is None else _wrong(path, value, hint)
    raise TypeError(f"{path}: the codec has no rule for {hint!r}")


def _scalars(shape: tuple[int, Any], values: list) -> list | None:
    """`values` decoded as a list of the type of `shape` where that is float, int, str, bool or Any and every value
    is a plain one of it (a float finite; an int, where floats are expected, well within a float's range), as
    _decode_as would give them one by one; None where one is not (the caller then decodes each, and names the one
    that does not fit). A run's series (tokens/s per step, ...) are such lists: one call instead of one per value."""
    kind, info = shape
    if kind == _ANY:
        return list(values)
    if kind == _FLOAT:
        out = []
        for v in values:
            t = type(v)
            if t is int:
                if not -_FLOAT_INT_LIMIT < v < _FLOAT_INT_LIMIT:
                    return None
                v = float(v)
            elif t is not float or v - v != 0.0:  # v - v is NaN for an infinity or a NaN
                return None
            out.append(v)
        return out
    want = int if kind == _INT else info if kind == _EXACT else None
    if want is not None and all(type(v) is want for v in values):
        return list(values)
    return None


def _may_fit(shape: tuple[int, Any], value: Any) -> bool:
    """False where `value` cannot be of the type of `shape` that is int, str, bool or None (decoding it would only
    raise, which a union's options such as int | float did at most of their values); True otherwise."""
    kind, info = shape
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _EXACT:
        return isinstance(value, info)
    if kind == _NONE:
        return value is None
    return True


@functools.cache
def _plan(cls: type) -> tuple[tuple[tuple[str, str, Any, tuple, dataclasses.Field, bool, bool], ...], bool]:
    """((name, JSON key, type, its _shape, field, required, blank) of each field but `extra`, whether the record
    has `extra`), once per record class."""
    hints = _hints(cls)
    keys = _keys(cls)
    fields = dataclasses.fields(cls)
    plan = tuple((f.name, keys[f.name], hints[f.name], _shape(hints[f.name]), f,
                  f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                  bool(f.metadata.get(_BLANK))) for f in fields if f.name != EXTRA)
    return plan, any(f.name == EXTRA for f in fields)


def _decode_record(cls: type, value: Any, path: str, lenient: bool) -> Any:
    if not isinstance(value, dict):
        if lenient:
            value = {}
        else:
            _wrong(path, value, cls)
    plan, has_extra = _plan(cls)
    kwargs: dict[str, Any] = {}
    for name, key, hint, shape, f, required, blank_field in plan:
        if key not in value:
            if required and not lenient:
                raise ResultsError(f"{path}.{key}: missing")
            kwargs[name] = _default_of(f)
            continue
        item = value[key]
        if blank_field and item == {}:
            kwargs[name] = None
            continue
        try:
            kwargs[name] = _decode_as(hint, shape, item, f"{path}.{key}", lenient)
        except ResultsError:
            if not lenient:
                raise
            kwargs[name] = _default_of(f)
    if has_extra:
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
