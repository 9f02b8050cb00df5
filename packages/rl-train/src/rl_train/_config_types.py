"""Typed sections built from the parsed YAML tree, each key and value checked on the way.

Each key must be a field of its section's dataclass (an unknown one is refused with the nearest
valid key), each value must fit the field's type hint (a float field takes an integer, a bool is
not a number, null turns an optional section off) and, for the numeric fields of
:data:`_MINIMUM`, reach its least value; every error names the dotted YAML key and says what it
must be in words. YAML keys that are Python keywords (``async``) map to their field
(``async_``).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any

from rl_train.user_code import ConfigError

#: YAML keys that are Python keywords -> the dataclass field that holds them.
_KEY_ALIASES = {"async": "async_"}


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(valid)}"


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}
    shown = [next((k for k, v in _KEY_ALIASES.items() if v == n), n) for n in names]
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        attr = _KEY_ALIASES.get(key, key)
        if attr not in names or key in _KEY_ALIASES.values():
            prefix = f"{where}." if where else ""
            valid = [prefix + n for n in shown]
            raise ConfigError(f"unknown key {path!r}{_suggest(path, valid)}")
        hint = _section(hints[attr])
        optional = hint is not hints[attr]  # ``X | None``: null turns the section off
        if dataclasses.is_dataclass(hint):
            section = None if optional and value is None else _build(hint, value, path)  # type: ignore[arg-type]
            kwargs[attr] = section
        else:
            kwargs[attr] = _check_type(value, hint, path)
            minimum = _MINIMUM.get(path)
            if minimum is not None and kwargs[attr] is not None and kwargs[attr] < minimum:
                raise ConfigError(f"{path} must be {_describe(hint, minimum)}, got {value!r}")
    return cls(**kwargs)


def _section(hint: Any) -> Any:
    """``X | None`` of a dataclass ``X`` -> ``X`` (an optional section); else ``hint``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [o for o in typing.get_args(hint) if o is not type(None)]
        if len(options) == 1 and dataclasses.is_dataclass(options[0]):
            return options[0]
    return hint


def _check_type(value: Any, hint: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    for option in options:
        base = typing.get_origin(option) or option
        if option is type(None) and value is None:
            return value
        if base is float and isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        if base is Any or (isinstance(base, type) and isinstance(value, base)):
            if base is int and isinstance(value, bool):
                continue
            return value
    raise ConfigError(f"{path} must be {_describe(hint, _MINIMUM.get(path))}, got {value!r}")


#: What each Python type of a config field is called in an error message.
_KINDS: dict[Any, str] = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}

#: The least value of numeric fields (``key: minimum``), checked when the YAML is read.
_MINIMUM: dict[str, int] = {
    "model.lora_r": 1,
    "model.lora_alpha": 1,
    "data.n_train": 1,
    "data.n_test": 1,
    "data.prompts_per_step": 1,
    "data.max_prompt_length": 1,
    "train.steps": 1,
    "train.evaluation_interval": 1,
    "train.checkpoint_steps": 1,
}


def _describe(hint: Any, minimum: int | None = None) -> str:
    """``int | None`` -> ``an integer or null`` (with ``>= minimum`` after a number)."""
    origin = typing.get_origin(hint)
    options = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    words = []
    for option in options:
        if option is type(None):
            continue
        base = typing.get_origin(option) or option
        word = _KINDS.get(base, getattr(base, "__name__", str(base)))
        if minimum is not None and base in (int, float):
            word += f" >= {minimum}"
        words.append(word)
    if type(None) in options:
        words.append("null")
    return " or ".join(words)
