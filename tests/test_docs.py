"""docs/configuration.md lists every config key with its current default and the values it
allows, as streamlearn/config.py declares them (the allowed column is each key's rule)."""
import dataclasses
import re
from pathlib import Path

from streamlearn.config import Config, section_classes
from streamlearn.config_rules import rule_of

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
