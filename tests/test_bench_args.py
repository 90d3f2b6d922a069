"""The bench scripts' command lines: a value out of range, an unknown name or a missing
--data folder is a one-line usage error (exit 2) before any work, never a traceback
minutes in or a run that quietly does something else; every option says what it does."""
import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import options
import run_all

NOWHERE = "no/such/folder"

# (script, arguments, a part of the error line). Each once failed another way (QA, 2026-11-29):
# a traceback, a run of minutes before failing, or a run on other values than asked for.
BAD = [
    ("worker", ["--records", "-1"], "--records: -1 is not a whole number of at least 1"),
    ("worker", ["--rounds", "0"], "--rounds"),
    ("item_speed", ["--limit", "-1"], "--limit"),
    ("hashing", ["--repeats", "0"], "--repeats"),
    ("embeddings", ["--repeats", "0", "--skip-memory"], "--repeats"),
    ("decoding", ["--n", "-5"], "--n"),
    ("checkpoint", ["--rows", "-5"], "--rows"),
    ("checkpoint", ["--shards", "1000"], "from 1 to 256"),
    ("profile_step", ["--steps", "-1"], "--steps"),
    ("tokens", ["--tasks", "foo"], "'foo' is not one of next-token, mlm"),
    ("tokens", ["--depths", "x"], "--depths"),
    ("tokens", ["--records", "-5", "--dry-run"], "--records"),
    ("speed", ["--records", "-5", "--dry-run"], "--records"),
    ("speed", ["--passes", "0", "--dry-run"], "--passes"),
    ("streams", ["--passes", "0", "--dry-run"], "--passes"),
    ("streams", ["--only", "sms", "--dry-run"], "'sms' is not one of sms-spam, ag-news-5000"),
    ("shapes", ["--streams", "typo"], "--streams typo"),
    ("shapes", ["--task", "text", "--streams", "ag-news"], "text: sms, ag_news, yelp"),
    ("shapes", ["--task", "next-item", "--streams", "sms"], "next-item: ml-time"),
    ("shapes", ["--seeds", "-1"], "--seeds"),
    ("scaleout", ["--data", NOWHERE], "no such directory"),
    ("scaleout", ["--skip-quality", "--data", NOWHERE], "no such directory"),
    ("init_compare", ["--data", NOWHERE], "no such directory"),
    ("run_all", ["--data", NOWHERE], "no such directory"),
    ("run_all", ["--timeout", "-1"], "--timeout"),
    ("serve", ["--clients", "0"], "--clients"),
    ("serve", ["--window-seconds", "nan"], "--window-seconds"),
    ("startup", ["--repeats", "0"], "--repeats"),
    ("state_faults", ["--kills", "0"], "--kills"),
    ("depth", ["--ids", "21"], "need an even n_ids"),
    ("quality", ["--threads", "0"], "--threads"),
    # a refused --set is streamlearn's one line too (was: a ConfigError traceback)
    ("tokens", ["--set", "model.layers=-3", "--dry-run"], "model.layers must be >= 0, got -3"),
    ("profile_step", ["--set", "learner.batch_size=0"], "learner.batch_size"),
    ("shapes", ["--set", "no.such=1"], "no.such"),
]


@pytest.mark.parametrize(("script", "args", "says"), BAD, ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_a_bad_value_is_a_one_line_usage_error_before_any_work(script, args, says):
    done = subprocess.run([sys.executable, str(BENCH / f"{script}.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert errors == [done.stderr.splitlines()[-1]] and says in errors[0], done.stderr
    assert done.stdout == "" or "--set" in args  # nothing ran (a --set is checked when the model is built)


def _parser_calls(tree: ast.AST):
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"]


SCRIPTS = sorted(p for p in BENCH.glob("*.py") if p.name not in run_all.HELPERS or p.name == "run_all.py")


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_option_has_help_and_every_number_a_range(script):
    tree = ast.parse(script.read_text(encoding="utf-8"))
    calls = _parser_calls(tree)
    assert calls, f"{script.name}: no options found"
    for call in calls:
        kw = {k.arg: k.value for k in call.keywords}
        name = call.args[0].value if call.args else "?"
        assert "help" in kw, f"{script.name} {name}: say what the option does (and its default)"
        if isinstance(kw.get("type"), ast.Name) and kw["type"].id in ("int", "float"):
            assert "choices" in kw, f"{script.name} {name}: a bare int/float takes -1 and 0; use bench/options.py"
    assert "ArgumentParser(" not in script.read_text(encoding="utf-8"), f"{script.name}: use options.parser_for"


@pytest.mark.parametrize("name", sorted(run_all.BY_NAME))
def test_help_opens_with_the_whole_first_paragraph(name, monkeypatch, capsys):
    """``--help`` ends no sentence halfway (it once printed the docstring's first line only)."""
    module = __import__(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 0
    out = "".join(capsys.readouterr().out.split())  # argparse rewraps, and breaks lines at hyphens
    first = "".join(module.__doc__.split("\n\n")[0].split())
    assert first.endswith(".") and first in out, out[:400]


def test_option_types_take_their_range_and_refuse_the_rest():
    assert options.positive_int("1") == 1 and options.nonneg_int("0") == 0
    assert options.between(1, 3)("3") == 3 and options.positive_float("0.5") == 0.5
    assert options.nonneg_float("0") == 0.0
    assert options.whole_numbers(0)("0,2") == [0, 2] and options.names("ab")("b,a") == ["b", "a"]
    refused = [(options.positive_int, "0"), (options.nonneg_int, "-1"), (options.positive_int, "1.5"),
               (options.between(1, 3), "4"), (options.positive_float, "0"), (options.positive_float, "inf"),
               (options.nonneg_float, "nan"), (options.nonneg_float, "-0.1"), (options.whole_numbers(0), "1,,2"),
               (options.whole_numbers(0), "1,1"), (options.names("ab"), "c"), (options.names("ab"), "a,a")]
    for parse, text in refused:
        with pytest.raises(argparse.ArgumentTypeError):
            parse(text)


def test_run_all_times_in_its_docstring_and_the_docs_are_those_list_prints():
    import re

    quick = round(sum(b.quick_s for b in run_all.BENCHMARKS) / 60)
    full = round(sum(b.full_s for b in run_all.BENCHMARKS) / 60)
    assert run_all.listing(list(run_all.BENCHMARKS), False, None).startswith(f"quick run, about {quick} minutes")
    assert run_all.listing(list(run_all.BENCHMARKS), True, None).startswith(f"full run, about {full} minutes")
    said = dict(re.findall(r"bench/run_all\.py( +--full)?\s+# .*?\(about (\d+) minutes\)", run_all.__doc__))
    assert said == {"": str(quick), " --full": str(full)}, said
    docs = " ".join((ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8").split())
    assert f"`--full` runs the full commands of the tables below (about {full} minutes" in docs
