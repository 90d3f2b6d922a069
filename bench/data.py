"""Where the benchmarks find their data, and the synthetic streams they use without it.

Every script under bench/ takes ``--data DIR`` (:func:`add_data_option`); without it the
datasets folder is ``../shared/data`` beside the repository (:data:`DEFAULT`), wherever the
repository is checked out. A dataset that is not there is replaced by a synthetic stream
of the same shape, and the stream says so: :attr:`Stream.source` starts with
``SYNTHETIC`` and names the file it stands in for, and every script prints it. An explicit
``--data`` that does not exist is an error, not a fallback: the user asked for real data.

>>> s = text_stream("sms", Path("/nonexistent"), n=3)
>>> s.synthetic, len(s.records), s.source.startswith("SYNTHETIC")
(True, 3, True)
"""
from __future__ import annotations

import argparse
import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from streamlearn.datasets import DatasetReader

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared" / "data"
FILES = {  # dataset name -> its file under the datasets folder
    "sms": "sms-spam-collection/SMSSpamCollection",
    "ag-news-5000": "ag-news-train-samples/train_random5000_text_label.csv",
    "ag-news-581": "ag-news-train-samples/train_first581.csv",
    "movielens": "movielens-100k/u.data",
    "yelp": "sentiment-labelled-sentences/yelp_labelled.txt",
}
SIZES = {"sms": 5_574, "ag-news-5000": 5_000, "ag-news-581": 581, "movielens": 100_000, "yelp": 1_000}  # stand-ins
CLASSES = {"sms": 2, "ag-news-5000": 4, "ag-news-581": 4, "yelp": 2}
_NO_DIR = f"no such directory (leave --data out to use {DEFAULT} or synthetic streams)"


def add_data_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=folder, default=None,
                        help=f"the datasets folder (default: ../shared/data beside the repository, {DEFAULT}); "
                             "datasets missing from it are replaced by labelled synthetic streams")


def folder(text: str) -> Path:
    """``--data``'s type: a folder that exists, checked as the command line is read (a
    usage error before any work, not a failure minutes into a run)."""
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {_NO_DIR}")
    return Path(text)


def data_dir(option: Path | None) -> Path:
    """The datasets folder: ``--data`` (which must exist), else :data:`DEFAULT` (which may not)."""
    if option is not None and not option.is_dir():
        raise SystemExit(f"--data {option}: {_NO_DIR}")
    return option if option is not None else DEFAULT


def path(name: str, data: Path) -> Path | None:
    """The file of dataset ``name`` (a key of :data:`FILES`) under ``data``, None if absent."""
    file = data / FILES[name]
    return file if file.is_file() else None


@dataclass(frozen=True)
class Stream:
    """Records of one stream and where they came from (``source``: the file read, or
    ``SYNTHETIC ...`` naming what it stands in for)."""

    name: str
    records: list[dict]
    source: str

    @property
    def synthetic(self) -> bool:
        return self.source.startswith("SYNTHETIC")


def _missing(name: str, data: Path, what: str) -> str:
    return f"SYNTHETIC {what} standing in for {name} ({data / FILES[name]} not found)"


def text_stream(name: str, data: Path, n: int | None = None) -> Stream:
    """A classification stream ``{"text", "label"}`` from dataset ``name`` (its first
    ``n`` records), or :func:`synthetic_text` of its size and label count."""
    file = path(name, data)
    if file is not None:
        rows = itertools.islice(DatasetReader(file), n)
        return Stream(name, [row.record for row in rows], str(file))
    size = SIZES[name] if n is None else min(n, SIZES[name])
    return Stream(name, synthetic_text(size, CLASSES[name]), _missing(name, data, f"text ({CLASSES[name]} topics)"))


def ag_news(data: Path) -> Stream:
    """AG News as bench/quality.py and bench/scaleout.py read it: the 5,000-row sample then
    the first 581 rows, labels mapped to class names (``quality_streams.ag_news``), or
    :func:`synthetic_text` of 5,581 records in 4 topics."""
    from quality_streams import ag_news as read

    files = [data / FILES[name] for name in ("ag-news-5000", "ag-news-581")]
    if all(f.is_file() for f in files):
        return Stream("ag_news", read(data), " + ".join(map(str, files)))
    return Stream("ag_news", synthetic_text(5_581, 4),
                  f"SYNTHETIC text (4 topics) standing in for AG News ({' or '.join(map(str, files))} not found)")


def events_stream(data: Path, n: int | None = None) -> Stream:
    """MovieLens 100K as next-item events ``{"key", "item", "ts"}`` in time order (its first
    ``n``), or :func:`synthetic_events` of its size."""
    file = path("movielens", data)
    if file is not None:
        rows = itertools.islice(DatasetReader(file), n)
        return Stream("movielens", [row.record for row in rows], str(file))
    size = SIZES["movielens"] if n is None else n
    return Stream("movielens", synthetic_events(size), _missing("movielens", data, "next-item events"))


def synthetic_text(n: int, classes: int, seed: int = 0) -> list[dict]:
    """``n`` records of ``classes`` topics: 8-30 words each, half from the topic's own 300
    words, half from 3,000 shared ones, both Zipf-distributed (so a model has something
    to learn and a long tail to hash)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        c = int(rng.integers(classes))
        length = int(rng.integers(8, 31))
        own = np.minimum(rng.zipf(1.3, length), 300)
        shared = np.minimum(rng.zipf(1.3, length), 3000)
        words = [f"t{c}w{o}" if rng.random() < 0.5 else f"w{s}" for o, s in zip(own.tolist(), shared.tolist())]
        out.append({"text": " ".join(words), "label": f"topic{c}"})
    return out


def synthetic_events(n: int, users: int = 900, items: int = 1600, seed: int = 0) -> list[dict]:
    """``n`` next-item events ``{"key": user, "item": item, "ts": ms}`` in time order: each
    user walks one of 40 item cycles (MovieLens' size: ~900 users, ~1,600 items), a step
    at a time, a quarter of the steps to a popular item instead."""
    rng = np.random.default_rng(seed)
    cycles = rng.permutation(items).reshape(40, -1)  # (40, items / 40)
    cycle, pos = rng.integers(40, size=users), rng.integers(cycles.shape[1], size=users)
    out = []
    for t in range(n):
        u = int(rng.integers(users))
        if rng.random() < 0.25:
            item = int(min(rng.zipf(1.5), items) - 1)
        else:
            pos[u] = (pos[u] + 1) % cycles.shape[1]
            item = int(cycles[cycle[u], pos[u]])
        out.append({"key": str(u), "item": item, "ts": 1_000_000 + t * 1000})
    return out


def write_jsonl(records: list[dict], file: Path) -> Path:
    """``records`` as JSON lines at ``file`` (for the scripts that replay files)."""
    import json

    file.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return file


def write_between_markers(path: Path, begin: str, end: str, text: str) -> None:
    """Replace what stands between the markers ``begin`` and ``end`` in the markdown file
    ``path`` with ``text`` (the markers must be there exactly once)."""
    doc = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if len(pattern.findall(doc)) != 1:
        raise SystemExit(f"{path} must hold the markers {begin} ... {end} exactly once (the table goes between them)")
    path.write_text(pattern.sub(lambda _: f"{begin}\n{text}\n{end}", doc), encoding="utf-8")
