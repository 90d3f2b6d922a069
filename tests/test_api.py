"""The public API is curated: a short, deliberate __all__."""
import subprocess
import sys

import streamlearn


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
    for name in streamlearn.__all__:
        assert getattr(streamlearn, name) is not None


def test_cli_help_and_version():
    run = [sys.executable, "-m", "streamlearn.cli"]
    out = subprocess.run(run + ["--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"streamlearn {streamlearn.__version__}"
    helptext = subprocess.run(run + ["--help"], capture_output=True, text=True, check=True).stdout
    assert "usage: streamlearn" in helptext
