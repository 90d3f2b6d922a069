"""streamlearn: online hash-embedding transformers trained from Kafka streams.

The public API is deliberately short; everything else is reachable through its module.
``Learner``, ``Snapshot`` and ``TokenHasher`` are imported on first use (PEP 562), so
``import streamlearn`` and the command line's ``--help`` do not pay for torch and river.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .config import Config, load_config
from .exceptions import StreamlearnError

if TYPE_CHECKING:
    from .hashing import TokenHasher
    from .learner import Learner
    from .snapshot import Snapshot

__all__ = [
    "Config",
    "Learner",
    "Snapshot",
    "StreamlearnError",
    "TokenHasher",
    "__version__",
    "load_config",
]

_LAZY = {"Learner": ".learner", "Snapshot": ".snapshot", "TokenHasher": ".hashing"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
