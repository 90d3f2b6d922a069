"""Replay's file source (FileSource) and the file-level checks replay makes before it reads
(task_of_records): odd files give one-line errors or counted bad records, never a traceback."""
import json
from pathlib import Path

import msgpack

from streamlearn.datasets import ReadOptions, task_of_records
from streamlearn.records import reason_code
from streamlearn.replay.sources import FileSource


def write(tmp_path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def items(path, **options) -> list[tuple[str | None, str]]:
    """(reason code or None for a record, origin) of each item, in stream order."""
    return [(None if it.error is None else reason_code(it.error), it.origin)
            for it in FileSource(path, ReadOptions(**options))]


OK = [{"text": "free prize now", "label": "spam"}, {"text": "see you later", "label": "ham"}]


# ---------------------------------------------------------------------------- msgpack

def test_a_msgpack_map_with_an_unhashable_key_is_one_bad_record_and_the_rest_is_read(tmp_path):
    """Was: TypeError unhashable type 'list', a traceback."""
    data = b"".join(map(msgpack.packb, OK)) + b"\x81\x91\x01\x01" + b"".join(map(msgpack.packb, OK))
    got = items(write(tmp_path, "dump.msgpack", data))
    assert got == [(None, "dump.msgpack#0"), (None, "dump.msgpack#1"), ("invalid-msgpack", "dump.msgpack#2"),
                   (None, "dump.msgpack#3"), (None, "dump.msgpack#4")]


# ---------------------------------------------------------------------------- task_of_records

def test_deeply_nested_json_does_not_stop_the_task_guess(tmp_path):
    """Was: RecursionError from task_of_records when replay had no --task."""
    path = write(tmp_path, "deep.jsonl", json.dumps(OK[0]) + "\n" + '{"a":' + "[" * 100_000 + "\n")
    assert task_of_records(path) is None
