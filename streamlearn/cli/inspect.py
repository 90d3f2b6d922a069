"""``streamlearn inspect --state DIR [--json] [--verify]``: the snapshot's manifest, tables
and sizes; with ``--verify``, a scan of every stored value for damage. ``--tokens "w1 w2"``
(or ``--text "..."``, tokenized as the model reads records) explains instead: each token's
contribution to the model's answer for those tokens and its importance weights (what ``POST /v1/explain`` answers; :mod:`streamlearn.explain`).

Opens the directory read-only (a consistent snapshot while a worker keeps writing). With
``--json`` it prints one JSON object: ``step``, ``offsets`` and ``records_applied`` (keyed
``"topic:partition"``), ``tables`` (spec, stored rows, per-shard rows and bytes),
``config``, ``metrics``, ``schema_version``, ``committed_at``, ``commits``, ``blobs``,
``kv``, ``store`` (path, shards, value encoding, map and file sizes), ``sizing`` (how a
size derived from the stream was chosen, or null; :mod:`streamlearn.sizing`) and, with
``--verify``, ``verify`` (what was checked, ``ok``, one line per problem). Exit status: 0;
1 when ``--verify`` found damage; 2 when the state cannot be opened (one line says why).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..wording import counted


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="print a state directory's manifest: step, offsets, tables and sizes",
        description="Print the manifest of a state directory (step, consumed offsets and "
        "records applied per partition, tables with row counts and shard sizes, config, "
        "metrics). Safe while a worker writes: it reads one consistent snapshot.",
    )
    parser.add_argument("--state", required=True, metavar="DIR", help="state directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--verify", action="store_true",
                        help="also read every stored row, blob and kv value and check it (checksums, keys, "
                        "lengths, finite values); list what is damaged and exit 1 if anything is. Reads the "
                        "whole file: seconds per GB")
    parser.add_argument("--tokens", metavar='"W1 W2 ..."', default=None,
                        help="explain the model's answer for these space-separated tokens: each token's "
                        "contribution and its learned importance weights (see docs/serving.md, /v1/explain)")
    parser.add_argument("--text", metavar='"TEXT"', default=None,
                        help="explain the model's answer for this text, tokenized as the model tokenizes "
                        "records (lowercased, bigrams formed, as the dashboard's try-it box does)")
    parser.add_argument("--output", default=None, metavar="ANSWER",
                        help="with --tokens or --text: the label or token to explain (default: the best answer)")
    parser.add_argument("-k", type=int, default=None,
                        help="with --tokens or --text: how many best answers to list (default: 5)")
    parser.add_argument("--device", default=None,
                        help="with --tokens or --text: torch device to answer on (default: the stored "
                        "learner.device; cpu opens a state trained with learner.device=cuda on a machine without one)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..state import open_store  # the CLI imports the store only when it is used
    from ..state.verify import verify_in_child

    from ..exceptions import StreamlearnError

    explaining = args.tokens is not None or args.text is not None
    if explaining and args.verify:  # was: --verify skipped, exit 0, and a script never saw damage
        raise StreamlearnError("--verify checks the stored values and --tokens/--text explain an answer: run them "
                               "as two commands")
    loose = [flag for flag, value in (("--output", args.output), ("-k", args.k), ("--device", args.device))
             if value is not None]
    if loose and not explaining:
        raise StreamlearnError(f"{' and '.join(loose)} {'goes' if len(loose) == 1 else 'go'} with --tokens or "
                               "--text (what to explain)")
    if explaining:
        return explain_tokens(args)

    from ..checkpoint import as_it_runs, stored_sizing

    with open_store(args.state, readonly=True, backend="lmdb") as store:
        with store.snapshot():
            report = build_report(store.manifest().to_dict(), store.stats())
            sizing = stored_sizing(store)
            words = _word_tables(store) if args.verify else []
    report["sizing"] = None if sizing is None else sizing.to_dict()
    if isinstance(report.get("config"), dict):  # keys older than the state: as the model runs them
        report["config"] = as_it_runs(report["config"])
    if args.verify:  # in a child: LMDB aborts on some damaged pages rather than report them
        report["verify"] = verify_in_child(report["store"]["path"], words=words).to_dict()
    print(json.dumps(report, sort_keys=True) if args.json else format_report(report))
    return 1 if args.verify and not report["verify"]["ok"] else 0


def _word_tables(store) -> list[str]:
    """The tables whose floats hold bits (a count part's keys: one may read as NaN), not
    checked for finite values; none where the stored config cannot be read (the scan then
    reports that blob)."""
    from ..checkpoint import stored_word_tables
    from ..exceptions import StreamlearnError

    try:
        return stored_word_tables(store)
    except StreamlearnError:
        return []


def build_report(manifest: dict, stats: dict) -> dict:
    """Manifest and stats as one JSON-able object (``tables`` merges spec and sizes)."""
    report = dict(manifest)
    report["tables"] = {name: {**manifest["tables"][name], **t} for name, t in stats["tables"].items()}
    report["blobs"] = stats["blobs"]
    report["kv"] = stats["kv"]
    keys = ("backend", "path", "shards", "encoding", "map_size", "used_bytes", "file_bytes")
    report["store"] = {k: stats[k] for k in keys}
    return report


def format_report(r: dict) -> str:
    s = r["store"]
    when = "never" if r["committed_at"] is None else time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(r["committed_at"]))
    lines = [
        f"state    {s['path']}  (schema {r['schema_version']}, {_checks(s['encoding'])}, {s['shards']} shards, "
        f"{_size(s['file_bytes'])} on disk, {_size(s['used_bytes'])} used, map {_size(s['map_size'])})",
        f"step     {r['step']}  (commits {r['commits']}, last {when})",
        "offsets  partition            next offset   records applied",
    ]
    for part in sorted(set(r["offsets"]) | set(r["records_applied"])):
        lines.append(f"         {part:<20} {r['offsets'].get(part, '-'):>11}   {r['records_applied'].get(part, '-'):>15}")
    lines.append("tables   name                 rows x width dtype          stored       size  rows per shard")
    for name, t in sorted(r["tables"].items()):
        shape = f"{t['rows']} x {t['width']} {t['dtype']}"
        lines.append(f"         {name:<20} {shape:<24} {t['stored']:>10} {_size(sum(t['shard_bytes'])):>10}  "
                     + " ".join(str(n) for n in t["shard_rows"]))
    lines.append("blobs    " + (", ".join(f"{k} {_size(v)}" for k, v in sorted(r["blobs"].items())) or "-"))
    lines.append("kv       " + (", ".join(f"{k} {v} keys" for k, v in sorted(r["kv"].items())) or "-"))
    lines.append(f"config   {json.dumps(r['config'], sort_keys=True)}")
    if r.get("sizing"):
        from ..sizing import Sizing

        lines.append(f"sizing   {Sizing.from_dict(r['sizing'])}")
    lines.append(f"metrics  {json.dumps(r['metrics'], sort_keys=True)}")
    accuracy = _accuracy(r["metrics"] or {}, r["config"])
    if accuracy:
        lines.append(f"accuracy {accuracy}")
    loss = _check_loss(r["metrics"] or {})
    if loss:
        lines.append(f"check    {loss}")
    if "verify" in r:
        lines += _verify_lines(r["verify"])
    return "\n".join(lines)


def _accuracy(metrics: dict, config: dict) -> str:
    """The worker's accuracy figures, each named for what it is (docs/quickstart.md)."""
    evaluated, correct = metrics.get("prequential_evaluated"), metrics.get("prequential_correct")
    if not evaluated:
        return ""
    every = (config.get("worker") or {}).get("eval_every", "?")
    recent = metrics.get("prequential_accuracy")
    tail = "" if recent is None else f"; recent (moving average of the last ~20 evaluated batches) {recent:.4f}"
    return (f"prequential, cumulative {correct / evaluated:.4f} over {evaluated:,} records (every "
            f"{every}th batch predicted before it was learned){tail}")


def _check_loss(metrics: dict) -> str:
    """A token task's prequential check (nats per answer before learning, lower is better)
    beside its counting baseline's."""
    model, base = metrics.get("prequential_loss"), metrics.get("prequential_baseline_loss")
    if model is None or base is None:
        return ""
    return (f"prequential loss before learning, recent (moving average of the last ~20 evaluated batches) "
            f"{model:.4f} nats per answer; {metrics.get('prequential_baseline')} {base:.4f}")


def _checks(encoding: str) -> str:
    return "values checked by xxh3_64" if encoding == "xxh3_64" else "no checksums"


def _verify_lines(v: dict) -> list[str]:
    counts = ", ".join(f"{what} {n:,}" for what, n in sorted(v["checked"].items())) or "nothing stored"
    how = ("against their xxh3_64 checksums" if v["checksums"] else
           f"for keys, lengths and finite values only: schema {v['schema_version']} stores no checksums "
           "(written before streamlearn checked values), so an overwritten value can pass")
    head = "OK" if v["ok"] else f"DAMAGED ({counted(len(v['problems']), 'finding')})"
    return [f"verify   {head}: {counts} checked {how}"] + [f"         {line}" for line in v["problems"]]


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


# ---------------------------------------------------------------------------- --tokens

def explain_tokens(args: argparse.Namespace) -> int:
    """``--tokens`` or ``--text``: the snapshot's explanation of one query."""
    from ..exceptions import StreamlearnError
    from ..service_explain import explanation_json
    from ..snapshot import Snapshot

    if args.tokens is not None and args.text is not None:
        raise StreamlearnError("give --tokens or --text, not both")
    if args.text is not None:
        if not args.text.strip():
            raise StreamlearnError('--text needs some text, e.g. --text "win a free prize"')
        query = {"text": args.text}
    else:
        query = {"tokens": args.tokens.split()}
        if not query["tokens"]:
            raise StreamlearnError('--tokens needs at least one token, e.g. --tokens "free prize now"')
    args.k = 5 if args.k is None else args.k
    if not 1 <= args.k <= 1000:
        raise StreamlearnError(f"-k must be in [1, 1000], got {args.k}")
    with Snapshot.open(args.state, device=args.device) as snap:
        if "tokens" in query and snap.config.hashing.lowercase:
            upper = [t for t in query["tokens"] if t != t.lower() and t.upper() != "[MASK]"]
            if upper:
                print(f"note: --tokens are taken as they are, and this model's tokenizer lowercases its "
                      f"records, so {', '.join(map(repr, upper[:3]))} may never have been seen; "
                      f"--text explains text as the model reads it", file=sys.stderr)
        answer = snap.explain([query], [args.output], k=args.k)
    body = {"snapshot_step": answer.step, **explanation_json(answer.values[0])}
    print(json.dumps(body, sort_keys=True) if args.json else format_explanation(body))
    return 0


def format_explanation(e: dict) -> str:
    """An explanation as lines: the answer, the best answers, then one line per token."""
    if e["output"] is None:
        head = [f"step     {e['snapshot_step']}: nothing to explain yet (no label or candidate learned)"]
    else:
        methods = ", ".join(f"{part} {how}" for part, how in e["methods"].items())
        head = [f"step     {e['snapshot_step']}",
                f"output   {e['output']!r}  score {_f(e['score'])} = contributions + rest {_f(e['rest'])}  ({methods})"]
    head.append("top      " + ", ".join(f"{t['output']!r} {_f(t['value'])}" for t in e["top"]))
    parts = list(e["parts"])
    head.append(f"{'token':<20} {'contribution':>12} " + " ".join(f"{p:>12}" for p in parts)
                + "  importance p_w over rows of E")
    for i, token in enumerate(e["tokens"]):
        weights = "-" if e["importance"] is None or e["importance"][i] is None else ", ".join(
            f"{_f(w)} (row {r})" for w, r in zip(e["importance"][i], e["rows"][i]))
        head.append(f"{token[:20]:<20} {_f(e['contributions'][i]):>12} "
                    + " ".join(f"{_f(e['parts'][p][i]):>12}" for p in parts) + f"  {weights}")
    return "\n".join(head)


def _f(v) -> str:
    return "-" if v is None else f"{v:.4f}"
