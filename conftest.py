"""Collection rules for the whole suite (tests/, and the doctests of every package).

1. The ``broker`` marker. ``pytest -m "not broker"`` is the fast lane, so the marker must
   never be forgotten; it is applied here rather than by hand. A test gets it when one of
   its fixtures is named ``*broker`` (``broker``, ``embedded_broker`` in tests/conftest.py,
   a module's ``tls_broker``...), and a doctest gets it when it starts an
   ``EmbeddedBroker``. A test that starts a broker itself says ``@pytest.mark.broker``.
   Every unmarked test runs with ``$CALF_TANSU_BIN`` pointing at a stand-in that refuses
   to start and says why, so a forgotten marker fails in every lane instead of slowing
   the fast one.
2. Doctests of ``consumers/`` and ``state/`` run under the names setup.py installs them as
   (``streamlearn.consumers``, ``streamlearn.state``). Left to itself pytest would import
   ``consumers/worker.py`` as ``consumers.worker`` (and the directory's ``__init__.py``
   as package ``consumers``): a second copy of the module, whose relative imports
   (``from ..config``) fail.
"""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
INSTALLED_AS = {ROOT / "consumers": "streamlearn.consumers", ROOT / "state": "streamlearn.state"}
NOT_MARKED = ("this test starts the real broker but is not marked broker: request the broker "
              "fixture (or another fixture named *broker), or mark it @pytest.mark.broker")


# ---------------------------------------------------------------------------- the broker marker

def uses_broker(item: pytest.Item) -> bool:
    if any(name.endswith("broker") for name in getattr(item, "fixturenames", ())):
        return True
    dtest = getattr(item, "dtest", None)  # a doctest item: its examples are the test
    return dtest is not None and any("EmbeddedBroker" in example.source for example in dtest.examples)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if uses_broker(item):
            item.add_marker(pytest.mark.broker)


@pytest.fixture(scope="session")
def refusing_broker_binary(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("no-broker") / "tansu"
    path.write_text(f"#!/bin/sh\necho '{NOT_MARKED}' >&2\nexit 3\n")
    path.chmod(0o755)
    return path


@pytest.fixture(autouse=True)
def broker_only_where_marked(request, monkeypatch):
    """Unmarked tests, and the processes they start, get the refusing stand-in binary."""
    if request.node.get_closest_marker("broker") is None:
        monkeypatch.setenv("CALF_TANSU_BIN", str(request.getfixturevalue("refusing_broker_binary")))


# ---------------------------------------------------------------------------- doctests by installed name

def installed_name(path: Path) -> str | None:
    """``streamlearn.consumers.worker`` for ``consumers/worker.py``; None outside the
    directories setup.py installs under another name."""
    for directory, package in INSTALLED_AS.items():
        if path.is_relative_to(directory):
            parts = path.relative_to(directory).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            return ".".join((package, *parts))
    return None


def import_installed(name: str, path: Path):
    module = importlib.import_module(name)
    if Path(module.__file__).resolve() != path.resolve():
        raise pytest.UsageError(f"{name} is imported from {module.__file__}, not from {path}: "
                                "install this checkout (`make .venv/.installed`) and run its .venv")
    return module


def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Dir | None:
    """A plain directory node, not a ``Package``: a Package imports its ``__init__.py``
    under the directory's own name to look for setup functions."""
    if path in INSTALLED_AS:
        return pytest.Dir.from_parent(parent, path=path)
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector):
    collected = yield
    name = installed_name(file_path)
    if name is not None:
        for node in collected:
            if isinstance(node, pytest.Module):  # the doctest collector of the file
                node.obj = import_installed(name, file_path)
    return collected
