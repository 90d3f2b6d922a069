"""Several workers, one model: the torch.distributed process group, model averaging, fencing.

Two ways to keep the replicas one model (``worker.sync``): ``"average"`` (the default,
here) averages them at every sync and lets each replica run at its own speed in between
(local SGD: one round of collectives per sync); ``"allreduce"``
(:mod:`.allreduce`) sums the gradients of every step, so the replicas never drift but
every step waits for the slowest rank. bench/scaleout.py measures both in one run
(records/s, bytes exchanged, prequential and held-out accuracy against 1 worker).

What one sync (:func:`average_replicas`) exchanges, every rank in the same order:

1. the label tables (all_gather_object): workers see new labels in different orders, so
   the tables are merged (rank 0's labels first) and each replica permutes its label head
   rows to the merged ids before anything is averaged;
2. the ids of the rows each rank touched since the last sync, per row table and row
   optimizer state table (all_gather of counts, then of the padded ids);
3. one flat float32 buffer: every dense parameter, then the union rows of every table,
   summed by one all_reduce and divided by the world size.

Rows nobody touched are equal on every replica already (they were equal after the last
sync and nobody changed them), so only the union moves. The union is put back into the
learner's dirty rows, so the writer's next checkpoint stores every row any rank changed.
The dense optimizer's moments (AdamW) stay local: they describe each replica's own recent
gradients, and averaging them would need state every rank may not have yet.

Environment: :func:`dist_settings` is the one place that reads torchrun's variables.
"""
from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist
import xxhash

from ..checkpoint import fence_blob, stored_generation
from ..exceptions import ConfigError, StreamlearnError
from ..learner import Learner
from ..objectives import LabelCapacityError, LabelTable
from ..state import Checkpoint, Store

_DIGEST_SEED = 0x5CA1E0


class DistributedError(StreamlearnError):
    """A collective failed or timed out (a peer died or hung), or the replicas disagree."""


class StaleWorkerError(DistributedError):
    """A writer from an older group generation tried to overwrite newer state."""


@dataclass(frozen=True)
class DistSettings:
    """One process's place in the group. ``url``: ``tcp://host:port`` of rank 0's store."""

    rank: int
    world_size: int
    url: str
    backend: str = "gloo"
    timeout_s: float = 15.0  # a collective waiting longer than this means a dead or hung peer
    host_store: bool = True  # rank 0 hosts the TCPStore; False under torchrun, whose agent hosts it


def dist_settings(world_size: int | None = None, rank: int | None = None, url: str | None = None,
                  timeout_s: float = 15.0, environ: Mapping[str, str] | None = None) -> DistSettings | None:
    """Settings from explicit options, else from torchrun's ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT`` and ``TORCHELASTIC_USE_AGENT_STORE`` (the only reader
    of these variables). None: single worker.

    gloo on CPU, nccl when CUDA is available.
    """
    env = os.environ if environ is None else environ
    if world_size is None and "WORLD_SIZE" in env:
        world_size = _int_env(env, "WORLD_SIZE")
    if world_size is None or world_size == 1 and rank in (None, 0) and url is None:
        return None
    if rank is None:
        if "RANK" not in env:
            raise ConfigError("--world-size is set but not --rank (nor the RANK variable torchrun sets)")
        rank = _int_env(env, "RANK")
    if url is None:
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise ConfigError("pass --dist-url tcp://HOST:PORT (rank 0's address), or run under torchrun, "
                              "which sets MASTER_ADDR and MASTER_PORT")
        url = f"tcp://{env['MASTER_ADDR']}:{_int_env(env, 'MASTER_PORT')}"
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"need 0 <= rank < world size, got rank {rank}, world size {world_size}")
    if not url.startswith("tcp://"):
        raise ConfigError(f"--dist-url must look like tcp://HOST:PORT, got {url!r}")
    if timeout_s <= 0:
        raise ConfigError(f"the collective timeout must be > 0 s, got {timeout_s}")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return DistSettings(rank, world_size, url, backend, timeout_s, host_store=not agent_store)


def _int_env(env: Mapping[str, str], name: str) -> int:
    try:
        return int(env[name])
    except ValueError as exc:
        raise ConfigError(f"environment variable {name} must be an integer, got {env[name]!r}") from exc


class Group:
    """The process group of one run; :meth:`close` leaves it (idempotent).

    Every collective runs under ``settings.timeout_s``: a peer that died (SIGKILL closes
    its sockets, gloo fails at once) or hangs (the timeout) makes the call raise
    :class:`DistributedError`, after which the group is unusable and must be closed.
    """

    def __init__(self, settings: DistSettings):
        self.settings = settings
        host, _, port = settings.url[len("tcp://"):].rpartition(":")
        timeout = timedelta(seconds=settings.timeout_s)
        if settings.backend == "nccl":  # one GPU per rank on a host: torchrun's LOCAL_RANK, else rank mod GPUs
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", settings.rank % torch.cuda.device_count())))
        try:
            # Our own TCPStore (hosted by rank 0) also carries the sync requests (SyncClock).
            self.store = dist.TCPStore(host, int(port), settings.world_size,
                                       settings.rank == 0 and settings.host_store, timeout)
            dist.init_process_group(settings.backend, store=self.store, rank=settings.rank,
                                    world_size=settings.world_size, timeout=timeout)
        except (RuntimeError, ValueError) as exc:
            raise DistributedError(f"could not join the process group at {settings.url} as rank "
                                   f"{settings.rank} of {settings.world_size} within {settings.timeout_s:g} s: "
                                   f"{exc}; check that every rank uses the same --dist-url and --world-size") from exc
        self.open = True

    @property
    def rank(self) -> int:
        return self.settings.rank

    @property
    def world_size(self) -> int:
        return self.settings.world_size

    def close(self) -> None:
        if self.open:
            self.open = False
            try:
                dist.destroy_process_group()
            except (RuntimeError, ValueError):
                pass  # a group broken by a dead peer may fail to tear down; it is gone either way


@dataclass(frozen=True)
class SyncReport:
    """One sync: ``payload_bytes`` handed to collectives by this rank (ids + values; a ring
    all-reduce sends about 2 (W-1)/W of its part), ``rows`` averaged per table."""

    seconds: float
    payload_bytes: int
    dense_values: int
    rows: dict[str, int]
    exchanges: int = 1  # rounds of collectives behind it (all-reduce: one per step since the last sync)


def average_replicas(learner: Learner, group: Group) -> SyncReport:
    """Average this replica with every other rank's (see the module docstring); every
    rank must call it at the same point of its sync sequence. Raises DistributedError."""
    started = time.perf_counter()
    try:
        _merge_labels(learner, group)
        touched = learner.take_dirty()
        tables = learner.row_tables()
        union, id_bytes = _union_ids(touched, tables)
        dense = list(learner.model.dense_parameters().values())
        flat = _pack(dense, tables, union)  # (n,) float32
        flat = all_reduce(flat) / group.world_size
        _unpack(flat, dense, tables, union)
    except RuntimeError as exc:
        raise DistributedError(f"model sync failed (a peer stopped, died or did not answer within "
                               f"{group.settings.timeout_s:g} s): {exc}") from exc
    learner.mark_dirty(union)  # every averaged row changed here too: the next checkpoint stores it
    dense_values = sum(p.numel() for p in dense)
    return SyncReport(time.perf_counter() - started, id_bytes + flat.numel() * 4, dense_values,
                      {name: len(ids) for name, ids in union.items()})


def _merge_labels(learner: Learner, group: Group) -> None:
    """Give every replica the same label table: rank 0's labels, then each later rank's new
    ones in rank order. A replica whose label ids move permutes its label head rows (and
    their AdamW moments) to match; a label it never saw gets its starting row, as a
    learner gives a label that arrives (the same on every replica)."""
    if learner.label_table is None:
        return
    gathered: list = [None] * group.world_size
    dist.all_gather_object(gathered, list(learner.labels))
    table = learner.label_table
    merged = LabelTable(table.capacity)
    try:
        for labels in gathered:
            for label in labels:
                merged.add(label)
    except LabelCapacityError as exc:
        raise DistributedError(f"the replicas together saw more labels than the table holds: {exc}") from exc
    if merged.labels == table.labels:
        return
    old = [table.get(label) for label in merged.labels]
    head = learner.model.head
    for param in (head.weight, head.bias):
        _permute_rows(param, old)
        for moment in learner.dense_optim.state.get(param, {}).values():
            if torch.is_tensor(moment) and moment.shape == param.shape:
                _permute_rows(moment, old)
    table.replace(merged.labels)
    learner.start_label_rows([j for j, i in enumerate(old) if i is None])


def _permute_rows(t: torch.Tensor, old: list[int | None]) -> None:
    """Row j becomes old row ``old[j]`` (zero when None); rows past ``len(old)`` stay zero."""
    with torch.no_grad():
        fresh = torch.zeros_like(t)
        for j, i in enumerate(old):
            if i is not None:
                fresh[j] = t.data[i]
        t.data.copy_(fresh)


def _collective_device() -> torch.device:
    """Where a collective's buffers must be: NCCL moves CUDA tensors only, gloo CPU ones.
    Buffers are packed on the CPU (numpy ids, row gathers), so with NCCL they travel there
    and back: a sync moves a few MB, once every ``sync_every`` records."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the group, as a CPU tensor (``t`` is left as it was)."""
    buf = t.to(_collective_device(), copy=True)
    dist.all_reduce(buf)
    return buf.cpu()


def all_gather(t: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``t`` (same shape on every rank), in rank order, as CPU tensors."""
    buf = t.to(_collective_device())
    parts = [torch.empty_like(buf) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, buf)
    return [part.cpu() for part in parts]


def _union_ids(touched: dict[str, np.ndarray], tables: dict[str, torch.Tensor]) -> tuple[dict[str, np.ndarray], int]:
    """Per table (sorted store-name order, the same on every rank): the union of the ids
    every rank touched; and the bytes this rank sent for it."""
    names = sorted(tables)
    counts = torch.tensor([len(touched.get(n, ())) for n in names], dtype=torch.int64)  # (T,)
    all_counts = all_gather(counts)
    widest = int(max(int(c.sum()) for c in all_counts))
    mine = np.concatenate([touched.get(n, np.zeros(0, np.int64)) for n in names] or [np.zeros(0, np.int64)])
    padded = torch.full((max(widest, 1),), -1, dtype=torch.int64)  # (widest,)
    padded[:len(mine)] = torch.from_numpy(mine.astype(np.int64))
    gathered = all_gather(padded)
    union: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for rank_counts, ids in zip(all_counts, gathered):
        at = 0
        for name, n in zip(names, rank_counts.tolist()):
            union[name].append(ids[at:at + n].numpy())
            at += n
    merged = {n: np.unique(np.concatenate(parts)) for n, parts in union.items()}
    return {n: ids for n, ids in merged.items() if len(ids)}, (counts.numel() + padded.numel()) * 8


def _pack(dense: list[torch.Tensor], tables: dict[str, torch.Tensor], union: dict[str, np.ndarray]) -> torch.Tensor:
    parts = [p.detach().float().reshape(-1).cpu() for p in dense]
    parts += [tables[n].detach()[torch.from_numpy(ids).to(tables[n].device)].float().reshape(-1).cpu()
              for n, ids in sorted(union.items())]
    return torch.cat(parts) if parts else torch.zeros(0)


def _unpack(flat: torch.Tensor, dense: list[torch.Tensor], tables: dict[str, torch.Tensor],
            union: dict[str, np.ndarray]) -> None:
    at = 0
    with torch.no_grad():
        for p in dense:
            p.copy_(flat[at:at + p.numel()].view_as(p).to(p.dtype))
            at += p.numel()
        for name, ids in sorted(union.items()):
            t = tables[name]
            n = len(ids) * t.shape[1]
            t[torch.from_numpy(ids).to(t.device)] = flat[at:at + n].view(len(ids), t.shape[1]).to(t.device, t.dtype)
            at += n


def replica_digest(learner: Learner) -> str:
    """xxh3 digest of every dense parameter and row table: equal replicas, equal digests."""
    h = xxhash.xxh3_64(seed=_DIGEST_SEED)
    for _, p in sorted(learner.model.dense_parameters().items()):
        h.update(p.detach().float().cpu().numpy().tobytes())
    for _, t in sorted(learner.row_tables().items()):
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


# ---------------------------------------------------------------------------- fencing

def fenced_commit(store: Store, ckpt: Checkpoint, generation: int, rank: int, world_size: int) -> None:
    """Commit ``ckpt`` as the writer of group ``generation``, unless a newer generation
    already wrote the state (then :class:`StaleWorkerError`, the state unchanged).

    A new group takes ``stored_generation(store) + 1`` when it forms. The check and the
    commit both happen while this process holds the state directory's writer lock (an
    exclusive flock for the store's lifetime), so no other writer commits in between.
    """
    current = stored_generation(store)
    if current > generation:
        raise StaleWorkerError(
            f"rank {rank} of generation {generation} tried to write {store.path}, which generation "
            f"{current} already wrote: this worker was replaced; restart it so it joins the current group")
    store.commit(dataclasses.replace(ckpt, blobs={**ckpt.blobs, **fence_blob(generation, rank, world_size)}))
