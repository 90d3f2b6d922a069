"""`make bench`: bench/run_all.py runs every benchmark script, keeps going past a failure,
and every script finds its data the one way bench/data.py gives (--data, else
../shared/data beside the repository, else a labelled synthetic stream)."""
import re
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import data as bench_data
import run_all

SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name not in run_all.HELPERS)


def test_every_benchmark_script_is_run_by_make_bench():
    assert run_all.unregistered() == [], "add these scripts to BENCHMARKS in bench/run_all.py (a quick and a full form)"
    assert all(b.script.is_file() for b in run_all.BENCHMARKS)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_benchmark_names_a_path_of_one_machine(script):
    source = script.read_text(encoding="utf-8")
    assert not re.search(r"[\"'](/work|/home|/Users|/tmp|/opt)/", source), f"{script.name}: use bench/data.py or --dir"
    assert "shared\" / \"data" not in source and "shared/data\")" not in source, f"{script.name}: use bench/data.py"


@pytest.mark.parametrize("bench", [b for b in run_all.BENCHMARKS if b.data], ids=lambda b: b.name)
def test_every_benchmark_that_reads_datasets_takes_data_from_bench_data(bench):
    source = bench.script.read_text(encoding="utf-8")
    assert re.search(r"^from data import .*add_data_option", source, re.M), bench.name
    assert "--data" in bench.command(False, Path("/d"))


def test_a_missing_dataset_is_a_synthetic_stream_that_says_so(tmp_path):
    text = bench_data.text_stream("ag-news-5000", tmp_path, n=50)
    assert text.synthetic and "SYNTHETIC" in text.source and "train_random5000_text_label.csv" in text.source
    assert len(text.records) == 50 and {r["label"] for r in text.records} == {f"topic{c}" for c in range(4)}
    events = bench_data.events_stream(tmp_path, n=200)
    assert events.synthetic and all({"key", "item", "ts"} <= set(e) for e in events.records)
    assert bench_data.synthetic_text(20, 2) == bench_data.synthetic_text(20, 2)  # seeded
    assert bench_data.ag_news(tmp_path).synthetic and len(bench_data.ag_news(tmp_path).records) == 5_581


def test_a_present_dataset_is_read_and_an_explicit_missing_folder_is_an_error(tmp_path):
    folder = tmp_path / "sms-spam-collection"
    folder.mkdir()
    (folder / "SMSSpamCollection").write_text("ham\tsee you at five\nspam\twin a free prize now\n")
    stream = bench_data.text_stream("sms", bench_data.data_dir(tmp_path))
    assert not stream.synthetic and stream.records[1] == {"text": "win a free prize now", "label": "spam"}
    with pytest.raises(SystemExit, match="no such directory"):
        bench_data.data_dir(tmp_path / "nowhere")
    assert bench_data.data_dir(None) == bench_data.ROOT.parent / "shared" / "data"


def test_run_all_lists_without_running(capsys, tmp_path):
    assert run_all.main(["--list", "--logs", str(tmp_path / "logs")]) == 0
    out = capsys.readouterr().out
    assert all(f"python bench/{b.name}.py" in out for b in run_all.BENCHMARKS)
    assert not (tmp_path / "logs").exists()


def test_run_all_goes_on_after_a_failure_and_summarizes(monkeypatch, capsys, tmp_path):
    """A benchmark that fails (here: a flag hashing.py does not have) is reported and the
    next one runs; the exit status says one failed; the headline is in the summary."""
    good = run_all.BY_NAME["hashing"]
    bad = run_all.Benchmark("hashing", ("--no-such-flag",), (), 1, 1, r"^$", data=True)
    monkeypatch.setattr(run_all, "BY_NAME", {"broken": bad, "hashing": good})
    code = run_all.main(["--only", "broken", "hashing", "--data", str(tmp_path), "--logs", str(tmp_path / "logs")])
    out = capsys.readouterr().out
    assert code == 1
    assert re.search(r"hashing +failed \(exit 2\)", out) and re.search(r"hashing +ok ", out)
    assert "TokenHasher / bare loop = " in out.split("summary")[1]  # the good run's headline
    assert "SYNTHETIC" in (tmp_path / "logs" / "hashing.log").read_text()  # tmp_path holds no datasets
