"""The docs match behaviour: docs/configuration.md lists every config key with its current
default and the values it allows, as streamlearn/config.py declares them (the allowed
column is each key's rule); every ```python block of docs/python.md and docs/evaluation.md
runs as pasted and prints what the page shows."""
import codeop
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


def test_every_tasks_defaults_are_documented():
    from streamlearn.tasks import REGISTRY

    text = DOC.read_text()
    for name, entry in REGISTRY.items():
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/configuration.md: give task {name} a row under Task defaults"
        for assignment in entry.defaults:
            assert f"`{assignment}`" in row, (name, assignment)


def test_the_keys_a_restart_must_keep_are_documented():
    from streamlearn.config import MODEL_KEYS

    section = DOC.read_text().split("## Changing the config of a stored model", 1)[1]
    for dotted in MODEL_KEYS:
        table, name = dotted.split(".")
        row = next(line for line in section.splitlines() if line.startswith(f"| `[{table}]` |"))
        assert f"`{name}`" in row, dotted


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
            exec(compile(code, f"docs/{page} (block at line {line})", "exec"), namespace)
        lines, shown = printed.getvalue().splitlines(), shown_outputs(code)
        assert len(lines) == len(shown), f"docs/{page} line {line}: one print per line expected, got {lines}"
        for got, want in zip(lines, shown):
            if want is not None:
                pattern = ".*".join(re.escape(part) for part in want.split("..."))
                assert re.fullmatch(pattern, got), f"docs/{page} line {line}: the page shows {want!r}, it printed {got!r}"


def repl_rejects(code: str) -> str | None:
    """The first line Python 3.11's interactive prompt refuses when ``code`` is pasted into
    it (None: it takes every line). The prompt compiles each statement as it is typed: a
    compound statement ends only at a blank line, so a dedented line straight after a loop
    body is a SyntaxError there, though the same text runs as a script."""
    pending: list[str] = []
    for line in code.splitlines():
        pending.append(line)
        try:
            if codeop.compile_command("\n".join(pending), "<stdin>", "single") is not None:
                pending = []
        except SyntaxError:
            return line
    return None


def test_repl_rejects_a_loop_without_its_blank_line():
    assert repl_rejects("for i in range(2):\n    x = i\nprint(x)\n") == "print(x)"
    assert repl_rejects("for i in range(2):\n    x = i\n\nprint(x)\n") is None
    assert repl_rejects("x = f(\n    1,\n)\nprint(x)  # -> 1\n") is None


def test_every_python_block_of_the_docs_pastes_into_the_interactive_prompt():
    refused = [f"docs/{page.name} (block at line {line}): {bad!r}"
               for page in sorted(DOCS.glob("*.md")) for line, code in python_blocks(page.name)
               if (bad := repl_rejects(code)) is not None]
    assert not refused, f"a blank line must end each compound statement before the next line: {refused}"


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
    are not compared) against a replay of the same file with the current defaults, on the
    CPU as the pasted run was (bf16 training on a GPU moved the log loss's last digit)."""
    from streamlearn.cli import main

    sample = (DOCS / "evaluation.md").read_text(encoding="utf-8")
    shown = re.search(r"^  model +([\d.]+) +([\d.]+) +([\d.]+) ", sample, re.M).groups()
    assert main(["replay", "--no-progress", "--file", str(bundled_path()), "--set", "learner.device=cpu"]) == 0
    row = re.search(r"^  model +([\d.]+) +([\d.]+) +([\d.]+) ", capsys.readouterr().out, re.M).groups()
    assert row == shown, "re-run the command under docs/img/replay-sms.png and paste its output into evaluation.md"


# ---------------------------------------------------------------------------- defaults quoted outside the reference

KEY = re.compile(r"`(?:(\w+)\.)?(\w+)`")
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def quoted_value(text: str):
    """A default as a page writes it (``20,000``, ``16 MiB``, ``true``, `` `mean` ``) as a
    Python value; None when it is prose, not a value."""
    text = text.strip().strip("`").strip()
    power = re.fullmatch(r"10([⁰¹²³⁴⁵⁶⁷⁸⁹]+)", text)
    if power:
        return 10 ** int(power.group(1).translate(str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")))
    if text in ("true", "false"):
        return text == "true"
    number = re.fullmatch(r"(-?[\d,]*\.?\d+)(?:\s*(KiB|MiB|GiB))?", text)
    if number:
        value = float(number.group(1).replace(",", "")) * UNITS.get(number.group(2), 1)
        return int(value) if value.is_integer() else value
    return text if re.fullmatch(r"[\w-]+", text) else None


def quoted_defaults() -> list[tuple[str, str, str, str]]:
    """(page:line, section, key, value as written) for every config key a page other than
    configuration.md quotes a default of: rows of tables with a `default` column (a row may
    name several keys, `a.x` / `y` with values `1 / 2`, or `a.x`, `y` with `1, 2`), and prose
    `section.key` (default X)."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        if page.name == "configuration.md":
            continue
        column = None
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
            if not cells:
                column = None
            elif "default" in cells:
                column = cells.index("default")
            elif column is not None and not set(line) <= set("|-: ") and KEY.match(cells[0]):
                keys, values = KEY.findall(cells[0]), re.split(r" / |, " if "," in cells[0] else " / ", cells[column])
                section = keys[0][0]
                found += [(f"{page.name}:{n}", s or section, k, v) for (s, k), v in zip(keys, values)]
            for s, k, v in re.findall(r"`(\w+)\.(\w+)` \(default:? ([^,;)]+)", line):
                found.append((f"{page.name}:{n}", s, k, v))
    return found


def test_every_default_a_page_quotes_is_the_configs():
    cfg, quoted = Config(), quoted_defaults()
    assert len(quoted) >= 15, quoted  # the tuning table of operations.md at least: the parser still finds them
    wrong = []
    for where, section, key, text in quoted:
        value = quoted_value(text)
        actual = getattr(getattr(cfg, section), key)
        if value is not None and not (value == actual or isinstance(actual, float) and value == actual):
            wrong.append(f"{where}: {section}.{key} is {actual!r}, the page says {text!r}")
    assert not wrong, "\n".join(wrong)


# ---------------------------------------------------------------------------- monitoring

def metric_tables(page: str = "operations.md") -> set[str]:
    """Every metric name of the tables whose header starts `| metric |`, full names (the
    worker's table lists them without their `streamlearn_worker_` prefix), labels dropped."""
    names, prefix, table = set(), None, False
    for line in (DOCS / page).read_text(encoding="utf-8").splitlines():
        if "all prefixed `streamlearn_worker_`" in line:
            prefix = "streamlearn_worker_"
        if line.startswith("| metric |"):
            table = True
        elif not line.startswith("|"):
            if table:
                prefix = None
            table = False
        elif table and not set(line) <= set("|-: "):
            cell = line.split("|")[1]
            for name in re.findall(r"`(\w+)(?:\{[\w,]*\})?`", cell):
                names.add(name if name.startswith("streamlearn_") else (prefix or "") + name)
    return names


def exposed(registry) -> set[str]:
    """The names a scrape shows, as the docs write them: counters with `_total`,
    histograms and gauges by their family name."""
    return {f.name + "_total" if f.type == "counter" else f.name for f in registry.collect()}


def service_metric_names(tmp_path) -> set[str]:
    from fastapi.testclient import TestClient

    from streamlearn.learner import Learner
    from streamlearn.replay import save_learner
    from streamlearn.service import Settings, create_app

    learner = Learner(Config().override("model.layers=0", "embedding.K=2000", "embedding.B=200", "embedding.d=16",
                                        "model.d_model=16", "store.shards=2", "store.map_size_gb=0.05"))
    learner.learn_many([{"text": "free prize", "label": "spam"}, {"text": "see you", "label": "ham"}])
    save_learner(learner, tmp_path / "state")
    with TestClient(create_app(Settings(state=str(tmp_path / "state")))) as client:
        client.post("/v1/predict", json={"text": "free"})
        text = client.get("/metrics").text
    families = dict(re.findall(r"^# TYPE (\w+) (\w+)$", text, re.M))  # counters already end in _total here
    return {name for name in families if not name.endswith("_created")}  # _created: prometheus_client's own


def test_operations_md_names_every_metric_the_worker_and_the_service_expose(tmp_path):
    from streamlearn.consumers.metrics import WorkerMetrics

    documented = metric_tables()
    worker = exposed(WorkerMetrics(5.0).registry)
    service = {n for n in service_metric_names(tmp_path) if n.startswith("streamlearn_")}
    assert worker <= documented, f"document these worker metrics in operations.md: {sorted(worker - documented)}"
    assert service <= documented, f"document these service metrics in operations.md: {sorted(service - documented)}"
    assert documented <= worker | service, f"operations.md names metrics nothing exposes: {sorted(documented - worker - service)}"


def test_operations_md_prometheus_config_and_alerts_parse_and_use_real_metrics():
    import yaml

    from streamlearn.consumers.metrics import WorkerMetrics

    text = (DOCS / "operations.md").read_text(encoding="utf-8")
    scrape, alerts = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]
    assert [job["job_name"] for job in scrape["scrape_configs"]] == ["streamlearn-worker", "streamlearn-serve"]
    rules = {rule["alert"]: rule["expr"] for group in alerts["groups"] for rule in group["rules"]}
    assert set(rules) == {"StreamlearnLagGrowing", "StreamlearnAccuracyFalling", "StreamlearnTokenModelBelowPopularity"}
    worker = exposed(WorkerMetrics(5.0).registry)
    used = {name for expr in rules.values() for name in re.findall(r"streamlearn_\w+", expr)}
    assert used <= worker and {"streamlearn_worker_prequential_correct_total",
                               "streamlearn_worker_prequential_evaluated_total",
                               "streamlearn_worker_prequential_loss",
                               "streamlearn_worker_prequential_baseline_loss"} <= used, used


def test_operations_md_dead_letter_reader_prints_every_letter_and_ends(broker, make_topic, tmp_path, capsys):
    """A worker dead-letters three bad records of a topic; the page's reader, pointed at
    this broker and that topic's dead-letter topic, prints the three and returns."""
    import threading

    from kafka import KafkaProducer

    from streamlearn.cli import main

    topic = make_topic(2)
    producer = KafkaProducer(bootstrap_servers=broker)
    values = [b'{"text": "free prize now", "label": "spam"}', b"not a record", None, b'{"label": "ham"}',
              b'{"text": "see you later", "label": "ham"}']
    for i, value in enumerate(values):
        producer.send(topic, value=value, key=str(i).encode(), partition=i % 2)
    producer.flush(10)
    producer.close()
    tiny = ["model.layers=0", "embedding.K=2000", "embedding.B=200", "embedding.d=16", "model.d_model=16",
            "store.shards=2", "store.map_size_gb=0.05", "worker.session_timeout_ms=3000",
            "worker.heartbeat_interval_ms=500", "worker.poll_timeout_ms=100"]
    assert main(["worker", "--topic", topic, "--state", str(tmp_path / "state"), "--bootstrap", broker,
                 "--until-idle", "2", *(f"--set={s}" for s in tiny)]) == 0
    capsys.readouterr()
    (_, code), = [b for b in python_blocks("operations.md") if "sms.dlq" in b[1]]
    code = code.replace("127.0.0.1:9092", broker).replace('"sms.dlq"', f'"{topic}.dlq"')
    done = threading.Thread(target=exec, args=(compile(code, "docs/operations.md", "exec"), {}), daemon=True)
    done.start()
    done.join(60)
    assert not done.is_alive(), "the dead-letter reader of operations.md did not end after reading every letter"
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 3, printed
    assert sorted(line.split()[1] for line in printed) == ["empty-value:", "missing-field:", "not-msgpack-or-json:"]
    assert all(line.startswith(f"{topic}:") for line in printed)  # the key: the source topic:partition:offset


# ---------------------------------------------------------------------------- benchmarks.md

def test_every_table_of_benchmarks_md_names_its_command_and_date():
    """Each section of docs/benchmarks.md that holds a table names the bench/ script that
    produced it (one that exists) and the date it ran: a current table, not a history."""
    text = (DOCS / "benchmarks.md").read_text(encoding="utf-8")
    sections = re.split(r"^#{2,3} ", text, flags=re.M)[1:]
    with_tables = [s for s in sections if re.search(r"^\|---", s, re.M)]
    assert len(with_tables) >= 10
    for section in with_tables:
        title = section.splitlines()[0]
        scripts = re.findall(r"bench/(\w+)\.py", section)
        assert scripts, f"benchmarks.md, {title}: name the command that produced the table"
        assert all((DOCS.parent / "bench" / f"{s}.py").is_file() for s in scripts), f"{title}: {scripts}"
        assert re.search(r"20\d\d-\d\d-\d\d", section), f"benchmarks.md, {title}: say when it was measured"
