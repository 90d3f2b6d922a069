"""Replay and evaluation: a recorded stretch of a stream through a model and baselines.

>>> from streamlearn.replay import FileSource, ReplayOptions, replay
>>> report = replay(FileSource(path), ReplayOptions(baselines=("river-nb",)), config=cfg)  # doctest: +SKIP
>>> report["metrics"]["accuracy"], report["baselines"]["river-nb"]["accuracy"]  # doctest: +SKIP

:func:`replay` evaluates prequentially (predict each record, then learn it; from a snapshot
or from scratch) or frozen (a fixed snapshot, no learning), on a file or a Kafka range,
with river metrics overall and over rolling windows, optional label delay and baselines
side by side, and returns the JSON report (:mod:`.report`); :func:`plot_report` draws it.
Nothing is written to a state unless ``save`` names a new directory. See docs/evaluation.md.
"""
from __future__ import annotations

import contextlib
import importlib
import itertools
import os
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..exceptions import StreamlearnError

if TYPE_CHECKING:
    from ..learner import Learner
    from .runner import ReplayOptions
    from .sources import FileSource, KafkaSource

__all__ = [
    "BASELINES", "FILE_FORMATS", "MODES", "MRR", "FileSource", "KafkaRange", "KafkaSource", "RecallAtK",
    "ReplayOptions", "ReplayResult", "ReplaySourceError", "build_report", "load_learner", "plot_report",
    "replay", "run_replay", "save_learner", "write_report",
]

# Imported on first use (PEP 562): the command line reads FILE_FORMATS to build its
# parser, which should not load torch, river and matplotlib.
_LAZY = {
    "BASELINES": ".baselines", "MRR": ".metrics", "RecallAtK": ".metrics", "plot_report": ".plot",
    "build_report": ".report", "write_report": ".report", "MODES": ".runner", "ReplayOptions": ".runner",
    "ReplayResult": ".runner", "run_replay": ".runner", "load_learner": ".snapshots", "save_learner": ".snapshots",
    "FILE_FORMATS": ".sources", "FileSource": ".sources", "KafkaRange": ".sources", "KafkaSource": ".sources",
    "ReplaySourceError": ".sources",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def replay(source: FileSource | KafkaSource, options: ReplayOptions | None = None, *,
           state: str | os.PathLike | None = None, compare: tuple[str, str] | None = None,
           config: Config | None = None, overrides: list[str] = (), save: str | os.PathLike | None = None,
           progress: Any = None) -> dict[str, Any]:
    """Replay ``source`` and return the report dict.

    The model: the snapshot at ``state``, or two snapshots ``compare=(A, B)`` evaluated
    side by side (report keys ``models.a``/``models.b`` and ``compare``), or a new learner
    from ``config`` (prequential from scratch). ``overrides`` (dotted keys) apply to the
    stored or given config; ``learner.seed`` is set to ``options.seed``. A new learner
    whose config leaves a size to the stream (next-item's ``model.out_B=0``) is sized from
    the first ``learner.sizing_window`` records of ``source`` (read once before the replay,
    which then starts from the first record; :mod:`streamlearn.sizing`); the report's
    ``config.sizing`` says how. ``save``: a new
    state directory to write the learner to after a prequential replay. ``options``:
    :class:`ReplayOptions` (None: its defaults).
    """
    from .report import build_report
    from .runner import ReplayOptions, run_replay
    from .snapshots import save_learner

    options = ReplayOptions() if options is None else options
    learners, where = _learners(source, options, state, compare, config, list(overrides))
    if save is not None:
        _check_save(options, compare, save, state)
    result = run_replay(source, learners, options, progress)
    first = next(iter(learners.values()))
    run_config = {"replay": {"mode": options.mode, "k": options.k, "window": options.window,
                             "delay": options.delay, "baselines": list(options.baselines),
                             "seed": options.seed, "limit": options.limit,
                             "batch_size": first.cfg.learner.batch_size},
                  "state": where, "compare": [os.fspath(p) for p in compare] if compare else None,
                  "save": None if save is None else os.fspath(save), "model": first.cfg.to_dict(),
                  "sizing": None if first.sizing is None else first.sizing.to_dict()}
    report = build_report(result, run_config, source.describe())
    if save is not None:
        report["saved_step"] = save_learner(first, save, {"replay": report["metrics"], "records": report["records"]})
    return report


def _learners(source, options: ReplayOptions, state, compare, config,
              overrides: list[str]) -> tuple[dict[str, Learner], Any]:
    from ..learner import Learner
    from .snapshots import load_learner

    seeded = [*overrides, f"learner.seed={options.seed}"]
    if compare is not None:
        if state is not None:
            raise StreamlearnError("--compare A B names both snapshots: drop --state")
        a, b = (os.fspath(p) for p in compare)
        la, lb = load_learner(a, seeded), load_learner(b, seeded)
        if la.task.name != lb.task.name:  # was: a traceback in the metrics, or recall 0 for a classifier
            raise StreamlearnError(f"--compare needs two snapshots of one task: {a} holds a {la.task.name} model, "
                                   f"{b} a {lb.task.name} model")
        return {"a": la, "b": lb}, None
    if state is not None:
        return {"model": load_learner(state, seeded)}, os.fspath(state)
    if options.mode == "frozen":
        raise StreamlearnError("frozen replay evaluates a fixed snapshot: pass --state DIR (or --compare A B)")
    cfg, sizing = _sized((config or Config()).override(*seeded), source, options.limit)
    learner = Learner(cfg)
    learner.sizing = sizing
    return {"model": learner}, None


def _sized(cfg: Config, source, limit: int | None):
    """``cfg`` with its derived sizes set from the source's first records (the warm-up
    window, within ``limit``), and how (:func:`streamlearn.sizing.sized_config`)."""
    from ..sizing import derived_keys, sized_config

    if not derived_keys(cfg):
        return cfg, None
    with contextlib.closing(iter(source)) as items:  # a Kafka source's consumer closes with it
        records = (item.record for item in itertools.islice(items, limit) if item.record is not None)
        return sized_config(cfg, records)


def _check_save(options: ReplayOptions, compare, save, state) -> None:
    from .snapshots import check_new_dir

    if options.mode != "prequential":
        raise StreamlearnError("--save writes what a prequential replay learned; frozen replay learns nothing")
    if compare is not None:
        raise StreamlearnError("--save takes one model; it cannot be combined with --compare")
    if state is not None and os.path.realpath(save) == os.path.realpath(state):
        raise StreamlearnError("--save must name a new directory, not the --state being replayed")
    check_new_dir(save, "--save")
