"""A job's context: user ``tags`` and the trainer's ``hparams`` (hyperparameters), bounded.

Both are small flat mappings stored with the job (registration fields ``tags`` and ``hparams``),
shown in the dashboard's job page and compare table, searched and filtered by the job list:

* at most :data:`MAX_ENTRIES` entries; keys of 1-:data:`MAX_KEY` characters (letters, digits and
  ``_ . : / -``, starting with a letter, digit or ``_``);
* ``tags``: string values of at most :data:`MAX_VALUE` characters (numbers and booleans are turned
  into text: a tag is a label);
* ``hparams``: finite numbers, booleans, strings of at most :data:`MAX_VALUE` characters, or null.

No control character anywhere. Invalid input raises :class:`~.errors.InvalidInput` naming the entry
and saying how to fix it. The result is a read-only mapping with its keys in sorted order.

Example::

    >>> dict(check_tags({"team": "rl", "sweep": 3}))
    {'sweep': '3', 'team': 'rl'}
    >>> dict(check_hparams({"learning_rate": 3e-4, "model": "tiny-llama"}))
    {'learning_rate': 0.0003, 'model': 'tiny-llama'}
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .errors import InvalidInput

__all__ = ["EMPTY", "MAX_ENTRIES", "MAX_KEY", "MAX_VALUE", "check_hparams", "check_tags"]

MAX_ENTRIES = 32
MAX_KEY = 64
MAX_VALUE = 256
EMPTY: Mapping[str, Any] = MappingProxyType({})
_KEY = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.:/-]{{0,{MAX_KEY - 1}}}")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")  # a lone surrogate: no UTF-8


def _entries(kind: str, value: Any) -> list[tuple[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        raise InvalidInput(f"{kind} must be an object of key: value, but got {type(value).__name__}.")
    if len(value) > MAX_ENTRIES:
        raise InvalidInput(f"{kind} may hold at most {MAX_ENTRIES} entries, but got {len(value)}; keep the ones "
                           "that tell runs apart.")
    for key in value:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise InvalidInput(f"{kind} keys must be 1-{MAX_KEY} characters of letters, digits and _ . : / - "
                               f"(starting with a letter, digit or _), but got {key!r:.80}.")
    return sorted(value.items())


def _text(kind: str, key: str, v: str) -> str:
    if len(v) > MAX_VALUE:
        raise InvalidInput(f"{kind}.{key} must be at most {MAX_VALUE} characters, but got {len(v)}.")
    if _CONTROL.search(v):
        raise InvalidInput(f"{kind}.{key} must not contain control characters or lone surrogates.")
    return v


def check_tags(value: Any) -> Mapping[str, str]:
    """``value`` as valid tags (see the module docstring); None is no tags."""
    out = {}
    for key, v in _entries("tags", value):
        if isinstance(v, bool):
            v = "true" if v else "false"
        elif isinstance(v, int):  # no float() of it: an integer of 400 digits would overflow
            if abs(v) >= 10**MAX_VALUE:
                raise InvalidInput(f"tags.{key} must be a number of at most {MAX_VALUE} digits (or text), but got a "
                                   "longer one; send it as text cut to what tells runs apart.")
            v = str(v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidInput(f"tags.{key} must be a finite number or text, but got {v!r}.")
            v = repr(v)
        elif not isinstance(v, str):
            raise InvalidInput(f"tags.{key} must be text (or a number), but got {type(v).__name__}.")
        out[key] = _text("tags", key, v)
    return MappingProxyType(out) if out else EMPTY


def check_hparams(value: Any) -> Mapping[str, Any]:
    """``value`` as valid hyperparameters (see the module docstring); None is none."""
    out: dict[str, Any] = {}
    for key, v in _entries("hparams", value):
        if v is None or isinstance(v, bool):
            out[key] = v
        elif isinstance(v, int):
            if abs(v) > 2**53:
                raise InvalidInput(f"hparams.{key} must be an integer of at most 2^53 in size, but got one of {v.bit_length()} bits.")
            out[key] = v
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise InvalidInput(f"hparams.{key} must be a finite number, but got {v!r}; leave it out instead.")
            out[key] = v
        elif isinstance(v, str):
            out[key] = _text("hparams", key, v)
        else:
            raise InvalidInput(f"hparams.{key} must be a number, a boolean, text or null, but got "
                               f"{type(v).__name__}; record a scalar (e.g. str(value)).")
    return MappingProxyType(out) if out else EMPTY
