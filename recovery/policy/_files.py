"""Reading the policy's YAML files: one error type, messages that name the place and the field."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from recovery.errors import UsageError


class PolicyFileError(UsageError):
    """A catalogue or policy file is missing, not YAML, or has a bad entry; the message names
    the file, the entry and the field."""


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of the YAML file at ``path``; an empty file reads as ``{}``.

    Raises :class:`PolicyFileError` when the file cannot be read, is not YAML, or its top
    level is not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyFileError(f"{path}: cannot be read ({e.strerror or e})") from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyFileError(f"{path}: not valid YAML: {e}") from e
    if data is None:
        return {}
    return require_mapping(data, f"{path}")


def require_mapping(value: object, where: str) -> dict[str, Any]:
    """``value`` as a dict with text keys, else :class:`PolicyFileError` naming ``where``."""
    if not isinstance(value, Mapping):
        raise PolicyFileError(f"{where}: expected a mapping, got {type(value).__name__}")
    bad = [k for k in value if not isinstance(k, str)]
    if bad:
        raise PolicyFileError(f"{where}: keys must be text, got {bad[0]!r}")
    return dict(value)


def check_keys(data: Mapping[str, Any], where: str, valid: Iterable[str]) -> None:
    """Raise :class:`PolicyFileError` for the first key of ``data`` not in ``valid``,
    naming it and listing the valid ones."""
    allowed = sorted(valid)
    for key in data:
        if key not in allowed:
            raise PolicyFileError(f"{where}: unknown key {key!r}. Valid keys: {', '.join(allowed)}")


def one_line(value: object, where: str) -> str:
    """``value`` as one non-empty line without double quotes (safe inside a Slurm reason)."""
    if not isinstance(value, str) or not value.strip():
        raise PolicyFileError(f"{where}: expected non-empty text")
    if "\n" in value.strip() or '"' in value:
        raise PolicyFileError(f"{where}: must be one line without double quotes")
    return value.strip()


def number(value: object, where: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    """``value`` as a float >= ``minimum`` (> when ``strict``); bools are not numbers here."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyFileError(f"{where}: expected a number, got {value!r}")
    f = float(value)
    if f < minimum or (strict and f == minimum) or f != f:
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise PolicyFileError(f"{where}: expected a number {bound}, got {value!r}")
    return f


def integer(value: object, where: str, *, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PolicyFileError(f"{where}: expected a whole number >= {minimum}, got {value!r}")
    return value


def boolean(value: object, where: str) -> bool:
    """``value`` as a bool (YAML true/false only)."""
    if not isinstance(value, bool):
        raise PolicyFileError(f"{where}: expected true or false, got {value!r}")
    return value
