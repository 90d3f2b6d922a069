"""The public API is curated: a short, deliberate __all__."""
import importlib
import re
import subprocess
import sys

import streamlearn

# Each public name and the module that defines it: the package re-exports, never redefines.
HOMES = {
    "Config": "streamlearn.config",
    "Learner": "streamlearn.learner",
    "Snapshot": "streamlearn.snapshot",
    "StreamlearnError": "streamlearn.exceptions",
    "TokenHasher": "streamlearn.hashing",
    "load_config": "streamlearn.config",
}


def test_public_api_is_exactly_this():
    assert sorted(streamlearn.__all__) == sorted([*HOMES, "__version__"])
    for name, home in HOMES.items():
        assert getattr(streamlearn, name) is getattr(importlib.import_module(home), name), name
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", streamlearn.__version__)
    assert issubclass(streamlearn.StreamlearnError, Exception)


def test_cli_help_and_version():
    run = [sys.executable, "-m", "streamlearn.cli"]
    out = subprocess.run(run + ["--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"streamlearn {streamlearn.__version__}"
    helptext = subprocess.run(run + ["--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: streamlearn" in helptext
