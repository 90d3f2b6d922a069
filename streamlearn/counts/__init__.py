"""Count parts of the token-stream language model: n-gram statistics learned by counting,
kept in fixed-size hashed tables that are row tables (checkpointed by dirty rows, read
whole by snapshots). numpy and xxhash only: no torch op runs on them.

- :mod:`.table`: :class:`~.table.CountTable`, open addressing over 64-bit keys with two
  float32 values per slot, stored in a float32 tensor of 64-slot rows;
- :mod:`.kn`: :class:`~.kn.KneserNey3`, the interpolated Kneser-Ney trigram on two tables,
  scoring (slot, candidate) grids for next-token (P(w | u v)) and mlm (the "chain"), and
  :class:`~.kn.KneserNey4`, the same with a 4-gram order on top (next-token's P(w | x u v)).
"""
from .kn import KneserNey3, KneserNey4
from .table import ROW, CountTable

__all__ = ["ROW", "CountTable", "KneserNey3", "KneserNey4"]
