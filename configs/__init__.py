"""Configuration: the typed schema (`schema.py`) and the YAML profiles beside it.

`load_config("cpu", ["iteration.alpha=0.8"])` resolves a profile name or a YAML path, applies `--set`
overrides, and validates. Errors name the field and say what to change.
"""
# pyright: basic

from __future__ import annotations

# This folder is the package `sage.configs` (`sage/configs` links here); imported as a bare `configs` it would be a
# second copy of every module, with its own enums and state.
if __name__ != "sage.configs":
    raise ImportError(f"import sage.configs, not {__name__}: this folder is the package sage.configs")

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from sage.configs.identity import EXCLUDED, config_hash, drop_retired, identity_diff
from sage.configs.schema import SageConfig

PROFILES_DIR = Path(__file__).parent
DEFAULT_PROFILE = "cpu"


class ConfigError(ValueError):
    """A configuration problem, worded for the user."""


def profile_path(profile: str | Path) -> Path:
    p = Path(profile)
    if p.suffix in (".yaml", ".yml"):
        if p.is_dir():
            raise _a_directory(p)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        return p
    candidate = PROFILES_DIR / f"{profile}.yaml"
    if not candidate.exists():
        if p.is_dir():
            raise _a_directory(p)
        raise ConfigError(f"unknown profile {profile!r}; use one of {_profiles()} or a path to a .yaml file")
    return candidate


def _profiles() -> list[str]:
    return sorted(x.stem for x in PROFILES_DIR.glob("*.yaml"))


def _a_directory(p: Path) -> ConfigError:
    return ConfigError(f"config {p} is a directory; give a profile name ({', '.join(_profiles())}) or a YAML file")


def _read_text(path: Path) -> str:
    """The YAML file's text; a file that is not UTF-8 or cannot be read is a ConfigError naming it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"config file {path}:{line}: not UTF-8 text (byte {e.start}); re-save the file as "
                          f"UTF-8") from None


def _parse_value(text: str) -> Any:
    # YAML scalar rules: 0.7 -> float, true -> bool, [math] -> list, anything else stays a string.
    return yaml.safe_load(text) if text.strip() else ""


def apply_override(data: dict, assignment: str) -> None:
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected section.field=value, e.g. iteration.alpha=0.8")
    key, value = assignment.split("=", 1)
    parts = key.strip().split(".")
    if len(parts) < 2 or not all(parts):
        raise ConfigError(f"--set {assignment!r}: the key must be section.field, e.g. iteration.alpha")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {assignment!r}: {part} is not a section")
    node[parts[-1]] = _parse_value(value)


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key; remove it or check its spelling (`sage config --schema` lists every field)"
        elif "input" in e and e["type"] != "value_error":
            msg = f"{msg} (got {e['input']!r})"
        lines.append(f"  {loc}: {msg}")
    return "\n".join(lines)


def load_config(profile: str | Path = DEFAULT_PROFILE, overrides: list[str] | tuple[str, ...] = ()) -> SageConfig:
    path = profile_path(profile)
    try:
        data = yaml.safe_load(_read_text(path)) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    for assignment in overrides:
        apply_override(data, assignment)
    return config_from_dict(data, source=str(path))


def config_from_dict(data: dict, source: str = "dict") -> SageConfig:
    try:
        data = drop_retired(data)
    except ValueError as e:
        raise ConfigError(f"{source}: {e}") from None
    try:
        return SageConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None


def config_json(cfg: SageConfig) -> str:
    return json.dumps(cfg.model_dump(mode="json"), sort_keys=True)


__all__ = ["ConfigError", "SageConfig", "load_config", "config_from_dict", "config_json", "config_hash",
           "apply_override", "profile_path", "DEFAULT_PROFILE", "EXCLUDED", "identity_diff"]
