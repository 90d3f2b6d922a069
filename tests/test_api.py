"""The public API is curated: a short, deliberate __all__, imported only when used."""
import json
import re
import subprocess
import sys

import pytest

import streamlearn

HEAVY = ("torch", "river", "fastapi", "uvicorn", "matplotlib", "kafka")


def test_public_api_is_exactly_this():
    assert sorted(streamlearn.__all__) == sorted([
        "Config",
        "Learner",
        "Snapshot",
        "StreamlearnError",
        "TokenHasher",
        "__version__",
        "load_config",
    ])


def test_each_public_name_is_its_home_modules_object():
    from streamlearn import config, exceptions, hashing, learner, snapshot

    homes = {"Config": config, "load_config": config, "StreamlearnError": exceptions, "TokenHasher": hashing,
             "Learner": learner, "Snapshot": snapshot}
    for name, module in homes.items():
        assert getattr(streamlearn, name) is getattr(module, name)
    assert set(homes) | {"__version__"} == set(streamlearn.__all__)
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", streamlearn.__version__)
    assert set(streamlearn.__all__) <= set(dir(streamlearn))
    with pytest.raises(AttributeError, match="no attribute 'Lerner'"):
        streamlearn.Lerner  # noqa: B018


def _loaded_after(code: str) -> list[str]:
    """The heavy packages a fresh interpreter has imported after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_and_help_load_no_heavy_package():
    """`import streamlearn` and every `--help` stay fast: torch, river, the service
    stack, matplotlib and kafka are imported by the code that runs, not by the parser."""
    assert _loaded_after("import streamlearn, streamlearn.config, streamlearn.replay") == []
    helps = ("from streamlearn.cli import build_parser, command_modules\n"
             "parser = build_parser(); parser.format_help()\n"
             "for name in command_modules():\n"
             "    try: parser.parse_args([name, '--help'])\n"
             "    except SystemExit: pass")
    assert _loaded_after(helps) == []
    assert {"torch", "river"} <= set(_loaded_after("import streamlearn; streamlearn.Learner"))  # the probe sees them


def test_cli_help_and_version():
    run = [sys.executable, "-m", "streamlearn.cli"]
    out = subprocess.run(run + ["--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"streamlearn {streamlearn.__version__}"
    helptext = subprocess.run(run + ["--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: streamlearn" in helptext
