"""The docs match behaviour: docs/configuration.md lists every config key with its current
default and the values it allows, as streamlearn/config.py declares them (the allowed
column is each key's rule); every ```python block of docs/python.md and docs/evaluation.md
runs as pasted and prints what the page shows."""
import contextlib
import dataclasses
import io
import re
from pathlib import Path

from streamlearn.config import Config, section_classes
from streamlearn.config_rules import rule_of
from streamlearn.datasets import bundled_path

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def _documented() -> dict[tuple[str, str], tuple[str, str]]:
    """(section, key) -> (default, allowed) from the doc's tables."""
    rows, section = {}, None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"## \[(\w+)\]", line)
        if heading:
            section = heading.group(1)
        row = re.match(r"\| `(\w+)` \| `(.*)` \| (.+?) \| (.+) \|$", line)
        if row and section:
            rows[(section, row.group(1))] = (row.group(2), row.group(3))
    return rows


def _declared() -> dict[tuple[str, str], tuple[str, str]]:
    cfg = Config()
    return {
        (name, f.name): (repr(getattr(getattr(cfg, name), f.name)), rule_of(f).text)
        for name, cls in section_classes().items()
        for f in dataclasses.fields(cls)
    }


def test_every_config_key_is_documented_with_its_default():
    documented, declared = _documented(), _declared()
    assert set(documented) == set(declared), "docs/configuration.md keys differ from streamlearn/config.py"
    stale = {key: (documented[key][0], want) for key, (want, _) in declared.items() if documented[key][0] != want}
    assert not stale, f"defaults in docs/configuration.md are stale: {stale}"


def test_every_config_key_is_documented_with_what_it_allows():
    documented, declared = _documented(), _declared()
    stale = {key: (documented[key][1], want) for key, (_, want) in declared.items() if documented[key][1] != want}
    assert not stale, f"set the allowed column of docs/configuration.md to the rule's text: {stale}"


# ---------------------------------------------------------------------------- code blocks that run

DOCS = DOC.parent
SHOWN = re.compile(r"#\s*->\s*(.*)$")  # `print(x)  # -> what it prints`; `...` stands for what varies


def python_blocks(page: str) -> list[tuple[int, str]]:
    """(first line number, code) of every ```python block of docs/<page>, in order."""
    text = (DOCS / page).read_text(encoding="utf-8")
    return [(text[:m.start(1)].count("\n") + 1, m.group(1)) for m in re.finditer(r"```python\n(.*?)```", text, re.S)]


def shown_outputs(code: str) -> list[str | None]:
    """Per print() line of ``code``, in order, the output the page shows after ``# ->`` (None: not shown)."""
    out = []
    for line in code.splitlines():
        if line.lstrip().startswith("print("):
            shown = SHOWN.search(line)
            out.append(shown.group(1).strip() if shown else None)
    return out


def run_blocks(page: str, namespace: dict, replace: dict[str, str] | None = None, only: slice = slice(None)) -> None:
    """Execute the page's python blocks (``only``) in ``namespace`` and check each shown
    output against what the print printed (``...``: any text)."""
    for line, code in python_blocks(page)[only]:
        for old, new in (replace or {}).items():
            code = code.replace(old, new)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"docs/{page} (block at line {line})", "exec"), namespace)  # noqa: S102
        lines, shown = printed.getvalue().splitlines(), shown_outputs(code)
        assert len(lines) == len(shown), f"docs/{page} line {line}: one print per line expected, got {lines}"
        for got, want in zip(lines, shown):
            if want is not None:
                pattern = ".*".join(re.escape(part) for part in want.split("..."))
                assert re.fullmatch(pattern, got), f"docs/{page} line {line}: the page shows {want!r}, it printed {got!r}"


def test_every_python_block_of_python_md_runs_as_pasted_and_its_saved_learner_is_a_state_dir(
        tmp_path, monkeypatch, one_torch_thread, capsys):
    """The page's blocks in order, then what it says of the directory save_learner wrote:
    `inspect` and `replay --state` read it."""
    from streamlearn.cli import main

    monkeypatch.chdir(tmp_path)
    run_blocks("python.md", {})
    assert main(["inspect", "--state", "sms-model"]) == 0
    assert main(["replay", "--no-progress", "--file", str(bundled_path()), "--state", "sms-model", "--mode", "frozen",
                 "--limit", "200"]) == 0
    assert "replay classify frozen: 200 records, 200 scored" in capsys.readouterr().out


def test_evaluation_md_file_replay_example_runs_as_pasted(tmp_path, monkeypatch, one_torch_thread):
    monkeypatch.chdir(tmp_path)
    run_blocks("evaluation.md", {}, only=slice(0, 1))
    assert (tmp_path / "sms.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluation_md_kafka_replay_example_runs_against_a_broker(tmp_path, monkeypatch, one_torch_thread, broker, topic):
    """The Kafka block, with the quickstart's 127.0.0.1:9092 and topic sms standing for the
    test broker and a fresh topic holding the first 300 SMS records."""
    from streamlearn.broker import create_topic, produce_rows
    from streamlearn.datasets import DatasetReader

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    run_blocks("evaluation.md", namespace, only=slice(0, 1))
    create_topic(broker, topic, 2)
    produce_rows(broker, topic, (row for _, row in zip(range(300), DatasetReader(bundled_path()))))
    run_blocks("evaluation.md", namespace, {"127.0.0.1:9092": broker, '"sms"': f'"{topic}"'}, only=slice(1, 2))
    assert namespace["kafka"]["evaluated"] == 300


def test_evaluation_md_sample_summary_is_what_replay_prints_for_the_model(capsys, one_torch_thread):
    """The pasted run's model row (accuracy, macro_f1, log_loss: deterministic; records/s
    are not compared) against a replay of the same file with the current defaults."""
    from streamlearn.cli import main

    sample = (DOCS / "evaluation.md").read_text(encoding="utf-8")
    shown = re.search(r"^  model +([\d.]+) +([\d.]+) +([\d.]+) ", sample, re.M).groups()
    assert main(["replay", "--no-progress", "--file", str(bundled_path())]) == 0
    row = re.search(r"^  model +([\d.]+) +([\d.]+) +([\d.]+) ", capsys.readouterr().out, re.M).groups()
    assert row == shown, "re-run the command under docs/img/replay-sms.png and paste its output into evaluation.md"
