"""What each config key allows: one :class:`Rule` per key, declared beside the key.

A section of :mod:`streamlearn.config` declares its keys with :func:`key`, which stores
the rule in the field's metadata; its ``__post_init__`` calls :func:`check_keys`. The
rule's ``text`` is both the end of the error message and the "allowed" column of
docs/configuration.md (a test compares them), so the doc cannot drift from the code.

>>> rule = between(0, 1, low_open=True, high_open=True)
>>> rule.text, rule.allows(0.15), rule.allows(1.0)
('in (0, 1)', True, False)
>>> one_of("sum", "concat").text
"one of 'sum', 'concat'"
"""
from __future__ import annotations

import math
import re
from dataclasses import Field, dataclass, field, fields
from typing import Any, Callable

from .exceptions import ConfigError

RULE = "rule"  # the metadata key of a field's Rule
REDACTED = "<redacted>"  # shown instead of a secret


@dataclass(frozen=True)
class Rule:
    """``allows(value)`` says whether a value of the key's type is in range; ``text``
    says in words what is (e.g. ``>= 1``); ``hint`` is added to the error message."""

    text: str
    allows: Callable[[Any], bool]
    hint: str = ""


def key(default: Any, rule: Rule, **options: Any) -> Any:
    """A config key: ``default`` (an immutable value) checked by ``rule``."""
    return field(default=default, metadata={RULE: rule}, **options)


def rule_of(f: Field) -> Rule:
    """The rule declared with a field: every config key has one."""
    try:
        return f.metadata[RULE]
    except KeyError:
        raise TypeError(f"config key {f.name!r} has no rule: declare it as key(default, rule)") from None


def check_keys(section: Any, secrets: frozenset[str] = frozenset()) -> None:
    """Check every key of a section instance (a frozen dataclass whose class names its
    ``section``) against its type and rule; raise :class:`ConfigError` naming
    ``section.key``, the value and what is allowed. An int given for a float key becomes
    that float. Values of ``secrets`` (dotted names) never appear in a message."""
    for f in fields(section):
        where = f"{section.section}.{f.name}"
        given = getattr(section, f.name)
        value = _typed(given, f.default, where, where in secrets)
        if value is not given:
            object.__setattr__(section, f.name, value)  # frozen, but an int given for a float is stored as one
        rule = rule_of(f)
        if not rule.allows(value):
            hint = f" ({rule.hint})" if rule.hint else ""
            raise ConfigError(f"{where} must be {rule.text}, got {_show(value, where in secrets)}{hint}", where)


def _typed(value: Any, default: Any, where: str, secret: bool) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {_show(value, secret)}", where)
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if type(value) is not type(default):
        raise ConfigError(f"{where} must be {type(default).__name__}, got {_show(value, secret)}", where)
    return value


def _show(value: Any, secret: bool) -> str:
    return REDACTED if secret else repr(value)


# ---------------------------------------------------------------------------- rules

def flag() -> Rule:
    """A bool key: its type is its whole range."""
    return Rule("true or false", lambda v: True)


def at_least(low: float) -> Rule:
    return Rule(f">= {_num(low)}", lambda v: _finite(v) and v >= low)


def above(low: float) -> Rule:
    return Rule(f"> {_num(low)}", lambda v: _finite(v) and v > low)


def between(low: float, high: float, low_open: bool = False, high_open: bool = False) -> Rule:
    """``low <= v <= high``, each end open (excluded) on request; always finite."""
    text = f"in {'(' if low_open else '['}{_num(low)}, {_num(high)}{')' if high_open else ']'}"

    def allows(v: Any) -> bool:
        over_low = v > low if low_open else v >= low
        under_high = v < high if high_open else v <= high
        return _finite(v) and over_low and under_high
    return Rule(text, allows)


def multiple_of(step: int, low: int, high: int) -> Rule:
    return Rule(f"a multiple of {step} in [{_num(low)}, {_num(high)}]",
                lambda v: low <= v <= high and v % step == 0)


def power_of_two(low: int, high: int) -> Rule:
    """A power of two in [low, high]."""
    return Rule(f"a power of two in [{_num(low)}, {_num(high)}]",
                lambda v: low <= v <= high and v & (v - 1) == 0)


def one_of(*choices: str, hint: str = "") -> Rule:
    return Rule("one of " + ", ".join(repr(c) for c in choices), lambda v: v in choices, hint)


def matches(pattern: str, text: str, extra: Callable[[str], bool] = lambda v: True) -> Rule:
    """A free string in a format: ``pattern`` (a full match) and ``extra(value)``."""
    compiled = re.compile(pattern)
    return Rule(text, lambda v: compiled.fullmatch(v) is not None and extra(v))


def _finite(v: float) -> bool:
    return isinstance(v, int) or math.isfinite(v)  # ints are exact, and may exceed a float


def _num(x: float) -> str:
    """2^n for large powers of two (2^32 reads better than 4294967296), else as given."""
    if isinstance(x, int) and x >= 1 << 16 and x & (x - 1) == 0:
        return f"2^{x.bit_length() - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)
