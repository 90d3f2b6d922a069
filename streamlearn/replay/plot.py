"""The rolling metrics of a replay over stream position, as a PNG, PDF or SVG (``--plot FILE``).

One panel per metric, one line per contestant (the model(s) solid, baselines dashed),
drawn from a report's ``series`` so a saved report can be plotted again. With
``--compare A B`` the two models' lines are named by their state directories.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from ..exceptions import StreamlearnError

__all__ = ["PLOT_FORMATS", "figure", "plot_format", "plot_report"]

PLOT_FORMATS = ("png", "pdf", "svg")


def plot_format(path: str | os.PathLike) -> str:
    """The format ``path``'s suffix names (none: PNG, written to ``path`` as named); a
    suffix of no plot format raises StreamlearnError, said before a replay runs (was:
    matplotlib's ValueError traceback after it, and a path without a suffix reported as
    written while matplotlib had added ``.png``).

    >>> plot_format("r.png"), plot_format("r.SVG"), plot_format("plot")
    ('png', 'svg', 'png')
    """
    suffix = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if suffix and suffix not in PLOT_FORMATS:
        raise StreamlearnError(f"--plot {path}: .{suffix} is not a plot format; name a "
                               f"{', '.join('.' + f for f in PLOT_FORMATS)} file (no suffix: PNG)")
    return suffix or "png"


def plot_report(report: dict[str, Any], path: str | os.PathLike, title: str | None = None) -> None:
    """Draw ``report["series"]`` into ``path`` (matplotlib, Agg backend), in the format
    its suffix names (:func:`plot_format`)."""
    fmt = plot_format(path)
    fig = figure(report, title)  # first: it selects the Agg backend before pyplot loads
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=90, format=fmt)
    except OSError as exc:
        raise StreamlearnError(f"cannot write the plot to {path}: {exc.strerror}; check --plot") from exc
    finally:
        plt.close(fig)


def figure(report: dict[str, Any], title: str | None = None):
    """The matplotlib Figure :func:`plot_report` saves: one panel per metric; the caller
    closes it (``matplotlib.pyplot.close``)."""
    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # font cache notices
    import matplotlib.pyplot as plt

    series = report["series"]
    positions = series["positions"]
    names = list(report["metrics"])
    models = set(report["models"])
    fig, axes = plt.subplots(len(names), 1, figsize=(7.5, 2.3 * len(names) + 0.6), sharex=True, squeeze=False)
    for ax, metric in zip(axes[:, 0], names):
        for who, values in series.items():
            if who == "positions" or metric not in values:
                continue
            style = "-" if who in models else "--"
            ax.plot(positions, values[metric], style, linewidth=1.6 if who in models else 1.1,
                    label=_label(report, who))
        ax.set_ylabel(metric)
        if metric == "log_loss" and positions:  # a cold start costs -log(1e-15) = 34.5 per record
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    if positions:
        axes[0, 0].legend(fontsize=8, ncol=3, loc="best")
    else:
        axes[0, 0].text(0.5, 0.5, "no record was scored", ha="center", va="center", transform=axes[0, 0].transAxes)
    axes[-1, 0].set_xlabel("stream position (records)")
    window = report.get("rolling", {}).get("window")
    fig.suptitle(title or f"{report['task']} replay, {report['mode']}: rolling metrics (window {window})", fontsize=10)
    fig.tight_layout()
    return fig


def _label(report: dict[str, Any], who: str) -> str:
    """A contestant's legend entry: a compared snapshot by its directory, not "a"/"b"."""
    compared = report.get("compare") or {}
    state = compared.get(who, {}).get("state") if who in ("a", "b") else None
    return state or who
