"""The type-coercion engine of the model configs: a YAML mapping -> a frozen dataclass.

An unknown key, a missing required key or a value of the wrong type raises ConfigError with
one line naming the key path; a dataclass's __post_init__ ValueError("<field>: problem")
becomes "key <path>.<field>: problem".
"""

from __future__ import annotations

from vcloud.errors import ConfigError


def from_dict(cls, data, where: str):
    """Build dataclass `cls` from a mapping, rejecting unknown keys and checking simple types."""
    import dataclasses
    import typing

    if not isinstance(data, dict):
        raise ConfigError(f"key {where or '<top level>'}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        keys = ", ".join(f"{where}.{k}".lstrip(".") for k in unknown)
        raise ConfigError(f"unknown key {keys} (allowed: {', '.join(fields)})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, field in fields.items():
        key = f"{where}.{name}".lstrip(".")
        if name not in data:
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
                raise ConfigError(f"missing key {key}")
            continue
        values[name] = coerce(hints[name], data[name], key)
    try:
        return cls(**values)
    except ValueError as err:  # __post_init__ says "<field>: problem" or ": problem"
        text = str(err)
        raise ConfigError(
            f"key {where}{text}" if text.startswith(":") else f"key {where}.{text}".replace("key .", "key ")
        ) from None


def coerce(hint, value, key: str):
    import dataclasses
    import types
    import typing

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(option, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"key {key}: may not be null")
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, key)
    if origin is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"key {key}: expected a list, got {value!r}")
        item = args[0]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(coerce(item, v, f"{key}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise ConfigError(f"key {key}: expected {len(args)} values, got {len(value)}")
        return tuple(coerce(a, v, f"{key}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is typing.Literal:
        if value not in typing.get_args(hint):
            raise ConfigError(f"key {key}: {value!r} is not one of {', '.join(map(str, typing.get_args(hint)))}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"key {key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"key {key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"key {key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"key {key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {hint} for {key}")
