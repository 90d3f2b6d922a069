"""streamlearn: online hash-embedding transformers trained from Kafka streams.

The public API is deliberately short; everything else is reachable through its module.
"""
from ._version import __version__
from .config import Config, load_config
from .exceptions import StreamlearnError
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
