"""Frozen dataclasses built from plain data (YAML, config.json) with errors that name the dotted key."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from qwen3_runtime.validation import as_float, as_int, check_range


class ConfigError(ValueError):
    """A bad configuration value; the message names the dotted YAML key."""


# Sizes and counts fit int32, which the kernels index with.
MAX_SIZE = 2**31 - 1


def bounds(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> dict:
    """A field's metadata: the range `build` checks its value against."""
    return {"lo": lo, "hi": hi, "lo_open": lo_open}


def size_bounds(lo: int) -> dict:
    return bounds(lo, MAX_SIZE)


def build(cls: type, raw: Any, prefix: str = "") -> Any:
    """`cls` from a mapping: unknown or missing keys, wrong types and values out of a field's range
    (its metadata: lo, hi, lo_open) are ConfigErrors naming `prefix` + the key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix}{unknown[0]}; allowed in "
            f"{prefix.rstrip('.') or 'the top level'}: {', '.join(fields)}"
        )
    kwargs = {}
    for name, value in raw.items():
        key = prefix + name
        kwargs[name] = _coerce(value, hints[name], key)
        bounds = fields[name].metadata
        if bounds and kwargs[name] is not None:
            _check_range(key, kwargs[name], **bounds)
    try:
        return cls(**kwargs)
    except ValueError as e:  # __post_init__ checks name the field; add the section
        raise ConfigError(f"{prefix}{e}") from None
    except TypeError as e:  # a required key is missing
        missing = [
            n
            for n, f in fields.items()
            if n not in raw and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        raise ConfigError(f"missing config key {prefix}{missing[0] if missing else ''}: {e}") from None


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        shapes = [a for a in args if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(shapes) > 1:
            return build(_closest(shapes, value), value, key + ".")
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[-1] if len(errors) == 1 else f"{key}={value!r} is invalid: expected {_describe(tp)}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}={value!r} is invalid: allowed values are {', '.join(map(str, args))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}={value!r} is invalid: expected {_describe(tp)}")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key + ".")
    if tp in (int, float):  # NumPy scalars too (overrides from Python), as Python numbers
        return _checked(as_int if tp is int else as_float, key, value)
    if tp in (str, bool) and (type(value) is not tp):
        raise ConfigError(f"{key}={value!r} is invalid: expected {tp.__name__}")
    return value


def _closest(shapes: list[type], raw: dict) -> type:
    """The dataclass that knows the most of a mapping's keys, the first on a tie (a family's shape before its
    extensions): a mapping of one member's fields builds that member, and its mistakes are reported against it (trying
    each member in turn would bury a typo under the other members' errors)."""
    return min(shapes, key=lambda shape: len(raw.keys() - {f.name for f in dataclasses.fields(shape)}))


def _check_range(key: str, value: float, lo: float | None, hi: float | None, lo_open: bool) -> None:
    _checked(check_range, key, value, lo=lo, hi=hi, lo_open=lo_open)


def _checked(check: Callable[..., Any], key: str, value: Any, **bounds: Any) -> Any:
    """A shared checker (validation.py, the same messages as SamplingParams'), raising ConfigError."""
    try:
        return check(key, value, **bounds)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _describe(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) is list:
        return f"a list of {_describe(args[0])}"
    if args:
        return " or ".join(_describe(a) for a in args) + (" or null" if type(None) in typing.get_args(tp) else "")
    return getattr(tp, "__name__", str(tp))
