"""Replica operations: what several learners training one model exchange to stay one model.

A :class:`Replica` (``learner.replica``) is one learner's side of it. It reads and
writes the learner's dense parameters, row tables, gradients, label table and counts
in the forms a transport moves (flat float32 CPU buffers, int64 row ids, label lists)
and never communicates itself: ``consumers/distributed.py`` (replica averaging at each
sync) and ``consumers/allreduce.py`` (gradient all-reduce every step) carry the buffers
between processes with torch.distributed and compose these operations:

- averaging: :meth:`Replica.merge_labels` of every replica's :attr:`Replica.labels`
  (rank 0's first); per table the union of every replica's :meth:`Replica.take_touched`
  ids; :meth:`Replica.dense_values` and :meth:`Replica.row_values` of that union, summed
  over the replicas and divided by their number, go back through
  :meth:`Replica.set_dense_values` and :meth:`Replica.set_row_values`;
- all-reduce: after backward, :meth:`Replica.dense_gradients` and
  :meth:`Replica.row_gradients`, summed over the replicas that brought a batch and
  divided by their number, go back through :meth:`Replica.set_dense_gradients` and
  :meth:`Replica.set_row_gradients` before the optimizers step;
- counts (the Naive Bayes part, counted and never learned by gradient): each replica's
  :meth:`Replica.count_delta` since a base every replica shares, summed, goes back
  through :meth:`Replica.add_counts`;
- counts that neither add up nor average (the token tasks' Kneser-Ney tables and their
  candidate index: :meth:`Task.replayed_tables <streamlearn.tasks.base.Task.replayed_tables>`):
  from :meth:`Replica.keep_log` on, each replica's :meth:`Replica.log` of what it counted,
  every replica's in rank order, goes to :meth:`Replica.merge_logs`, which replays them
  from the state of the last merge (the same on every replica); averaging and count sums
  leave these tables out;
- :meth:`Replica.digest`: equal replicas, equal digests.

Layouts are fixed so that every replica packs the same buffer: dense parameters in the
model's parameter order, tables by sorted store name, rows in the order given.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash

from .objectives import LabelTable

if TYPE_CHECKING:  # the learner builds its replica; nothing here imports it at run time
    from .learner import Learner

__all__ = ["Replica"]

_DIGEST_SEED = 0x5CA1E0
RowGradient = tuple[torch.Tensor, torch.Tensor]  # ids (n,) int64, rows (n, w) float32


class Replica:
    """One learner as a replica of a group (see the module docstring). Holds no state of
    its own: every call reads or writes the learner."""

    def __init__(self, learner: "Learner"):
        self.learner = learner

    # ------------------------------------------------------------------ dense parameters
    def _dense(self) -> list[torch.nn.Parameter]:
        return list(self.learner.model.dense_parameters().values())

    @property
    def dense_size(self) -> int:
        """Values in every dense (non-row) parameter: :meth:`dense_values`' length."""
        return sum(p.numel() for p in self._dense())

    def dense_values(self) -> torch.Tensor:
        """Every dense parameter flattened into one (D,) float32 CPU buffer."""
        parts = [p.detach().float().reshape(-1).cpu() for p in self._dense()]
        return torch.cat(parts) if parts else torch.zeros(0)

    def set_dense_values(self, flat: torch.Tensor) -> None:
        """Write a (D,) buffer laid out like :meth:`dense_values` into the parameters."""
        at = 0
        with torch.no_grad():
            for p in self._dense():
                p.copy_(flat[at:at + p.numel()].view_as(p).to(p.dtype))
                at += p.numel()

    def dense_gradients(self, label_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(present, flat)``: per dense parameter 1.0 if it holds a gradient, else 0.0
        (P,); and every gradient flattened into one float32 CPU buffer (zeros where none).
        Of the label parameters (:meth:`~streamlearn.tasks.base.Task.label_parameters`)
        only the first ``label_rows`` rows travel: a row past the group's labels is never
        read, so its gradient is zero everywhere (1,024 rows by default, for a stream of
        a few labels: most of a step's dense bytes)."""
        dense, used = self._dense(), self._used_rows(label_rows)
        present = torch.tensor([float(p.grad is not None) for p in dense])  # (P,)
        grads = [_leading(p.grad if p.grad is not None else torch.zeros_like(p), used.get(id(p))).float()
                 .reshape(-1).cpu() for p in dense]
        return present, torch.cat(grads) if grads else torch.zeros(0)

    def set_dense_gradients(self, present: Sequence[float], flat: torch.Tensor, label_rows: int) -> None:
        """Put gradients laid out like :meth:`dense_gradients` (the same ``label_rows``)
        on the parameters; a parameter whose ``present`` is 0 gets none (the optimizer
        then leaves it, as it would on a batch that did not reach it)."""
        dense, used = self._dense(), self._used_rows(label_rows)
        at = 0
        for p, has in zip(dense, present):
            part = _leading(p, used.get(id(p)))
            g = torch.zeros_like(p, device="cpu", dtype=torch.float32)
            _leading(g, used.get(id(p))).copy_(flat[at:at + part.numel()].view_as(part))
            p.grad = g.to(p.device, p.dtype) if has else None
            at += part.numel()

    def _used_rows(self, label_rows: int) -> dict[int, int]:
        """id(parameter) -> leading rows that travel, for the label parameters."""
        learner = self.learner
        return {id(p): label_rows for p in learner.task.label_parameters(learner.model)}

    # ------------------------------------------------------------------ row tables
    def tables(self) -> dict[str, torch.Tensor]:
        """Every row table by store name, sorted: the embedding's, the task's count
        tables (``"nb.counts"``) and the row optimizer's state (``"E.sum"``, ...)."""
        return dict(sorted(self.learner.row_tables().items()))

    def take_touched(self) -> dict[str, np.ndarray]:
        """Per table of :meth:`tables` (sorted) but the replayed ones, the sorted row ids
        changed since the last call or checkpoint (empty where none); consumes them like
        :meth:`Learner.take_dirty <streamlearn.learner.Learner.take_dirty>` (the replayed
        tables' stay dirty: :meth:`merge_logs` adds its own)."""
        dirty, empty = self.learner.take_dirty(), np.zeros(0, np.int64)
        replayed = self.learner.task.replayed_tables()
        self.learner.mark_dirty({name: ids for name, ids in dirty.items() if name in replayed})
        return {name: dirty.get(name, empty) for name in self.tables() if name not in replayed}

    def row_values(self, rows: Mapping[str, np.ndarray]) -> torch.Tensor:
        """(n,) float32 CPU: rows ``rows[name]`` of each named table, tables in sorted
        name order, rows in the given order, flattened."""
        tables = self.tables()
        parts = [tables[n].detach()[torch.from_numpy(ids).to(tables[n].device)].float().reshape(-1).cpu()
                 for n, ids in sorted(rows.items())]
        return torch.cat(parts) if parts else torch.zeros(0)

    def set_row_values(self, flat: torch.Tensor, rows: Mapping[str, np.ndarray]) -> None:
        """Write a buffer laid out like :meth:`row_values` (the same ``rows``) into the
        tables. The rows become dirty: the next checkpoint stores them."""
        tables, at = self.tables(), 0
        with torch.no_grad():
            for name, ids in sorted(rows.items()):
                t = tables[name]
                n = len(ids) * t.shape[1]
                t[torch.from_numpy(ids).to(t.device)] = flat[at:at + n].view(len(ids), t.shape[1]).to(t.device, t.dtype)
                at += n
        self.learner.mark_dirty(rows)

    # ------------------------------------------------------------------ row gradients
    @property
    def gradient_tables(self) -> list[str]:
        """The row tables learned by gradient (the row optimizer's), sorted by name."""
        return sorted(self.learner.row_optim.tables)

    def row_gradients(self) -> dict[str, RowGradient]:
        """Per table of :attr:`gradient_tables`, the rows its gradient reaches: unique
        ids (n,) int64 and their gradient rows (n, w) float32, on the CPU (n = 0 when
        the table holds no gradient)."""
        tables = self.learner.row_optim.tables
        return {name: _rows(tables[name]) for name in self.gradient_tables}

    def set_row_gradients(self, grads: Mapping[str, RowGradient | None]) -> None:
        """Give each table of :attr:`gradient_tables` its gradient: ids (n,) that may
        repeat and rows (n, w); repeats are summed in the order given (the same sum on
        every replica that gives the same order). None: no gradient."""
        tables = self.learner.row_optim.tables
        for name in self.gradient_tables:
            grad, table = grads.get(name), tables[name]
            table.grad = None if grad is None else (
                torch.sparse_coo_tensor(grad[0][None], grad[1], table.shape, check_invariants=False).coalesce()
                .to(table.device, table.dtype))

    # ------------------------------------------------------------------ labels
    @property
    def labels(self) -> list | None:
        """This replica's labels in id order; None for a task without a label table."""
        table = self.learner.label_table
        return None if table is None else list(table.labels)

    def copy_labels(self) -> LabelTable:
        """A copy of the label table (a group's table starts as a replica's). This and
        the label operations below need a task with labels (:attr:`labels` not None)."""
        table = self.learner.label_table
        return LabelTable(table.capacity, list(table.labels))

    def merge_labels(self, tables: Sequence[Sequence]) -> None:
        """Take the merge of every replica's labels (``tables`` in rank order; each
        table's labels not yet merged join in their order) and :meth:`permute_labels`
        to it. Every replica given the same ``tables`` ends with the same label ids.
        Raises LabelCapacityError when they hold more labels than the head has rows."""
        merged = LabelTable(self.learner.label_table.capacity)
        for labels in tables:
            for label in labels:
                merged.add(label)
        self.permute_labels(merged.labels)

    def permute_labels(self, labels: Sequence) -> None:
        """The label table becomes ``labels`` (every label it holds, maybe more); the
        rows of the label parameters and their AdamW moments move to each label's new
        id, and a label new to this replica starts its row as a learner starts a label a
        batch brings (the same on every replica)."""
        table, learner = self.learner.label_table, self.learner
        if list(labels) == table.labels:
            return
        old = [table.get(label) for label in labels]
        for param in learner.task.label_parameters(learner.model):
            _permute_rows(param, old)
            for moment in learner.dense_optim.state.get(param, {}).values():
                if torch.is_tensor(moment) and moment.shape == param.shape:
                    _permute_rows(moment, old)
        table.replace(list(labels))
        self.start_label_rows([j for j, i in enumerate(old) if i is None])

    def replace_labels(self, labels: Sequence) -> None:
        """The label table becomes ``labels`` and no row moves: for a replica whose label
        rows are in that order already (the all-reduce maps each batch's targets to the
        group's ids before learning it)."""
        self.learner.label_table.replace(list(labels))

    def start_label_rows(self, ids: Sequence[int], labels: Sequence | None = None) -> None:
        """Give label rows ``ids`` the starting vectors of ``labels`` (default: the label
        table's), as :meth:`Learner.start_label_rows
        <streamlearn.learner.Learner.start_label_rows>`: for a label a replica takes from
        the group rather than from a batch."""
        self.learner.start_label_rows(ids, labels)

    # ------------------------------------------------------------------ counts
    def counts(self) -> dict[str, torch.Tensor]:
        """A copy of every count table (learned by counting, not by gradient; the Naive
        Bayes part's ``"nb.counts"``), sorted by name; {} when the task has none. The
        base of a later :meth:`count_delta`. Replayed tables are left out (:meth:`merge_logs`)."""
        task = self.learner.task
        replayed = task.replayed_tables()
        return {n: t.clone() for n, t in sorted(task.count_tables().items()) if n not in replayed}

    def keep_log(self, on: bool = True) -> None:
        """Start keeping this replica's :meth:`log` (call it while every replica is equal:
        the state now is the base every merge replays from); ``on=False`` stops."""
        self.learner.task.keep_log(on)

    def log(self) -> Any:
        """What this replica counted since the last merge (picklable: the transport
        gathers it from every replica)."""
        return self.learner.task.log()

    def merge_logs(self, logs: Sequence[Any]) -> None:
        """Take every replica's :meth:`log` (rank order, this one's among them): the
        replayed tables and the candidate index become what one learner counting them all
        would hold, equal on every replica given the same ``logs``; the rows that changed
        become dirty, so the next checkpoint stores them."""
        self.learner.mark_dirty(self.learner.task.merge_logs(logs))

    def count_delta(self, base: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """(C,) float32: what this replica counted since ``base`` (a :meth:`counts`),
        every count table flattened in name order."""
        tables = self.learner.task.count_tables()
        parts = [(tables[n] - b).reshape(-1) for n, b in base.items()]
        return torch.cat(parts) if parts else torch.zeros(0)

    def add_counts(self, base: Mapping[str, torch.Tensor], delta: torch.Tensor) -> None:
        """The count tables become ``base + delta`` (``delta`` laid out like
        :meth:`count_delta`'s: e.g. the sum of every replica's); the rows that changed
        become dirty, so the next checkpoint stores them."""
        tables, at, changed = self.learner.task.count_tables(), 0, {}
        for name, b in base.items():
            d = delta[at:at + b.numel()].view_as(b)  # (rows, w)
            tables[name].copy_(b + d)  # in place: the part's numpy view shares the memory
            changed[name] = d.ne(0).any(1).nonzero().flatten().numpy()
            at += b.numel()
        self.learner.mark_dirty(changed)

    # ------------------------------------------------------------------ digest
    def digest(self) -> str:
        """xxh3 digest of every dense parameter and row table: equal replicas, equal
        digests (a log line per sync lets an operator compare them)."""
        h = xxhash.xxh3_64(seed=_DIGEST_SEED)
        for _, p in sorted(self.learner.model.dense_parameters().items()):
            h.update(p.detach().float().cpu().numpy().tobytes())
        for t in self.tables().values():
            h.update(t.detach().float().cpu().numpy().tobytes())
        return h.hexdigest()


def _leading(t: torch.Tensor, rows: int | None) -> torch.Tensor:
    """The first ``rows`` rows of ``t`` (all of it when None), a view."""
    return t if rows is None else t[:rows]


def _rows(p: torch.Tensor) -> RowGradient:
    """Unique row ids (n,) and their gradient rows (n, w) of a row table's gradient."""
    if p.grad is None:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, p.shape[1])
    grad = p.grad.detach()
    if grad.is_sparse:
        grad = grad.coalesce()
        return grad.indices()[0].cpu(), grad.values().float().cpu()
    idx = grad.ne(0).any(dim=1).nonzero().squeeze(1)  # a dense gradient: the rows it reaches
    return idx.cpu(), grad.index_select(0, idx).float().cpu()


def _permute_rows(t: torch.Tensor, old: list[int | None]) -> None:
    """Row j becomes old row ``old[j]`` (zero when None); rows past ``len(old)`` become zero."""
    with torch.no_grad():
        fresh = torch.zeros_like(t)
        for j, i in enumerate(old):
            if i is not None:
                fresh[j] = t.data[i]
        t.data.copy_(fresh)
