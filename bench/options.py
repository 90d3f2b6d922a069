"""The command line every bench script shares: its parser, and option types that reject a
value out of range before any work, with argparse's one-line usage error (exit 2).

>>> positive_int("3"), nonneg_int("0"), names(("mlm", "next-token"))("mlm,next-token")
(3, 0, ['mlm', 'next-token'])
>>> positive_int("-1")
Traceback (most recent call last):
argparse.ArgumentTypeError: -1 is not a whole number of at least 1
>>> names(("mlm", "next-token"))("mlm,foo")
Traceback (most recent call last):
argparse.ArgumentTypeError: 'foo' is not one of mlm, next-token (comma-separated)
"""
from __future__ import annotations

import argparse
import math
import sys
from typing import Callable, Iterable, TypeVar

T = TypeVar("T")


def run_main(main: Callable[[], int | None]) -> int:
    """A script's ``main()``, with streamlearn's refusals (a bad ``--set KEY=VALUE``, a
    config rule) as one line and exit status 2, as the ``streamlearn`` command has them."""
    from streamlearn.exceptions import StreamlearnError

    try:
        return int(main() or 0)
    except StreamlearnError as exc:
        print(f"{sys.argv[0]}: error: {exc}", file=sys.stderr)
        return 2


def parser_for(doc: str) -> argparse.ArgumentParser:
    """A parser whose ``--help`` opens with the first paragraph of the script's docstring
    ``doc``, whole (its first line alone can end mid-sentence)."""
    return argparse.ArgumentParser(description=" ".join(doc.split("\n\n")[0].split()))


def add_set_option(parser: argparse.ArgumentParser, what: str = "") -> None:
    """``--set KEY=VALUE``, repeatable: config overrides (``what``: for which runs)."""
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help=f"a config override{' ' + what if what else ''} (repeatable)")


def at_least(low: int) -> Callable[[str], int]:
    """An option type: a whole number ``>= low``."""
    return between(low, None)


def between(low: int, high: int | None) -> Callable[[str], int]:
    """An option type: a whole number from ``low`` to ``high`` (None: no bound)."""
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bounds = f"of at least {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"{text} is not a whole number {bounds}")
        return value
    return whole


positive_int = at_least(1)
nonneg_int = at_least(0)


def _number(text: str, zero: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise argparse.ArgumentTypeError(f"{text} is not a number {'>= 0' if zero else '> 0'}")
    return value


def positive_float(text: str) -> float:
    """An option type: a finite number > 0."""
    return _number(text, zero=False)


def nonneg_float(text: str) -> float:
    """An option type: a finite number >= 0."""
    return _number(text, zero=True)


def names(valid: Iterable[str]) -> Callable[[str], list[str]]:
    """An option type: a comma-separated list of names from ``valid``, each at most once."""
    valid = tuple(valid)

    def name(text: str) -> str:
        if text not in valid:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(valid)} (comma-separated)")
        return text
    return _listed(name)


def whole_numbers(low: int) -> Callable[[str], list[int]]:
    """An option type: a comma-separated list of whole numbers ``>= low``, each at most once."""
    return _listed(at_least(low))


def _listed(one: Callable[[str], T]) -> Callable[[str], list[T]]:
    def listed(text: str) -> list[T]:
        got = [one(part) for part in text.split(",")]
        if len(set(got)) < len(got):
            raise argparse.ArgumentTypeError(f"{text}: a value given twice")
        return got
    return listed

