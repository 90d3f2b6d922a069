"""``streamlearn produce FILE --topic T``: load a dataset file into a Kafka topic as records."""
from __future__ import annotations

import argparse
import itertools
import sys

from ..config import WorkerConfig, load_config
from ..datasets import COLUMN_RULES, FORMATS, DatasetReader, ReadOptions
from ..exceptions import StreamlearnError
from ..records import FORMATS as RECORD_FORMATS
from ..wording import counted
from . import bootstrap_arg, topic_arg

_SHOW_BAD_LINES = 5


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "produce",
        help="load a dataset file (JSON lines, CSV/TSV, MovieLens ratings, or plain text as a token "
        "stream) into a topic",
        description="Read FILE as stream records and write them to --topic (created with "
        "--partitions if missing). Plain text (a .txt file, or --input-format text) becomes records "
        "{\"text\": ...} of 32 words in file order, a token stream for --task next-token or mlm; a .txt "
        "file is a table only when each of its first 20 lines holds the same number of tabs. Message keys: the user for MovieLens, a record's `key` for "
        "JSON lines, else the record's ordinal; the partition is xxhash(key) mod partitions. "
        "Records with a time (MovieLens, a JSON `ts`) carry it as the Kafka timestamp. "
        "The first record as read is shown before anything is written.\n\n" + COLUMN_RULES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="FILE", help="dataset file")
    parser.add_argument("--topic", required=True, type=topic_arg, help="topic to write to")
    parser.add_argument("--bootstrap", type=bootstrap_arg,
                        help="Kafka bootstrap servers host:port (default: worker.bootstrap of the config or "
                        f"environment, else {WorkerConfig.bootstrap})")
    parser.add_argument("--partitions", type=int, default=1,
                        help="partitions of the topic when it is created (default: %(default)s)")
    parser.add_argument("--format", choices=RECORD_FORMATS, default="msgpack",
                        help="message value encoding (default: %(default)s)")
    parser.add_argument("--input-format", choices=FORMATS, default=None,
                        help="dataset format (default: detected from the file name and first line)")
    parser.add_argument("--text-column", default=None,
                        help="CSV/TSV text column: header name or 0-based index; 'a,b' joins columns")
    parser.add_argument("--label-column", default=None, help="CSV/TSV label column: header name or 0-based index")
    parser.add_argument("--limit", type=int, default=None, help="write at most N records")
    parser.add_argument("--timeout", type=float, default=10.0,
                        help="seconds to wait for the broker to answer and to acknowledge (default: %(default)s)")
    parser.add_argument("--skip-bad-lines", action="store_true",
                        help="count and report lines that are not valid records instead of stopping at the first")
    parser.add_argument("--config", metavar="FILE",
                        help="TOML config file; its [kafka] table (TLS, SASL) is used to connect")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="dotted config override, repeatable (e.g. --set kafka.security_protocol=SSL)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..broker import create_topic, produce_rows

    if args.limit is not None and args.limit < 0:
        raise StreamlearnError(f"--limit must be >= 0, got {args.limit}")
    config = load_config(args.config, args.set)
    security = config.kafka
    security.client_options()  # a config that cannot connect fails before the file is read
    # a line the worker would refuse (worker.max_record_bytes) is a bad line here already
    options = ReadOptions(args.input_format, args.text_column, args.label_column, args.skip_bad_lines,
                          max_line_bytes=config.worker.max_record_bytes)
    reader = DatasetReader(args.file, options)
    bootstrap = args.bootstrap or config.worker.bootstrap  # one config for every command (was: only the worker's)
    partitions = create_topic(bootstrap, args.topic, args.partitions, timeout_s=args.timeout, security=security)
    if partitions != args.partitions:
        print(f"topic {args.topic!r} already exists with {counted(partitions, 'partition')}; keeping them", file=sys.stderr)
    total = reader.estimate_rows() if args.limit is None else min(args.limit, reader.estimate_rows())
    print(reader.preview(), file=sys.stderr)
    rows = itertools.islice(reader, args.limit)
    with tqdm(total=total, unit="rec", desc=f"produce {args.topic}", disable=None) as bar:
        summary = produce_rows(bootstrap, args.topic, rows, fmt=args.format, progress=bar,
                               timeout_s=max(args.timeout, 30.0), security=security)
    print(f"{summary} [{reader.format} {args.file} -> {args.format}]")
    _report_bad_lines(reader)
    for line in reader.notes.lines():
        print(f"note: {line}", file=sys.stderr)
    return 0


def _report_bad_lines(reader: DatasetReader) -> None:
    if not reader.bad_lines:
        return
    print(f"skipped {len(reader.bad_lines)} bad line(s) of {reader.path}:", file=sys.stderr)
    for lineno, reason in reader.bad_lines[:_SHOW_BAD_LINES]:
        print(f"  line {lineno}: {reason}", file=sys.stderr)
    more = reader.bad_lines[_SHOW_BAD_LINES:]
    if more:  # was: cut without a word, so the count and the list disagreed
        lines = ", ".join(str(lineno) for lineno, _ in more[:20]) + (", ..." if len(more) > 20 else "")
        print(f"  and {counted(len(more), 'more line')}: {lines}", file=sys.stderr)
