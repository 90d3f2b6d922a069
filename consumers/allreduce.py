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
gradients: the replicas stay bit-equal (:meth:`~streamlearn.sync.Replica.digest`). A rank
that brought nothing steps too, through :meth:`GradientExchange.idle`.

The buffers are the library's (:class:`streamlearn.sync.Replica`, ``learner.replica``:
the gradients flattened, the touched rows, the labels, the count deltas, and how each
goes back into the learner); this module moves them between the ranks.

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
changes since the last one on every rank (one all-reduce of the table's deltas). The
token tasks' count part and candidate index are counted too, and every sync replays
every rank's log of them (:func:`~.distributed.merge_logs`), as averaging does.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from ..exceptions import LabelCapacityError, StreamlearnError
from ..learner import Batch, Learner
from ..sync import RowGradient
from .distributed import DistributedError, Group, SyncReport, all_gather, all_reduce, merge_logs

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
        self.replica = learner.replica  # what moves (streamlearn.sync); this class moves it
        # the group's label table (None: a token task, which has none)
        self.labels = self.replica.copy_labels() if self.replica.labels is not None else None
        self._to_group = list(range(self._label_rows))  # local label id -> group label id
        self._tables = self.replica.gradient_tables  # the same order on every rank
        self._flags: dict[str, int] | None = None
        self._offered: list = []  # local labels this rank shares this round
        self.last: Round | None = None
        self.failed: DistributedError | None = None  # set by a failed exchange inside the hook
        self.bytes = 0  # handed to collectives since the last sync
        self.rounds = 0
        self.seconds = 0.0
        # The count tables (Naive Bayes) as of the last sync (equal on every rank): no
        # gradient carries counts, so each sync adds up the ranks' changes since (_share_counts).
        self._count_base = self.replica.counts()
        learner.gradient_hook = self._hook

    # ------------------------------------------------------------------ labels
    @property
    def _label_rows(self) -> int:
        return 0 if self.labels is None else len(self.labels)

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
        if self.labels is None:
            return
        self._map(list(self.learner.labels[len(self._to_group):]))
        self.replica.replace_labels(self.labels.labels)
        self._to_group = list(range(len(self.labels)))

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
            self.replica.start_label_rows(range(first, len(self.labels)), self.labels.labels[first:])

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
        rows = self.replica.row_gradients()  # per table: ids (n,), values (n, w)
        slot = len(_FLAGS) + len(self._tables)
        head = torch.zeros(world, slot)  # (W, S): each rank writes its own slot, the sum gathers them
        head[rank, :len(_FLAGS)] = torch.tensor([float(flags[f]) for f in _FLAGS])
        head[rank, len(_FLAGS):] = torch.tensor([float(len(rows[n][0])) for n in self._tables])
        # A label row past the group's labels is never read: its gradient is zero everywhere.
        has, grads = self.replica.dense_gradients(self._label_rows)  # (P,), (D,): D the rows in use
        flat = all_reduce(torch.cat([head.reshape(-1), has, grads]))  # (W*S + P + D,)
        sent = flat.numel() * 4
        head = flat[:world * slot].view(world, slot)
        self.last = Round(*(int(head[:, i].sum()) for i in range(len(_FLAGS))))
        contributors = self.last.batches
        if contributors:  # assigned only once every collective succeeded: no half-reduced step
            sparse, n_bytes = self._exchange_rows(rows, head[:, len(_FLAGS):].long(), contributors)
            at = world * slot + len(has)
            self.replica.set_dense_gradients(flat[world * slot:at].tolist(), flat[at:] / contributors,
                                             self._label_rows)
            self.replica.set_row_gradients(sparse)
            sent += n_bytes
        self.bytes += sent
        self.rounds += 1
        self.seconds += time.perf_counter() - started
        return bool(contributors)

    def _exchange_rows(self, rows: dict[str, RowGradient], counts: torch.Tensor,
                       contributors: int) -> tuple[dict[str, RowGradient | None], int]:
        """All-gather every rank's touched rows and their gradients; return per table
        every rank's ids and their rows over ``contributors``, in rank order (None: no
        rank touched it), and the bytes sent. ``counts`` (W, T): rows per rank and table."""
        if not int(counts.sum()):
            return {}, 0
        mine = [rows[n] for n in self._tables]
        widths = torch.tensor([v.shape[1] for _, v in mine])  # (T,)
        n_ids, n_values = counts.sum(1), (counts * widths).sum(1)  # (W,), (W,)
        ids = _padded(torch.cat([i for i, _ in mine]), int(n_ids.max()), -1)
        values = _padded(torch.cat([v.reshape(-1) for _, v in mine]), int(n_values.max()), 0.0)
        all_ids, all_values = all_gather(ids), all_gather(values)
        id_at = (torch.cumsum(counts, 1) - counts).tolist()  # (W, T): where each table starts in a rank's ids
        value_at = (torch.cumsum(counts * widths, 1) - counts * widths).tolist()
        n = counts.tolist()
        out: dict[str, RowGradient | None] = {}
        for t, name in enumerate(self._tables):
            w = int(widths[t])
            parts = [(all_ids[r][id_at[r][t]:id_at[r][t] + n[r][t]],
                      all_values[r][value_at[r][t]:value_at[r][t] + n[r][t] * w].view(-1, w))
                     for r in range(len(all_ids))]
            idx = torch.cat([i for i, _ in parts])  # (n,) rank order: the same sum on every rank
            out[name] = (idx, torch.cat([v for _, v in parts]) / contributors) if len(idx) else None
        return out, ids.numel() * 8 + values.numel() * 4

    # ------------------------------------------------------------------ syncs
    def settle(self) -> SyncReport:
        """At a sync: the learner takes the group's label table; returns what the rounds
        since the last sync handed to collectives (and clears the counts)."""
        self.settle_labels()
        self.bytes += self._share_counts()
        if self.group is not None:
            try:
                self.bytes += merge_logs(self.replica)
            except RuntimeError as exc:
                raise DistributedError(f"merging the counts failed (a peer stopped, died or did not answer "
                                       f"within {self.group.settings.timeout_s:g} s): {exc}") from exc
        report = SyncReport(self.seconds, self.bytes, self.replica.dense_size, {}, self.rounds)
        self.bytes, self.rounds, self.seconds = 0, 0, 0.0
        return report

    def _share_counts(self) -> int:
        """Every rank adds the group's count changes (the Naive Bayes part) since the last
        sync (one all-reduce of the deltas, the same sum on every rank), so the replicas'
        counts are equal again; between syncs each counts only its own batches. Returns
        the bytes handed to the collective."""
        if not self._count_base or self.group is None:
            return 0
        delta = self.replica.count_delta(self._count_base)  # (C,)
        try:
            total = all_reduce(delta)
        except RuntimeError as exc:
            raise DistributedError(f"sharing the Naive Bayes counts failed (a peer stopped, died or did not "
                                   f"answer within {self.group.settings.timeout_s:g} s): {exc}") from exc
        self.replica.add_counts(self._count_base, total)
        self._count_base = self.replica.counts()
        return delta.numel() * 4

    def go_solo(self) -> None:
        """Stop exchanging (the group broke or a peer finished); labels keep mapping."""
        self.group = None
        self._flags = None
        self.learner.gradient_hook = None


def _padded(t: torch.Tensor, width: int, fill: float) -> torch.Tensor:
    out = torch.full((max(width, 1),), fill, dtype=t.dtype)
    out[:len(t)] = t
    return out


