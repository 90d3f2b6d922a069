"""docs/configuration.md lists every config key with its current default."""
import dataclasses
import re
from pathlib import Path

from streamlearn.config import Config

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


def _documented() -> dict[tuple[str, str], str]:
    rows, section = {}, None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        heading = re.match(r"## \[(\w+)\]", line)
        if heading:
            section = heading.group(1)
        row = re.match(r"\| `(\w+)` \| `(.*)` \| (.+) \|$", line)
        if row and section:
            rows[(section, row.group(1))] = row.group(2)
    return rows


def test_every_config_key_is_documented_with_its_default():
    documented = _documented()
    cfg = Config()
    expected = {
        (s.name, f.name): repr(getattr(getattr(cfg, s.name), f.name))
        for s in dataclasses.fields(Config)
        for f in dataclasses.fields(getattr(cfg, s.name))
    }
    assert set(documented) == set(expected), "docs/configuration.md keys differ from streamlearn/config.py"
    stale = {key: (documented[key], want) for key, want in expected.items() if documented[key] != want}
    assert not stale, f"defaults in docs/configuration.md are stale: {stale}"
