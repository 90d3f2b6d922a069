"""The JSON report of a replay (``--report FILE``).

Keys (all present in every report): ``config``, ``source``, ``task``, ``mode``,
``records`` (records read, bad ones included), ``evaluated``, ``not_evaluated`` (a
next-item key's first event: learned, not scored), ``bad_records`` and
``rejected_records`` (``total``, ``reasons`` by code, first ``examples``), ``metrics``
(the model's overall metrics: ``accuracy``, ``macro_f1``, ``log_loss`` for classify;
``recall@K`` and ``mrr`` for top-k tasks; null when no record was scored), ``rolling`` (the last rolling-window values),
``records_per_s`` (the model's throughput: records per second of its own predict and learn
time), ``baselines`` (per name: the same metrics, ``rolling``, ``records_per_s``; or
``skipped`` with the reason), ``models`` (every model by name: one, or ``a`` and ``b`` with
--compare), ``compare`` (None, or both models and the difference b - a), ``series``
(``positions`` and, per contestant and metric, the rolling values there: the plot's data),
``wall_s``, ``truncated_records`` (the model's records cut to ``hashing.max_tokens``
tokens, from its learner's steps; null in frozen mode, where nothing is learned: each
model's entry also has its ``truncated_records`` and ``max_tokens``).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .._version import __version__
from ..exceptions import StreamlearnError
from .runner import Contestant, ReplayResult

__all__ = ["build_report", "write_report"]


def build_report(result: ReplayResult, config: dict[str, Any], source: dict[str, Any]) -> dict[str, Any]:
    """The report dict of ``result``; ``config``/``source`` describe the run."""
    primary = result.models[0]
    handled = result.records - sum(result.bad.values())
    models = {c.name: _contestant(c, handled) for c in result.models}
    report = {
        "streamlearn": __version__,
        "task": result.task,
        "mode": result.options.mode,
        "config": config,
        "source": source,
        "records": result.records,
        "evaluated": result.evaluated,
        "not_evaluated": result.not_evaluated,
        "bad_records": {"total": sum(result.bad.values()), "reasons": dict(sorted(result.bad.items())),
                        "examples": result.examples},
        "rejected_records": {"total": sum(result.rejected.values()), "reasons": dict(sorted(result.rejected.items()))},
        "metrics": primary.metrics.overall(),
        "rolling": {"window": result.options.window, **primary.metrics.rolling()},
        "records_per_s": models[primary.name]["records_per_s"],
        "baselines": {**{c.name: _contestant(c, handled) for c in result.baselines},
                      **{name: {"skipped": why} for name, why in result.skipped.items()}},
        "models": models,
        "compare": _compare(result, config) if len(result.models) == 2 else None,
        "series": {"positions": result.positions, **{c.name: c.series for c in result.contestants}},
        "wall_s": round(result.wall_s, 3),
        "truncated_records": primary.impl.truncated,
    }
    return report


def _contestant(c: Contestant, handled: int) -> dict[str, Any]:
    out: dict[str, Any] = dict(c.metrics.overall())
    out["rolling"] = c.metrics.rolling()
    out["seconds"] = round(c.seconds, 4)
    out["records_per_s"] = round(handled / c.seconds, 1) if c.seconds > 0 else None
    if c.is_model:
        out["truncated_records"], out["max_tokens"] = c.impl.truncated, c.impl.max_tokens
    notes = getattr(c.impl, "notes", None)
    if notes:
        out["notes"] = list(notes)
    return out


def _compare(result: ReplayResult, config: dict[str, Any]) -> dict[str, Any]:
    a, b = result.models
    states = config.get("compare") or [None, None]
    overall_a, overall_b = a.metrics.overall(), b.metrics.overall()
    return {"a": {"state": states[0], "metrics": overall_a}, "b": {"state": states[1], "metrics": overall_b},
            "diff": {name: None if overall_a[name] is None or overall_b[name] is None
                     else overall_b[name] - overall_a[name] for name in overall_a}}


def write_report(report: dict[str, Any], path: str | os.PathLike) -> None:
    """Write the report as indented JSON (the parent directory must exist)."""
    path = Path(path)
    try:
        path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise StreamlearnError(f"cannot write the report to {path}: {exc.strerror}; check --report") from exc
