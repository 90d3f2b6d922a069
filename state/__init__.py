"""The model state store (installed as ``streamlearn.state``): sharded row tables, blobs,
key-value namespaces and a manifest, committed atomically with the consumed offsets.

>>> import numpy as np
>>> from streamlearn.state import Checkpoint, TableSpec, open_store
>>> with open_store(None, backend="memory") as store:
...     store.declare_tables([TableSpec("emb.E", rows=10, width=2)])
...     store.commit(Checkpoint(step=1, offsets={"t:0": 5},
...                             rows={"emb.E": (np.array([3]), np.ones((1, 2)))}))
...     values, found = store.read_rows("emb.E", np.array([3, 4]))
...     found.tolist(), store.manifest().offsets
([True, False], {'t:0': 5})

See docs/state.md for the layout and the commit protocol.
"""
from ..config import StoreConfig
from .base import Store
from .exceptions import (
    DamagedStoreError, DiskFullError, MapFullError, NotAStoreError, StateError, StoreBusyError,
    StorePermissionError,
)
from .factory import open_store
from .lmdb_file import check_readable, data_file_identity
from .schema import SCHEMA_VERSION, Checkpoint, Manifest, TableSpec, shard_of
from .verify import VerifyReport

__all__ = [
    "SCHEMA_VERSION",
    "Checkpoint",
    "DamagedStoreError",
    "DiskFullError",
    "Manifest",
    "MapFullError",
    "NotAStoreError",
    "StateError",
    "Store",
    "StoreBusyError",
    "StoreConfig",
    "StorePermissionError",
    "TableSpec",
    "VerifyReport",
    "check_readable",
    "data_file_identity",
    "open_store",
    "shard_of",
]
