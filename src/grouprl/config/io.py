"""YAML recipes, dotted ``key=value`` overrides and the coercion of YAML values into field types."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from grouprl.errors import ConfigError, did_you_mean


def read_yaml(path: str | Path | None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The mapping in the YAML recipe at ``path`` (``None`` = empty) with ``key=value`` overrides applied."""
    import yaml

    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"recipe {str(path)!r} does not exist.")
        try:
            data = yaml.load(p.read_text(), Loader=unique_key_loader(str(path))) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe {str(path)!r} is not valid YAML: {e}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {str(path)!r} must be a mapping of field: value.")
    for item in overrides or []:
        apply_override(data, item)
    return data


def unique_key_loader(name: str) -> type:
    """A ``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last one without a
    word, so ``max_steps: 5`` then ``max_steps: 7`` would silently train 7), naming both lines."""
    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, (str, int, float, bool)) and key in seen:
                    raise ConfigError(f"recipe {name!r}: key {key!r} is given twice (lines {seen[key]} and {line}); "
                                      f"YAML would keep the second silently. Fix: delete one of them.")
                seen[key] = line
            return super().construct_mapping(node, deep)

    UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, UniqueKeys.construct_mapping)
    return UniqueKeys


def write_yaml(data: dict[str, Any], path: str | Path) -> None:
    import yaml

    Path(path).write_text(yaml.safe_dump(_plain(data), sort_keys=False))


def apply_override(data: dict[str, Any], item: str) -> None:
    """Apply ``a.b=value`` to nested ``data``; the value is parsed as YAML (``1e-6`` is a number)."""
    import yaml

    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like key=value (e.g. learning_rate=1e-6).")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    parts = key.strip().split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a mapping.")
    node[parts[-1]] = value


def coerce_all(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """Check every key names a field of ``cls`` (did-you-mean otherwise) and coerce YAML values."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    out = {}
    for key, value in data.items():
        if key not in known:
            raise ConfigError(f"unknown config key {key!r}.{did_you_mean(str(key), known)} "
                              f"See `grouprl train --help-config` for every field.")
        out[key] = coerce(known[key], value)
    return out


def coerce(f: dataclasses.Field, value: Any) -> Any:
    """Make YAML strings like ``5e-6`` (YAML 1.1 reads them as text) into the field's type; a single string
    for a list field becomes a one-element list. Anything else is left for validation to judge."""
    kind = str(f.type)
    if isinstance(value, str) and value.lower() in ("null", "none", "~") and "None" in kind:
        return None
    if isinstance(value, bool) and kind.startswith("str"):  # YAML 1.1 reads `no` / `yes` / `off` as booleans:
        return "no" if value is False else "yes"  # `save_strategy: no` (TRL's spelling) means the string
    try:
        if isinstance(value, str) and kind.startswith("float"):
            return float(value)
        if isinstance(value, str) and kind.startswith("int"):
            return int(value)
        if isinstance(value, float) and kind.startswith("int") and value.is_integer():
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool) and kind.startswith("float"):
            return float(value)
    except ValueError as e:
        raise ConfigError(f"{f.name}={value!r} is not a valid {kind.split(' ')[0]}.") from e
    if kind.startswith("bool") and not isinstance(value, bool) and not (value is None and "None" in kind):
        raise ConfigError(f"{f.name}={value!r} must be true or false.")
    if kind.startswith("list") and isinstance(value, str):
        return [value]
    return value


def _plain(value: Any) -> Any:
    """YAML-safe copy: callables (Python-API reward functions) become their names."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return getattr(value, "__name__", repr(value))
