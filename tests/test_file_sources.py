"""Replay's file source (FileSource) and the file-level checks replay makes before it reads
(task_of_records): odd files give one-line errors or counted bad records, never a traceback."""
import json
import os
from pathlib import Path

import msgpack
import pytest

from streamlearn.datasets import DatasetError, DatasetReader, ReadOptions, task_of_records
from streamlearn.exceptions import StreamlearnError
from streamlearn.records import reason_code
from streamlearn.replay.sources import FileSource, ReplaySourceError


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


def test_an_unhashable_key_nested_in_a_field_names_the_key_not_the_field_type(tmp_path):
    """Was: 'wrong-type: text ... _UnhashableKeys', a private class name for a bad map key
    one level down (in a map, or in a map inside a list)."""
    in_map = b"\x82\xa4text\x81\x91\x01\x01\xa5label\xa3ham"  # {"text": {[1]: 1}, "label": "ham"}
    in_list = b"\x81\xa6tokens\x92\xa1a\x81\x91\x01\x01"  # {"tokens": ["a", {[1]: 1}]}
    path = write(tmp_path, "nested.msgpack", in_map + in_list + msgpack.packb(OK[0]))
    errors = [it.error for it in FileSource(path, ReadOptions())]
    assert [reason_code(e) if e else None for e in errors] == ["invalid-msgpack", "invalid-msgpack", None]
    assert all("unhashable" in e and "_Unhashable" not in e for e in errors[:2]), errors


def test_a_corrupt_msgpack_byte_names_its_error():
    """Was: 'invalid-msgpack: at byte 18: ; the rest ...' (msgpack's FormatError has no message)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), "bad.msgpack", msgpack.packb(OK[0]) + b"\xc1")
        errors = [it.error for it in FileSource(path, ReadOptions()) if it.error]
    assert len(errors) == 1 and "at byte" in errors[0] and ": ;" not in errors[0], errors


# ---------------------------------------------------------------------------- task_of_records

def test_json_lines_are_next_item_only_with_key_and_item(tmp_path):
    """evaluation.md: JSON lines of key and item are next-item (was: item alone was taken
    for next-item, and every record then lacked its key)."""
    assert task_of_records(write(tmp_path, "ki.jsonl", '{"key": "u1", "item": "a"}\n')) == "next-item"
    with pytest.raises(DatasetError, match="cannot tell the task; pass --task"):  # was: classify, every record bad
        task_of_records(write(tmp_path, "i.jsonl", '{"item": "a"}\n'))

def test_deeply_nested_json_does_not_stop_the_task_guess(tmp_path):
    """Was: RecursionError from task_of_records when replay had no --task."""
    path = write(tmp_path, "deep.jsonl", json.dumps(OK[0]) + "\n" + '{"a":' + "[" * 100_000 + "\n")
    assert task_of_records(path) is None


# ---------------------------------------------------------------------------- files that cannot be read

def test_a_directory_is_not_a_regular_file(tmp_path):
    folder = tmp_path / "data.jsonl"
    folder.mkdir()
    with pytest.raises(DatasetError, match="not a regular file"):
        DatasetReader(folder)
    with pytest.raises(ReplaySourceError, match="not a regular file"):
        FileSource(folder)
    with pytest.raises(DatasetError, match="no such file"):
        DatasetReader(tmp_path / "missing.jsonl")


@pytest.fixture
def eio(tmp_path):
    """A link to /proc/self/mem: a regular file whose first read fails with EIO."""
    def link(name: str) -> Path:
        path = tmp_path / name
        path.symlink_to("/proc/self/mem")
        return path
    if not os.path.exists("/proc/self/mem"):
        pytest.skip("needs Linux /proc")
    return link


def test_a_read_error_is_one_line_naming_the_file(eio):
    """Was: OSError [Errno 5] Input/output error, a traceback, from the read, estimate_rows
    and the msgpack reader."""
    path = eio("x.jsonl")
    with pytest.raises(DatasetError, match=r"cannot read .*x.jsonl: Input/output error"):
        list(DatasetReader(path))
    with pytest.raises(DatasetError, match=r"cannot read .*x.jsonl: Input/output error"):
        DatasetReader(path).estimate_rows()
    with pytest.raises(StreamlearnError, match=r"cannot read .*x.msgpack: Input/output error"):
        list(FileSource(eio("x.msgpack")))


# ---------------------------------------------------------------------------- order

def sms_lines(n: int) -> list[bytes]:
    words = ["see you at noon then", "win a free prize now", "call me when you land", "lunch at the usual place"]
    return [f"{'ham' if i % 3 else 'spam'}\t{words[i % 4]} {i}".encode() for i in range(n)]


@pytest.mark.parametrize("fmt", ["tsv", "csv"])
def test_a_bad_line_in_the_read_ahead_comes_in_file_order(tmp_path, fmt):
    """Was: the 1,001 rows read ahead to decide the layout collected their bad lines first,
    so a bad line at 401 was reported at position 1 (and --limit counted it early)."""
    lines = sms_lines(600)
    if fmt == "csv":
        lines = [line.replace(b"\t", b",") for line in lines]
    lines[400] = b"ham\tcaf\xe9 au lait"  # line 401
    path = write(tmp_path, f"sms.{fmt}", b"\n".join(lines) + b"\n")
    got = items(path)
    assert len(got) == 600 and got[400] == ("invalid-utf8", f"sms.{fmt}:401")
    assert all(code is None for code, _ in got[:400] + got[401:])
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True))
    rows = iter(reader)
    for _ in range(400):
        next(rows)
    assert reader.bad_lines == []  # read ahead, not yet passed
    next(rows)
    assert [line for line, _ in reader.bad_lines] == [401]
    with pytest.raises(DatasetError, match=f"sms.{fmt}:401: invalid-utf8"):  # without skipping: stops at once
        next(iter(DatasetReader(path)))


# ---------------------------------------------------------------------------- formats

@pytest.mark.parametrize("name", ["dump.msgpack", "dump.mpk", "dump.msgpack-stream", "DUMP.MSGPACK"])
def test_a_msgpack_suffix_needs_no_task_and_no_input_format(tmp_path, name):
    """Was: replay without --task on a .msgpack file stopped with 'cannot tell the format'."""
    path = write(tmp_path, name, b"".join(map(msgpack.packb, OK)))
    assert task_of_records(path) is None  # read as classify, as FileSource reads it
    assert [code for code, _ in items(path)] == [None, None]


def test_an_undetectable_file_lists_msgpack_among_replays_formats(tmp_path):
    path = write(tmp_path, "notes", "just words\n")
    with pytest.raises(DatasetError, match=r"pass --input-format, one of jsonl, .*text, msgpack$"):
        task_of_records(path)
    with pytest.raises(StreamlearnError, match=r"pass --input-format, one of jsonl, .*text, msgpack$"):
        FileSource(path)


# ---------------------------------------------------------------------------- size limits

def test_a_msgpack_object_over_the_limit_is_too_large(tmp_path):
    """Was: --file X.msgpack never checked worker.max_record_bytes (a 2 MB map was scored)."""
    big = {"text": "word " * 400, "label": "spam"}
    path = write(tmp_path, "dump.msgpack", b"".join(map(msgpack.packb, [OK[0], big, OK[1]])))
    assert [code for code, _ in items(path, max_line_bytes=1000)] == [None, "too-large", None]
    assert [code for code, _ in items(path)] == [None, None, None]


def test_a_text_record_over_the_limit_is_too_large(tmp_path):
    """Was: plain-text records had no size limit (a 1.5 MB word was scored, and produce
    failed only at Kafka's MessageSizeTooLargeError)."""
    path = write(tmp_path, "book.txt", "the cat sat\n" + "x" * 5000 + "\nand then slept\n")
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True, max_line_bytes=1000))
    assert [r.record["text"] for r in reader] == []  # the one 32-word chunk holds the long word
    [(line, reason)] = reader.bad_lines
    assert line == 3 and reason.startswith("too-large: ") and "> 1000 bytes" in reason
    assert [code for code, _ in items(path, max_line_bytes=1000)] == ["too-large"]
    assert len(list(DatasetReader(path))) == 1


def test_preview_is_capped_and_keeps_the_size_limit(tmp_path):
    """Was: preview read without max_line_bytes and printed a 5 MB first record in full."""
    path = write(tmp_path, "a.jsonl", json.dumps({"text": "w " * 100_000}) + "\n" + json.dumps(OK[0]) + "\n")
    shown = DatasetReader(path).preview().splitlines()[1]
    assert len(shown) < 300 and shown.endswith("...")
    limited = DatasetReader(path, ReadOptions(max_line_bytes=1000)).preview().splitlines()[1]
    assert limited == f"first record: {OK[0]!r}"


# ---------------------------------------------------------------------------- files in another encoding or format

@pytest.mark.parametrize("name", ["a.csv", "a.jsonl", "SMSSpamCollection", "book.txt"])
@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_a_utf16_file_is_refused_in_one_line(tmp_path, name, encoding):
    """Was: read as garbage (NUL bytes in every record, or every line bad)."""
    bom = "\ufeff".encode(encoding)
    path = write(tmp_path, name, bom + "text,label\nfree prize now,spam\n".encode(encoding))
    with pytest.raises(DatasetError, match="UTF-16: convert it to UTF-8"):
        DatasetReader(path)
    with pytest.raises(DatasetError, match="UTF-16: convert it to UTF-8"):
        task_of_records(path)
    with pytest.raises(StreamlearnError, match="UTF-16: convert it to UTF-8"):
        FileSource(path)


def test_a_text_file_read_as_msgpack_is_one_bad_record_not_one_a_byte(tmp_path):
    """Was: --input-format msgpack on a JSON file gave one bad record per byte."""
    path = write(tmp_path, "a.jsonl", "\n".join(json.dumps(o) for o in OK * 20) + "\n")
    [(code, origin)] = items(path, format="msgpack")
    assert code == "invalid-msgpack" and origin == "a.jsonl#0"
    [item] = FileSource(path, ReadOptions(format="msgpack"))
    assert "not a stream of msgpack maps" in item.error


def test_a_few_non_map_objects_are_each_a_bad_record(tmp_path):
    data = msgpack.packb(OK[0]) + msgpack.packb([1, 2]) + msgpack.packb(3) + msgpack.packb(OK[1])
    assert items(write(tmp_path, "d.msgpack", data)) == [
        (None, "d.msgpack#0"), ("invalid-msgpack", "d.msgpack#1"), ("invalid-msgpack", "d.msgpack#2"),
        (None, "d.msgpack#3")]
