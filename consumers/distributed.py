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
   summed by one all_reduce and divided by the world size;
4. token tasks: what each rank counted since the last sync (its new candidates and the
   count part's trigram batches; all_gather_object), which every rank replays from the
   last sync's counts (:meth:`~streamlearn.sync.Replica.merge_logs`): Kneser-Ney
   statistics neither add up nor average, and the count tables stay out of step 3.

Rows nobody touched are equal on every replica already (they were equal after the last
sync and nobody changed them), so only the union moves. The union is put back into the
learner's dirty rows, so the writer's next checkpoint stores every row any rank changed.
The dense optimizer's moments (AdamW) stay local: they describe each replica's own recent
gradients, and averaging them would need state every rank may not have yet.

What a replica exchanges, and how a buffer goes back into the learner, is the library's
(:class:`streamlearn.sync.Replica`, ``learner.replica``); this package moves the bytes
(collectives, the group's TCPStore) and fences the writer.

Environment: :func:`dist_settings` is the one place that reads torchrun's variables.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import numpy as np
import torch
import torch.distributed as dist

from ..checkpoint import fence_blob, stored_generation
from ..exceptions import ConfigError, LabelCapacityError, StreamlearnError
from ..learner import Learner
from ..state import Checkpoint, Store
from ..sync import Replica

log = logging.getLogger(__name__)


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
                  timeout_s: float = 15.0, environ: Mapping[str, str] | None = None,
                  gpus: int | None = None) -> DistSettings | None:
    """Settings from explicit options, else from torchrun's ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ``MASTER_PORT`` and ``TORCHELASTIC_USE_AGENT_STORE`` (the only reader
    of these variables). None: single worker. The backend: :func:`backend_for` (``gpus``:
    the GPUs torch sees, unless given).
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
    backend = backend_for(world_size, env, gpus)
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    return DistSettings(rank, world_size, url, backend, timeout_s, host_store=not agent_store)


def backend_for(world_size: int, environ: Mapping[str, str], gpus: int | None = None) -> str:
    """NCCL when each rank on this host can have a GPU of its own, else gloo. The ranks on
    this host: torchrun's ``LOCAL_WORLD_SIZE``, else (started by hand) all of them, as they
    may share the host. NCCL refuses two ranks on one GPU ("Duplicate GPU detected", seen
    with 2 workers on one H100); under gloo the ranks still train on the GPU, and only the
    sync buffers, packed on the host anyway, travel by gloo."""
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    here = _int_env(environ, "LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in environ else world_size
    return "nccl" if 0 < here <= gpus else "gloo"


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

    def __init__(self, settings: DistSettings, cuda: bool = True):
        """``cuda``: the rank may train on a GPU (``learner.device`` other than cpu); a CPU
        rank on a GPU machine sets no current device, which would open a CUDA context
        (hundreds of MB of GPU memory) it never uses."""
        self.settings = settings
        host, _, port = settings.url[len("tcp://"):].rpartition(":")
        timeout = timedelta(seconds=settings.timeout_s)
        if (cuda or settings.backend == "nccl") and torch.cuda.is_available():
            # NCCL: one GPU per rank on a host (backend_for). gloo with GPUs (more ranks than
            # GPUs): the ranks spread over them, not all on cuda:0. torchrun's LOCAL_RANK, else the rank.
            local = int(os.environ.get("LOCAL_RANK", settings.rank))
            torch.cuda.set_device(local % torch.cuda.device_count())
        log.info("joining the process group at %s as rank %d of %d (--dist-timeout %g s)", settings.url,
                 settings.rank, settings.world_size, settings.timeout_s)
        started = time.monotonic()
        try:
            # Our own TCPStore (hosted by rank 0) also carries the sync requests (SyncClock).
            self.store = dist.TCPStore(host, int(port), settings.world_size,
                                       settings.rank == 0 and settings.host_store, timeout)
            if not settings.host_store:
                # torchrun's agent keeps its store across restarts (--max-restarts): without a
                # prefix per attempt a restarted group read the last one's keys (a dead rank's
                # gloo address; every sync number it had reached, replayed as empty commits)
                attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
                self.store = dist.PrefixStore(f"streamlearn/attempt-{attempt}", self.store)
            dist.init_process_group(settings.backend, store=self.store, rank=settings.rank,
                                    world_size=settings.world_size, timeout=timeout)
        except (RuntimeError, ValueError) as exc:
            raise DistributedError(
                f"could not join the process group at {settings.url} as rank {settings.rank} of "
                f"{settings.world_size} (gave up after {time.monotonic() - started:.0f} s): {exc}; check that every "
                "rank uses the same --dist-url and --world-size and that every rank was started: a worker left "
                "going on alone after a peer crashed takes no new member, so stop it and start all ranks") from exc
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
    rank must call it at the same point of its sync sequence. Raises DistributedError.

    What moves is :mod:`streamlearn.sync`'s (``learner.replica``); this function moves it."""
    started = time.perf_counter()
    replica = learner.replica
    try:
        _merge_labels(replica, group)
        union, id_bytes = _union_ids(replica.take_touched())
        flat = torch.cat([replica.dense_values(), replica.row_values(union)])  # (n,) float32
        flat = all_reduce(flat) / group.world_size
        replica.set_dense_values(flat[:replica.dense_size])
        replica.set_row_values(flat[replica.dense_size:], union)  # the next checkpoint stores these rows
        log_bytes = merge_logs(replica)
    except RuntimeError as exc:
        raise DistributedError(f"model sync failed (a peer stopped, died or did not answer within "
                               f"{group.settings.timeout_s:g} s): {exc}") from exc
    return SyncReport(time.perf_counter() - started, id_bytes + flat.numel() * 4 + log_bytes, replica.dense_size,
                      {name: len(ids) for name, ids in union.items()})


def merge_logs(replica: Replica) -> int:
    """Every rank replays every rank's :meth:`~streamlearn.sync.Replica.log` (gathered in
    rank order); returns the bytes of this rank's log (0 for a task that keeps none).
    Raises RuntimeError when the collective fails (nothing merged then)."""
    mine = replica.log()
    if mine is None:  # the same task on every rank: none of them gathers
        return 0
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    replica.merge_logs(gathered)
    return mine.nbytes


def _merge_labels(replica: Replica, group: Group) -> None:
    """Give every replica the same label table: rank 0's labels, then each later rank's
    new ones in rank order (:meth:`~streamlearn.sync.Replica.merge_labels`)."""
    labels = replica.labels
    if labels is None:  # the same task on every rank: none of them gathers
        return
    gathered: list = [None] * group.world_size
    dist.all_gather_object(gathered, labels)
    try:
        replica.merge_labels(gathered)
    except LabelCapacityError as exc:
        raise DistributedError(f"the replicas together saw more labels than the table holds: {exc}") from exc


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


def _union_ids(touched: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int]:
    """Per table (``touched``'s names: every table, in the same order on every rank): the
    union of the ids every rank touched, tables nobody touched left out; and the bytes
    this rank sent for it."""
    names = list(touched)
    counts = torch.tensor([len(touched[n]) for n in names], dtype=torch.int64)  # (T,)
    all_counts = all_gather(counts)
    widest = int(max(int(c.sum()) for c in all_counts))
    mine = np.concatenate([touched[n] for n in names] or [np.zeros(0, np.int64)])
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
