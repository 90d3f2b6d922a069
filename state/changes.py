"""The change log: which row ids each of a store's last commits wrote.

A reader that holds the model of commit ``c`` (a serving snapshot) and finds the store at
commit ``n`` reads only the rows commits ``c+1 .. n`` wrote (:meth:`Store.changed_rows
<streamlearn.state.Store.changed_rows>`), not whole tables. The store writes one record per
commit, in the commit's own transaction, and keeps the last :data:`CHANGE_LOG`; a record it
no longer holds (an older commit, a store written before the log existed) reads as
unknown, and the reader falls back to reading everything.

A record is a JSON header (``{"table": number of ids, ...}``) and a newline, then every
table's ids as little-endian uint64, tables in the header's order, ids ascending.
"""
from __future__ import annotations

import json
from typing import Iterable, Mapping

import numpy as np

CHANGE_LOG = 16  # commits whose changed row ids a store keeps

_IDS = np.dtype("<u8")


def logged(since: int, until: int) -> range | None:
    """The commits whose records :meth:`Store.changed_rows` joins for a reader at commit
    ``since`` and a store at ``until``; None where the log cannot reach (a store behind the
    reader, more than :data:`CHANGE_LOG` commits between).

    >>> logged(3, 5), logged(5, 5), logged(5, 3), logged(0, CHANGE_LOG + 1)
    (range(4, 6), range(6, 6), None, None)
    """
    if not 0 <= since <= until or until - since > CHANGE_LOG:
        return None
    return range(since + 1, until + 1)


def change_key(commit: int) -> bytes:
    """The meta record of commit number ``commit`` (8 bytes big-endian: in commit order)."""
    return b"changes/" + commit.to_bytes(8, "big")


def encode_changes(ids: Mapping[str, np.ndarray]) -> bytes:
    """One commit's record: per table, the sorted unique row ids it wrote."""
    header = json.dumps({table: int(len(rows)) for table, rows in ids.items()}).encode()
    return b"".join([header, b"\n", *(np.asarray(rows, dtype=_IDS).tobytes() for rows in ids.values())])


def decode_changes(data: bytes) -> dict[str, np.ndarray] | None:
    """:func:`encode_changes`' ids per table (int64), or None for bytes that do not parse."""
    header, sep, body = bytes(data).partition(b"\n")
    try:
        counts = json.loads(header) if sep else None
    except ValueError:
        return None
    if not isinstance(counts, dict) or not all(isinstance(n, int) and n >= 0 for n in counts.values()):
        return None
    if len(body) != _IDS.itemsize * sum(counts.values()):
        return None
    flat = np.frombuffer(body, dtype=_IDS).astype(np.int64)
    out, at = {}, 0
    for table, n in counts.items():
        out[table] = flat[at:at + n]
        at += n
    return out


def union(records: Iterable[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The ids per table that any of ``records`` names, sorted and unique.

    >>> union([{"E": np.array([1, 5])}, {"E": np.array([5, 7]), "P": np.array([0])}])
    {'E': array([1, 5, 7]), 'P': array([0])}
    """
    parts: dict[str, list[np.ndarray]] = {}
    for record in records:
        for table, ids in record.items():
            parts.setdefault(table, []).append(ids)
    # one record's ids are sorted and unique already (the usual case: a reader one commit behind)
    return {table: chunks[0] if len(chunks) == 1 else np.unique(np.concatenate(chunks))
            for table, chunks in parts.items()}
