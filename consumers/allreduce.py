"""Gradient all-reduce: the workers of a group take every optimizer step together
(``worker.sync = "allreduce"``; the default, ``"average"``, is :func:`~.distributed.average_replicas`).

Rounds. The training loops of the group advance in lock-step rounds, because every
collective must be entered by every rank. In each round a rank either brings one batch
or nothing (its queue is empty, its next item is a checkpoint request, or its fetch
thread finished); everyone exchanges, in the same order:

1. ONE all_reduce (sum) of a float32 buffer: per rank a slot of flags (has a batch, waits
   for a sync, finished, labels to share) and its sparse row counts per table; one "has a
   gradient" flag per dense parameter; every dense gradient, flattened (zeros from a rank
   without a batch);
2. if any rank brought a batch and touched rows: all_gather of the padded row ids (int64),
   then of the padded row gradient values (float32); every rank concatenates them in rank
   order and coalesces (duplicates summed, the same arithmetic on every rank).

Both sums are divided by the number of ranks that brought a batch (a rank with nothing
contributes zeros; dividing by the world size would shrink the step whenever a rank is
idle), so the step is the mean of the batch gradients, as one batch of their union would
give with a per-batch mean loss. Every rank then steps the same optimizers with the same
gradients: the replicas stay bit-equal (:func:`~.distributed.replica_digest`). A rank that
brought nothing steps too, through :meth:`GradientExchange.idle`.

Labels. A batch's label ids are assigned by its rank's fetch thread, in that rank's order
of first appearance, so two ranks can give one id to two labels. The group keeps one
label table (the learner's at the last sync, then new labels in rank order, shared by
all_gather_object in a round whose flags ask for it); each batch's targets are mapped
to group ids before it is learned, so the label head's rows are in the group's order on
every replica. At a sync (every fetch thread waits, no prepared batch is pending) the
learner's own table becomes the group table, which is then again the identity mapping.

Compared with averaging: a collective every step instead of every sync (the slowest
rank sets every step's pace), no drift between the replicas, and one more caveat on a
peer's death: the survivors' model already holds the dead rank's gradients since the last
sync, and its records are consumed again, so they count twice in the model (the offsets
and the audit stay exactly-once). bench/scaleout.py measures both modes.

The Naive Bayes counts (``learner.nb_weight > 0``) are counted, not learned, so no round
carries them: each rank counts its own batches, and every sync adds the group's count
changes since the last one on every rank (one all-reduce of the table's deltas).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..exceptions import StreamlearnError
from ..learner import Batch, Learner
from ..objectives import LabelCapacityError, LabelTable
from .distributed import DistributedError, Group, SyncReport, all_gather, all_reduce

_FLAGS = ("batch", "sync", "finished", "new_labels")


@dataclass(frozen=True)
class Round:
    """What every rank brought to one round: ranks with a batch, ranks waiting for a
    sync, ranks whose fetch thread finished, labels to share (all ranks together)."""

    batches: int
    syncs: int
    finished: int
    new_labels: int


class GradientExchange:
    """One rank's side of the rounds (see the module docstring). Installs itself as the
    learner's ``gradient_hook``; :meth:`go_solo` removes it (label mapping goes on).

    Per round: :meth:`offer` this rank's flags, then either learn a batch that is
    :meth:`ready` (after :meth:`to_group_labels`; the hook exchanges) or call :meth:`idle`;
    then read :attr:`last` and :meth:`share_labels` if it asks for it.
    """

    def __init__(self, learner: Learner, group: Group):
        self.learner, self.group = learner, group
        self.labels = LabelTable(learner.label_table.capacity, list(learner.labels))  # the group's table
        self._to_group = list(range(len(self.labels)))  # local label id -> group label id
        self._tables = sorted(learner.row_optim.tables)  # the same order on every rank
        self._flags: dict[str, int] | None = None
        self._offered: list = []  # local labels this rank shares this round
        self.last: Round | None = None
        self.failed: DistributedError | None = None  # set by a failed exchange inside the hook
        self.bytes = 0  # handed to collectives since the last sync
        self.rounds = 0
        self.seconds = 0.0
        # The Naive Bayes counts as of the last sync (equal on every rank): no gradient
        # carries counts, so each sync adds up the ranks' changes since (_share_counts).
        self._nb_base = learner.task.nb.counts.clone() if getattr(learner.task, "nb", None) is not None else None
        learner.gradient_hook = self._hook

    # ------------------------------------------------------------------ labels
    def ready(self, batch: Batch) -> bool:
        """True when every label of ``batch`` has a group id (else share first)."""
        return batch.n_labels <= len(self._to_group)

    def to_group_labels(self, batch: Batch) -> None:
        """Map the batch's targets to group label ids, in place (once, before learning)."""
        if "labels" not in batch.targets:
            return
        if self.group is None:  # alone: new local labels join the table directly
            self._map(list(self.learner.labels[len(self._to_group):batch.n_labels]))
        ids = batch.targets["labels"]
        batch.targets["labels"] = np.asarray(self._to_group, dtype=np.int64)[ids] if len(ids) else ids
        batch.n_labels = batch.label_start = len(self.labels)  # rows start when labels join the group

    def share_labels(self) -> None:
        """Every rank's offered labels join the group table in rank order (a collective)."""
        gathered: list = [None] * self.group.world_size
        try:
            dist.all_gather_object(gathered, self._offered)
        except RuntimeError as exc:
            raise DistributedError(f"sharing new labels failed (a peer stopped or died): {exc}") from exc
        for labels in gathered:
            self._add(labels)
        self._map(self._offered)

    def settle_labels(self) -> None:
        """Make the learner's table the group table (only while no prepared batch is
        pending: the fetch thread waits for a checkpoint)."""
        self._map(list(self.learner.labels[len(self._to_group):]))
        table = self.learner.label_table
        table.replace(self.labels.labels)
        self._to_group = list(range(len(table.labels)))

    def _map(self, labels: list) -> None:
        self._add(labels)
        self._to_group += [self.labels.get(label) for label in labels]

    def _add(self, labels: list) -> None:
        """New labels join the group table; every replica starts their label head rows
        alike (a function of the seed and the label), as one learner does when a batch
        brings a label."""
        first = len(self.labels)
        try:
            for label in labels:
                self.labels.add(label)
        except LabelCapacityError as exc:
            raise StreamlearnError(f"the workers together saw more labels than the table holds: {exc}") from exc
        if len(self.labels) > first:
            self.learner.start_label_rows(range(first, len(self.labels)), self.labels.labels[first:])

    # ------------------------------------------------------------------ rounds
    def offer(self, batch: bool, sync: bool = False, finished: bool = False) -> None:
        """This rank's flags for the next round (call once per round, before learning or
        :meth:`idle`)."""
        self._offered = list(self.learner.labels[len(self._to_group):])
        self._flags = {"batch": int(batch), "sync": int(sync), "finished": int(finished),
                       "new_labels": len(self._offered)}

    def idle(self) -> Round:
        """Take part in a round without a batch: exchange zeros and, if any rank brought
        a batch, take the same optimizer step. Raises DistributedError."""
        if self._flags is None or self._flags["batch"]:
            raise StreamlearnError("offer(batch=False) before idle(): every rank must enter every round")
        try:
            stepped = self._exchange()
        except RuntimeError as exc:
            raise self._error(exc) from exc
        if stepped:
            self.learner.apply_gradients()  # the group's step, as the ranks that learned a batch take it
        return self.last

    def _hook(self, learner: Learner) -> None:
        if self.group is None:
            return
        if self._flags is None or not self._flags["batch"]:
            raise StreamlearnError("offer(batch=True) before learning a batch: every rank must enter every round")
        try:
            self._exchange()
        except RuntimeError as exc:  # the local gradients stay: this step is this rank's alone
            self.failed = self._error(exc)

    def _error(self, exc: BaseException) -> DistributedError:
        self._flags = None
        return DistributedError(f"gradient all-reduce failed (a peer stopped, died or did not answer within "
                                f"{self.group.settings.timeout_s:g} s): {exc}")

    def _exchange(self) -> bool:
        """One round's collectives; leaves the mean gradients on the parameters. True
        when any rank brought a batch (then every rank must step)."""
        started = time.perf_counter()
        world, rank, flags = self.group.world_size, self.group.rank, self._flags
        self._flags = None
        dense = list(self.learner.model.dense_parameters().values())
        rows = [_rows(self.learner.row_optim.tables[n]) for n in self._tables]  # per table (ids (n,), values (n, w))
        slot = len(_FLAGS) + len(self._tables)
        head = torch.zeros(world, slot)  # (W, S): each rank writes its own slot, the sum gathers them
        head[rank, :len(_FLAGS)] = torch.tensor([float(flags[f]) for f in _FLAGS])
        head[rank, len(_FLAGS):] = torch.tensor([float(len(ids)) for ids, _ in rows])
        has = torch.tensor([float(p.grad is not None) for p in dense])  # (P,)
        used = self._used_rows()
        grads = [_leading(p.grad if p.grad is not None else torch.zeros_like(p), used.get(id(p))).float()
                 .reshape(-1).cpu() for p in dense]
        flat = all_reduce(torch.cat([head.reshape(-1), has, *grads]))  # (W*S + P + D,), D: the rows in use
        sent = flat.numel() * 4
        head = flat[:world * slot].view(world, slot)
        self.last = Round(*(int(head[:, i].sum()) for i in range(len(_FLAGS))))
        contributors = self.last.batches
        if contributors:  # assigned only once every collective succeeded: no half-reduced step
            sparse, n_bytes = self._exchange_rows(rows, head[:, len(_FLAGS):].long(), contributors)
            at = world * slot + len(dense)
            for p, present in zip(dense, flat[world * slot:at].tolist()):
                part = _leading(p, used.get(id(p)))
                g = torch.zeros_like(p, device="cpu", dtype=torch.float32)
                _leading(g, used.get(id(p))).copy_(flat[at:at + part.numel()].view_as(part) / contributors)
                p.grad = g.to(p.device, p.dtype) if present else None
                at += part.numel()
            for name, grad in zip(self._tables, sparse):
                self.learner.row_optim.tables[name].grad = grad
            sent += n_bytes
        self.bytes += sent
        self.rounds += 1
        self.seconds += time.perf_counter() - started
        return bool(contributors)

    def _used_rows(self) -> dict[int, int]:
        """Leading rows in use of dense parameters that are mostly unused: the label head
        holds ``model.max_labels`` rows, and a row past the group's labels is never read,
        so its gradient is zero on every rank (1,024 rows by default, for a stream of a
        few labels: most of the dense bytes of a step)."""
        head = self.learner.model.head
        return {} if self.learner.label_table is None else {id(head.weight): len(self.labels), id(head.bias): len(self.labels)}

    def _exchange_rows(self, rows: list[tuple[torch.Tensor, torch.Tensor]], counts: torch.Tensor,
                       contributors: int) -> tuple[list[torch.Tensor | None], int]:
        """All-gather every rank's touched rows and their gradients; return per table the
        coalesced mean as a sparse gradient (None: no rank touched it) and the bytes
        sent. ``counts`` (W, T): rows per rank and table."""
        tables = [self.learner.row_optim.tables[n] for n in self._tables]
        if not int(counts.sum()):
            return [None] * len(tables), 0
        widths = torch.tensor([t.shape[1] for t in tables])  # (T,)
        n_ids, n_values = counts.sum(1), (counts * widths).sum(1)  # (W,), (W,)
        ids = _padded(torch.cat([i for i, _ in rows]), int(n_ids.max()), -1)
        values = _padded(torch.cat([v.reshape(-1) for _, v in rows]), int(n_values.max()), 0.0)
        all_ids, all_values = all_gather(ids), all_gather(values)
        id_at = (torch.cumsum(counts, 1) - counts).tolist()  # (W, T): where each table starts in a rank's ids
        value_at = (torch.cumsum(counts * widths, 1) - counts * widths).tolist()
        n = counts.tolist()
        out = []
        for t, table in enumerate(tables):
            w = table.shape[1]
            parts = [(all_ids[r][id_at[r][t]:id_at[r][t] + n[r][t]],
                      all_values[r][value_at[r][t]:value_at[r][t] + n[r][t] * w].view(-1, w))
                     for r in range(len(all_ids))]
            idx = torch.cat([i for i, _ in parts])  # (n,) rank order: the same sum on every rank
            if not len(idx):
                out.append(None)
                continue
            mean = torch.cat([v for _, v in parts]) / contributors  # (n, w)
            out.append(torch.sparse_coo_tensor(idx[None], mean, table.shape, check_invariants=False).coalesce()
                       .to(table.device, table.dtype))
        return out, ids.numel() * 8 + values.numel() * 4

    # ------------------------------------------------------------------ syncs
    def settle(self) -> SyncReport:
        """At a sync: the learner takes the group's label table; returns what the rounds
        since the last sync handed to collectives (and clears the counts)."""
        self.settle_labels()
        self.bytes += self._share_counts()
        dense = sum(p.numel() for p in self.learner.model.dense_parameters().values())
        report = SyncReport(self.seconds, self.bytes, dense, {}, self.rounds)
        self.bytes, self.rounds, self.seconds = 0, 0, 0.0
        return report

    def _share_counts(self) -> int:
        """Every rank adds the group's Naive Bayes count changes since the last sync (one
        all-reduce of the table's deltas, the same sum on every rank), so the replicas'
        counts are equal again; between syncs each counts only its own batches. Returns
        the bytes handed to the collective."""
        nb = getattr(self.learner.task, "nb", None)
        if nb is None or self.group is None:
            return 0
        delta = nb.counts - self._nb_base  # (rows, 64)
        try:
            total = all_reduce(delta)
        except RuntimeError as exc:
            raise DistributedError(f"sharing the Naive Bayes counts failed (a peer stopped, died or did not "
                                   f"answer within {self.group.settings.timeout_s:g} s): {exc}") from exc
        nb.counts.copy_(self._nb_base + total)  # in place: nb.flat views it
        self._nb_base = nb.counts.clone()
        self.learner.mark_dirty({"nb.counts": total.ne(0).any(1).nonzero().flatten().numpy()})
        return delta.numel() * 4

    def go_solo(self) -> None:
        """Stop exchanging (the group broke or a peer finished); labels keep mapping."""
        self.group = None
        self._flags = None
        self.learner.gradient_hook = None


def _rows(p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique row ids (n,) and their gradient rows (n, w) of a row table's gradient."""
    if p.grad is None:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, p.shape[1])
    grad = p.grad.detach()
    if grad.is_sparse:
        grad = grad.coalesce()
        return grad.indices()[0].cpu(), grad.values().float().cpu()
    idx = grad.ne(0).any(dim=1).nonzero().squeeze(1)  # a dense gradient: the rows it reaches
    return idx.cpu(), grad.index_select(0, idx).float().cpu()


def _leading(t: torch.Tensor, rows: int | None) -> torch.Tensor:
    """The first ``rows`` rows of ``t`` (all of it when None), a view."""
    return t if rows is None else t[:rows]


def _padded(t: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    out = torch.full((max(width, 1),), fill, dtype=t.dtype)
    out[:len(t)] = t
    return out


