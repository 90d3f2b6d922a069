"""Dataset readers on tiny files written in tmp_path (and the bundled SMS sample)."""
from collections import Counter

import pytest

from streamlearn.datasets import DatasetError, DatasetReader, ReadOptions, Row, bundled_path, detect_format
from streamlearn.records import REASONS, from_dict, reason_code


def write(tmp_path, name: str, text: str | bytes):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def rows(path, **options) -> list[Row]:
    return list(DatasetReader(path, ReadOptions(**options)))


# ---------------------------------------------------------------------------- detection

@pytest.mark.parametrize("name,text,fmt", [
    ("a.jsonl", '{"text": "x"}\n', "jsonl"),
    ("a.ndjson", '{"text": "x"}\n', "jsonl"),
    ("stream.log", '\n  {"text": "x"}\n', "jsonl"),
    ("u.data", "196\t242\t3\t881250949\n", "movielens"),
    ("ratings-2", "196\t242\t3\t881250949\n", "movielens"),
    ("ratings.tsv", "196\t242\t3\t881250949\n", "tsv"),
    ("ratings.csv", "userId,movieId,rating,timestamp\n1,2,3.5,4\n", "movielens-csv"),
    ("mine.csv", "userId,movieId,rating,timestamp\n1,2,3.5,4\n", "movielens-csv"),
    ("SMSSpamCollection", "ham\tHi there\n", "tsv"),
    ("a.tsv", "text label\n", "tsv"),
    ("train.csv", '"3","title","desc"\n', "csv"),
    ("notes", "a,b\n", "csv"),
    ("book.txt", "Well, Prince, so Genoa\n", "text"),
    ("labels.txt", "ham\tHi there\n", "tsv"),  # a .txt of tab-separated columns is a table
    ("labels.txt", "ham\tHi there\nspam\tWin now\n\nham\tok then\n", "tsv"),
    # a book whose title line holds a tab, or whose lines are indented with one, is running text
    ("book.txt", "BOOK ONE\t1805\nWell, Prince, so Genoa and Lucca\nare now just family estates\n", "text"),
    ("book.txt", "\tCHAPTER I\n\tWell, Prince\n", "text"),
])
def test_detect_format(tmp_path, name, text, fmt):
    assert detect_format(write(tmp_path, name, text)) == fmt


def test_undetectable_format_asks_for_input_format(tmp_path):
    with pytest.raises(DatasetError, match="pass --input-format"):
        detect_format(write(tmp_path, "notes", "just words\n"))


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="unknown input format 'xml'"):
        DatasetReader(write(tmp_path, "a.jsonl", ""), ReadOptions(format="xml"))
    with pytest.raises(DatasetError, match="no such file"):
        DatasetReader(tmp_path / "missing.jsonl")


# ---------------------------------------------------------------------------- jsonl

def test_jsonl_rows_take_key_and_ts_from_the_record(tmp_path):
    path = write(tmp_path, "a.jsonl", '{"text": "hi", "label": "ham", "src": 1}\n\n'
                                      '{"key": 7, "item": "b", "ts": 1500}\n{"tokens": [1, "x"], "weight": 2}\n')
    assert rows(path) == [
        Row(None, {"text": "hi", "label": "ham"}, None),
        Row(b"7", {"key": "7", "item": "b", "ts": 1500}, 1500),
        Row(None, {"tokens": [1, "x"], "weight": 2.0}, None),
    ]
    reader = DatasetReader(path)
    list(reader)
    assert reader.notes.blank_lines == 1  # counted and reported, as in a table (was: skipped silently)


@pytest.mark.parametrize("line,reason", [
    ("not json", "invalid-json"),
    ("[1, 2]", "wrong-type: a JSON line must be an object"),
    ('{"label": "x"}', "missing-field"),
    ('{"text": 5}', "wrong-type"),
    ('{"text": "x", "weight": 1e300}', "bad-weight"),  # refused by produce, not just by the worker
])
def test_jsonl_bad_line_stops_with_its_line_number(tmp_path, line, reason):
    path = write(tmp_path, "a.jsonl", f'{{"text": "ok"}}\n\n{line}\n{{"text": "after"}}\n')
    with pytest.raises(DatasetError, match=rf"a.jsonl:3: .*{reason}.*--skip-bad-lines"):
        rows(path)


def test_skip_bad_lines_counts_every_skipped_line(tmp_path):
    path = write(tmp_path, "a.jsonl", b'{"text": "ok"}\nnope\n{"text": "caf\xe9"}\n{"text": "fine"}\n{}\n')
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True))
    assert [r.record["text"] for r in reader] == ["ok", "fine"]
    assert [line for line, _ in reader.bad_lines] == [2, 3, 5]
    assert reader.bad_lines[1][1] == "invalid-utf8: byte 0xe9 at column 14 is not UTF-8"
    assert reader.bad_lines[2][1].startswith("missing-field")


# ---------------------------------------------------------------------------- csv / tsv

def test_headerless_tsv_is_label_then_text(tmp_path):
    path = write(tmp_path, "SMSSpamCollection", 'ham\tGo until "jurong" point, crazy\r\nspam\tFREE entry\n')
    assert [r.record for r in rows(path)] == [
        {"text": 'Go until "jurong" point, crazy', "label": "ham"},
        {"text": "FREE entry", "label": "spam"},
    ]


def test_headerless_csv_with_three_columns_is_ag_news(tmp_path):
    path = write(tmp_path, "train.csv", '"3","Wall St. Bears","Reuters - Short-sellers, ""quoted"""\n'
                                        '"1","Two\nlines","desc"\n')
    assert rows(path) == [
        Row(None, {"text": 'Wall St. Bears Reuters - Short-sellers, "quoted"', "label": "3"}, None),
        Row(None, {"text": "Two\nlines desc", "label": "1"}, None),
    ]


def test_csv_header_names_text_and_label(tmp_path):
    path = write(tmp_path, "a.csv", "Text,Label\nhello world,2.0\n")
    assert [r.record for r in rows(path)] == [{"text": "hello world", "label": "2.0"}]


def test_header_without_label_gives_unlabelled_records(tmp_path):
    path = write(tmp_path, "a.csv", "id,text\n1,hello\n")
    assert [r.record for r in rows(path)] == [{"text": "hello"}]


def test_columns_by_name_join_and_index(tmp_path):
    path = write(tmp_path, "a.tsv", "id\ttitle\tbody\tsentiment\n1\tGreat\tloved it\tpos\n")
    assert rows(path, text_column="title,body", label_column="sentiment")[0].record == {
        "text": "Great loved it", "label": "pos"}
    headerless = write(tmp_path, "b.tsv", "1\tGreat\tloved it\tpos\n")
    assert rows(headerless, text_column="2", label_column="3")[0].record == {"text": "loved it", "label": "pos"}
    assert rows(headerless, text_column="1")[0].record == {"text": "Great"}


def test_unknown_column_lists_the_header(tmp_path):
    path = write(tmp_path, "a.csv", "id,body,label\n1,hello,a\n")
    with pytest.raises(DatasetError, match=r"no column 'review' \(columns: id, body, label\)"):
        rows(path, text_column="review")
    assert rows(path)[0].record == {"text": "hello", "label": "a"}  # body and label are known names


@pytest.mark.parametrize("options,message", [
    ({"text_column": "5"}, r"no column 5: the rows have 2 columns \(column 0, column 1\)"),
    ({"text_column": "1", "label_column": "2"}, r"no column 2: the rows have 2 columns"),
    ({"text_column": "0,1", "label_column": "1"}, r"--label-column 'column 1' is also a text column"),
    ({"text_column": "1", "label_column": "1"}, r"--label-column 'column 1' is also a text column"),
])
def test_columns_that_cannot_be_read_are_refused_before_any_row(tmp_path, options, message):
    """Was: exit 0 with every row a bad line."""
    path = write(tmp_path, "SMSSpamCollection", "ham\tsee you at noon\nspam\twin a prize\n")
    with pytest.raises(DatasetError, match=message):
        rows(path, skip_bad_lines=True, **options)


def test_a_header_of_known_names_is_a_header_whatever_their_order(tmp_path):
    path = write(tmp_path, "a.csv", "sentiment,review\npos,loved it\n")
    assert [r.record for r in rows(path)] == [{"text": "loved it", "label": "pos"}]


def test_the_issue_file_is_read_with_its_header_not_swapped(tmp_path):
    """message,category: a header of names other than text/label, quoted commas inside."""
    path = write(tmp_path, "my.csv", 'message,category\n"free prize, call now",spam\nsee you later,ham\n')
    reader = DatasetReader(path)
    assert [r.record for r in reader] == [{"text": "free prize, call now", "label": "spam"},
                                          {"text": "see you later", "label": "ham"}]
    assert reader.layout == ("a header row; text: 'message'; label: 'category' "
                             "(decided by the header's column names)")


def test_the_layout_names_both_column_flags_when_both_decided(tmp_path):
    """Was: 'label: ... (decided by --text-column)' for a label given by --label-column."""
    path = write(tmp_path, "m.csv", "t,b,x,l\nfree prize,call now,1,spam\nsee you,later,2,ham\n")
    both, text = (DatasetReader(path, ReadOptions(**o)) for o in ({"text_column": "t,b", "label_column": "3"},
                                                                   {"text_column": "t"}))
    assert list(both) and list(text)  # the layout is decided as the reading starts
    assert both.layout.endswith("label: 'l' (decided by --text-column/--label-column)")
    assert text.layout.endswith("(decided by --text-column)")


def test_headerless_text_then_label_is_told_from_label_then_text(tmp_path):
    """Which column is the label is decided by the content: short, repeated values."""
    lines = ["Wow... Loved this place.\t1", "Crust is not good.\t0", "Not tasty and the texture was nasty.\t0",
             "Stopped by during the late May bank holiday.\t1", "The selection on the menu was great.\t1"]
    text_first = write(tmp_path, "yelp.txt", "\n".join(lines) + "\n")
    label_first = write(tmp_path, "b.tsv", "\n".join("\t".join(reversed(line.split("\t"))) for line in lines) + "\n")
    for path in (text_first, label_first):
        got = [r.record for r in rows(path, format="tsv")]
        assert got[1] == {"text": "Crust is not good.", "label": "0"}


def test_an_unnamed_header_over_wordy_data_is_a_header(tmp_path):
    path = write(tmp_path, "a.csv", "words,verdict\nthe cat sat on the mat,yes\na dog ran in the park,no\n"
                                    "birds sing at the dawn,yes\nfish swim in the deep sea,no\n")
    reader = DatasetReader(path)
    assert [r.record for r in reader][0] == {"text": "the cat sat on the mat", "label": "yes"}
    assert reader.layout.startswith("a header row; text: 'words'; label: 'verdict'")


@pytest.mark.parametrize("text,why", [
    ("1\t2\t3\t4\n", "columns 'column 0' and 'column 1' both look like labels"),
    ("ham\tok\nham\tlater\n", "no column holds text"),  # one-word texts: cannot tell label from text
])
def test_an_undecidable_layout_stops_and_lists_the_columns(tmp_path, text, why):
    path = write(tmp_path, "a.tsv", text)
    with pytest.raises(DatasetError, match=rf"cannot tell the text and label columns \({why}.*Columns: column 0, "
                                           r"column 1.*--text-column and --label-column"):
        rows(path)


def test_prose_read_as_a_table_asks_for_columns_or_text_not_a_traceback(tmp_path):
    # the first line has fewer commas than the lines under it: columns past the first row's
    # width must still be named in the question
    path = write(tmp_path, "mybook", "Hello, world and more\nA line, with, many, commas, here, and, there\n"
                                     "third line plain\n")
    with pytest.raises(DatasetError, match=r"cannot tell the text and label columns .*Columns: column 0, "
                                           r"column 1.*column 6.*--input-format text"):
        rows(path)


def test_blank_lines_extra_columns_and_multiline_records_are_counted(tmp_path):
    path = write(tmp_path, "a.csv", 'text,label\n\nhello there,a\n"a stray quote,b\nswallows,c\nlines,d\n'
                                    'good bye now,b,extra\n')
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True))
    got = [r.record for r in reader]
    assert got[0] == {"text": "hello there", "label": "a"}
    assert reader.notes.blank_lines == 1 and reader.notes.extra_columns == []
    assert reader.notes.multiline == [(4, 7)]  # the stray quote merged lines 4-7 into one field
    lines = reader.notes.lines()
    assert any("1 blank line" in line for line in lines) and any("lines 4-7" in line for line in lines)
    extra = write(tmp_path, "b.csv", "text,label\nhello there,a\ngood bye now,b,extra\n")
    reader = DatasetReader(extra)
    assert [r.record for r in reader][1] == {"text": "good bye now", "label": "b"} and reader.notes.extra_columns == [3]


def test_a_stray_quote_that_swallows_more_than_the_field_limit_names_the_lines_it_took(tmp_path):
    """Was: one bad line 'field larger than field limit (131072)' and the ~4,400 lines the
    quote merged gone with no note."""
    body = "".join(f"message number {i} is here,{'ab'[i % 2]}\n" for i in range(6000))
    path = write(tmp_path, "a.csv", 'text,label\n"stray quote here now,spam\n' + body)
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True, max_line_bytes=100_000))
    got = list(reader)
    [(line, reason)] = reader.bad_lines
    last = reader.notes.multiline[-1][1]
    assert line == 2 and reason.startswith("too-large:") and f"lines 2-{last}" in reason
    assert len(got) == 6002 - last  # every line after the merged span is a record
    assert any(f"lines 2-{last}" in note for note in reader.notes.lines())


def test_a_bad_record_merged_by_a_stray_quote_names_its_lines(tmp_path):
    """Was: 'missing-field: 1 field(s) ...' at line 2 only, the 6,000 lines it took named in a note alone."""
    body = "".join(f"message number {i} is here,{'ab'[i % 2]}\n" for i in range(6000))
    path = write(tmp_path, "a.csv", 'text,label\n"stray quote here now,spam\n' + body)
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True, max_line_bytes=1_000_000))
    assert list(reader) == []
    assert reader.bad_lines == [(2, "missing-field: 1 field(s), the text/label columns need 2 (lines 2-6002 read as "
                                    "one record: a stray quote?)")]


@pytest.mark.parametrize("max_line_bytes", [None, 1_000_000])
def test_a_long_quoted_csv_field_is_read_as_a_long_json_line_is(tmp_path, max_line_bytes):
    """Was: a 200 KB field was a bad line (csv's default field limit of 128 KB)."""
    text = "word " * 40_000 + "end"
    path = write(tmp_path, "a.csv", f'text,label\n"{text}",long\nshort one,b\n')
    got = rows(path, max_line_bytes=max_line_bytes)
    assert [r.record["label"] for r in got] == ["long", "b"] and got[0].record["text"] == text


@pytest.mark.parametrize("odd", [0, 5], ids=["first row", "fifth row"])
def test_one_row_with_an_extra_column_does_not_decide_the_layout(tmp_path, odd):
    """Was: the widest row's width decided, on that row alone, and every other row was bad."""
    words = ["see you at noon then", "win a free prize now", "call me when you land", "lunch at the usual place"]
    lines = [f"{'ham' if i % 3 else 'spam'}\t{words[i % 4]} {i}" for i in range(12)]
    lines[odd] += "\tps: sent from my phone"
    path = write(tmp_path, "sms.tsv", "\n".join(lines) + "\n")
    reader = DatasetReader(path)
    got = [r.record for r in reader]
    assert len(got) == 12 and got[odd] == {"text": f"{words[odd % 4]} {odd}", "label": "ham" if odd % 3 else "spam"}
    assert reader.layout.startswith("no header row; text: 'column 1'; label: 'column 0'")
    assert reader.notes.extra_columns == [odd + 1]
    assert reader.notes.lines() == [f"1 row(s) with more than 2 columns, extra cells ignored (lines {odd + 1})"]


@pytest.mark.parametrize("line,reason", [
    ("spam", "1 field"),
    ("spam\t   ", "text is empty"),
    ("\thello", "empty label"),
])
def test_table_bad_line_stops_with_its_line_number(tmp_path, line, reason):
    path = write(tmp_path, "SMSSpamCollection", f"ham\tsee you at noon\n{line}\nham\tafter the game then\n")
    with pytest.raises(DatasetError, match=rf"SMSSpamCollection:2: .*{reason}"):
        rows(path)
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True))
    list(reader)
    [(_, got)] = reader.bad_lines
    assert reason_code(got) in REASONS, got  # was: '1 field(s), ...' and 'empty label', no code


def test_csv_bad_line_numbers_count_physical_lines(tmp_path):
    path = write(tmp_path, "a.csv", 'text,label\n"multi\nline",a\nonly-text\n')
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True))
    assert [r.record for r in reader] == [{"text": "multi\nline", "label": "a"}]
    assert reader.bad_lines == [(4, "missing-field: 1 field(s), the text/label columns need 2")]


def test_non_utf8_table_line(tmp_path):
    path = write(tmp_path, "a.tsv", b"ham\tok\nham\tcaf\xe9\n")
    with pytest.raises(DatasetError, match=r"a.tsv:2: invalid-utf8: byte 0xe9 at column 8 is not UTF-8"):
        rows(path)


# ---------------------------------------------------------------------------- movielens

def test_movielens_u_data_is_next_item_events_in_time_order(tmp_path):
    path = write(tmp_path, "u.data", "196\t242\t3\t881250949\n186\t302\t3\t891717742\n"
                                     "22\t377\t1\t878887116\n196\t51\t2\t881250949\n\n")
    got = rows(path)
    assert [(r.key, r.record["item"], r.ts_ms) for r in got] == [
        (b"22", 377, 878887116000),
        (b"196", 242, 881250949000),  # a tie keeps file order
        (b"196", 51, 881250949000),
        (b"186", 302, 891717742000),
    ]
    assert got[0].record == {"key": "22", "item": 377, "ts": 878887116000}
    assert all(from_dict(r.record).is_next_item for r in got)


def test_movielens_ratings_csv(tmp_path):
    path = write(tmp_path, "ratings.csv", "userId,movieId,rating,timestamp\n1,31,2.5,1260759144\n1,10,4.0,1260759100\n")
    assert [(r.key, r.record["item"], r.ts_ms) for r in rows(path)] == [
        (b"1", 10, 1260759100000), (b"1", 31, 1260759144000)]


@pytest.mark.parametrize("line,reason", [
    ("196\t242\t3", "expected 4 fields"),
    ("196\tx\t3\t881250949", "must be integers"),
    ("196\t242\tgood\t881250949", "rating a number"),
    ("196\t242\t3\t-5", "not unix seconds"),
    ("99999999999999999999\t20\t4\t881250950", "user 99999999999999999999 does not fit in 64 bits"),
    ("196\t-9223372036854775809\t4\t881250950", "item -9223372036854775809 does not fit in 64 bits"),
])
def test_movielens_bad_line(tmp_path, line, reason):
    path = write(tmp_path, "u.data", f"1\t2\t3\t4\n{line}\n")
    with pytest.raises(DatasetError, match=rf"u.data:2: .*{reason}"):
        rows(path)
    reader = DatasetReader(path, ReadOptions(skip_bad_lines=True))
    assert len(list(reader)) == 1 and reader.bad_lines[0][0] == 2


def test_ratings_csv_needs_its_header(tmp_path):
    path = write(tmp_path, "r.csv", "1,31,2.5,1260759144\n")
    with pytest.raises(DatasetError, match="r.csv:1: expected the header userId,movieId,rating,timestamp"):
        rows(path, format="movielens-csv")


# ---------------------------------------------------------------------------- the rest

def test_plain_text_is_cut_into_records_of_32_words_across_line_breaks(tmp_path):
    words = [f"w{i}" for i in range(70)]
    lines = "\n".join(" ".join(words[i:i + 9]) for i in range(0, 70, 9))  # lines of 9 words
    got = [row.record for row in rows(write(tmp_path, "book.txt", lines + "\n\n"))]
    assert got == [{"text": " ".join(words[:32])}, {"text": " ".join(words[32:64])}, {"text": " ".join(words[64:])}]
    assert all(from_dict(r).text for r in got)


def test_unspaced_chinese_is_cut_at_32_characters_not_32_clauses(tmp_path):
    """Was: a space-separated word was the unit, so a record of Chinese held 32 clauses
    (~336 characters) and its tokens past hashing.max_tokens were never learned or scored."""
    from streamlearn.hashing import words

    clause = "我喜欢吃苹果，你呢？"  # 10 words: 8 characters and 2 marks
    text = clause * 7 + "\nhello 世界 world " + clause
    got = [row.record["text"] for row in rows(write(tmp_path, "zh.txt", text + "\n"))]
    assert got[0] == clause * 3 + "我喜" and got[1] == "欢吃苹果，你呢？" + clause * 2 + "我喜欢吃"
    assert got[2] == "苹果，你呢？ hello 世界 world " + clause
    assert [len(words(t, scripts=True)) for t in got] == [32, 32, 20]
    assert "".join(got).replace(" ", "") == text.replace("\n", "").replace(" ", "")  # nothing lost nor added
    korean = " ".join(["안녕하세요"] * 40)  # spaced: words, as before
    assert [row.record["text"] for row in rows(write(tmp_path, "ko.txt", korean))] == [
        " ".join(["안녕하세요"] * 32), " ".join(["안녕하세요"] * 8)]


def test_replay_of_a_text_file_asks_which_token_task(tmp_path):
    from streamlearn.datasets import task_of

    with pytest.raises(DatasetError, match="a token stream; pass --task next-token or --task mlm"):
        task_of(write(tmp_path, "book.txt", "a b c\n"))


def test_estimate_rows(tmp_path):
    assert DatasetReader(write(tmp_path, "a.jsonl", '{"text":"a"}\n{"text":"b"}')).estimate_rows() == 2
    assert DatasetReader(write(tmp_path, "u.data", "1\t2\t3\t4\n")).estimate_rows() == 1
    assert DatasetReader(write(tmp_path, "ratings.csv", "userId,movieId,rating,timestamp\n1,2,3,4\n")).estimate_rows() == 1
    assert DatasetReader(write(tmp_path, "b.jsonl", "")).estimate_rows() == 0


def test_empty_files_give_no_rows(tmp_path):
    assert rows(write(tmp_path, "a.tsv", "")) == []
    assert rows(write(tmp_path, "a.jsonl", "\n\n")) == []


def test_bundled_sms_sample_reads_as_its_readme_says():
    reader = DatasetReader(bundled_path("SMSSpamCollection"))
    labels = Counter(r.record["label"] for r in reader)
    assert reader.format == "tsv" and labels == {"ham": 4827, "spam": 747} and not reader.bad_lines


def test_bundled_path_rejects_other_names():
    with pytest.raises(DatasetError, match="shipped: SMSSpamCollection"):
        bundled_path("../broker.py")


# ---------------------------------------------------------------------------- byte order marks, line endings

BOM = "\ufeff"


@pytest.mark.parametrize("name,text,first", [
    ("a.csv", "text,label\nfree prize now,spam\nsee you,ham\n", {"text": "free prize now", "label": "spam"}),
    ("SMSSpamCollection", "ham\tsee you at noon\nspam\twin a free prize\n", {"text": "see you at noon", "label": "ham"}),
    ("a.jsonl", '{"text": "hi", "label": "x"}\n', {"text": "hi", "label": "x"}),
    ("stream.log", '{"text": "hi", "label": "x"}\n', {"text": "hi", "label": "x"}),  # detected by its '{'
    ("book.txt", "the cat sat\n", {"text": "the cat sat"}),
    ("mine.csv", "userId,movieId,rating,timestamp\n1,2,3.5,4\n", {"key": "1", "item": 2, "ts": 4000}),
])
def test_a_utf8_byte_order_mark_is_not_part_of_the_first_line(tmp_path, name, text, first):
    """Was: a header '\\ufefftext' not recognised, a label '\\ufeffham', line 1 invalid-json, a
    first word '\\ufeffthe', ratings.csv and '{' detection failing."""
    assert rows(write(tmp_path, name, BOM + text))[0].record == first


@pytest.mark.parametrize("name,text", [
    ("SMSSpamCollection", "ham\tsee you at noon\rspam\twin a free prize\r\rham\tok then see you\r"),
    ("a.jsonl", '{"text": "see you at noon", "label": "ham"}\r{"text": "win a free prize", "label": "spam"}\r\r'
                '{"text": "ok then see you", "label": "ham"}'),
    ("a.csv", "text,label\rsee you at noon,ham\rwin a free prize,spam\rok then see you,ham\r"),
])
def test_lone_cr_line_endings_split_lines(tmp_path, name, text):
    """Was: a file with only '\\r' line endings (classic Mac) was one record with '\\r' inside."""
    path = write(tmp_path, name, text)
    assert [r.record for r in rows(path)] == [{"text": "see you at noon", "label": "ham"},
                                              {"text": "win a free prize", "label": "spam"},
                                              {"text": "ok then see you", "label": "ham"}]
    assert DatasetReader(path).estimate_rows() in (3, 4)  # a header counts


def test_crlf_and_a_quoted_cr_are_not_lone_cr_endings(tmp_path):
    path = write(tmp_path, "a.csv", 'text,label\r\n"two\rparts",ham\r\nsee you,spam\r\n')
    assert [r.record["text"] for r in rows(path)] == ["two\rparts", "see you"]


def test_column_options_on_a_file_without_columns_are_refused(tmp_path):
    """Was: --text-column on a JSON lines file was ignored without a word."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n')
    with pytest.raises(DatasetError, match=r"^--text-column picks columns of a csv or tsv table; a.jsonl is read as "
                                           r"jsonl, which has none$"):
        DatasetReader(path, ReadOptions(text_column="1"))
    with pytest.raises(DatasetError, match=r"^--text-column and --label-column pick columns"):
        DatasetReader(path, ReadOptions(text_column="1", label_column="0"))
