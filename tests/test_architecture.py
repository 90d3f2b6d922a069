"""Data flows one way (docs/architecture.md): record -> tokens -> hash ids -> tensors ->
model -> rows -> LMDB -> readers. Each rule below is a pair (modules, what they must not
import), read from the source's import statements (run-time imports and imports inside
functions alike; ``if TYPE_CHECKING:`` blocks are type hints, not dependencies)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"streamlearn": ROOT / "streamlearn", "streamlearn.consumers": ROOT / "consumers",
            "streamlearn.state": ROOT / "state"}


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            if "consumers" in path.relative_to(folder).parts[:1] or "state" in path.relative_to(folder).parts[:1]:
                continue  # streamlearn/ has no such subfolders; a guard against a stray copy
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports outside TYPE_CHECKING blocks."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{alias.name}" for alias in node.names}
    return out


MODULES = modules()
INGEST = ("streamlearn.hashing", "streamlearn.records", "streamlearn.featurize", "streamlearn.batching",
          "streamlearn.objectives", "streamlearn.outputs", "streamlearn.decoding", "streamlearn.config",
          "streamlearn.config_rules", "streamlearn.exceptions", "streamlearn.tasks")
RULES = [
    # (modules: exact names, or "pkg.*" for a package and everything in it; forbidden
    #  import prefixes; why)
    (INGEST, ("torch", "river", "streamlearn.model", "streamlearn.learner", "streamlearn.embeddings",
              "streamlearn.heads"), "ingest is numpy only: it can run in another thread or process"),
    (("streamlearn.embeddings.*", "streamlearn.heads", "streamlearn.model"),
     ("streamlearn.learner", "streamlearn.tasks.", "streamlearn.checkpoint", "streamlearn.snapshot"),
     "the model knows no task and no learner"),
    (("streamlearn.learner", "streamlearn.tasks.*", "streamlearn.sync"),
     ("streamlearn.checkpoint", "streamlearn.snapshot", "streamlearn.replay", "streamlearn.service",
      "streamlearn.consumers"), "the learner writes rows; the codec and readers come after it"),
    (("streamlearn.checkpoint",), ("streamlearn.snapshot", "streamlearn.replay", "streamlearn.service",
                                   "streamlearn.consumers", "streamlearn.cli"), "the codec serves the readers"),
    (("streamlearn.state.*",), ("streamlearn.learner", "streamlearn.model", "streamlearn.tasks",
                              "streamlearn.checkpoint", "streamlearn.snapshot", "streamlearn.consumers", "torch"),
     "the store knows rows, blobs and offsets, not models"),
    (tuple(m for m in MODULES if m.startswith("streamlearn.") and not m.startswith(("streamlearn.consumers",
                                                                                     "streamlearn.cli",
                                                                                     "streamlearn.demo"))),
     ("streamlearn.consumers",), "the library never imports the Kafka workers"),
]


@pytest.mark.parametrize("owners,forbidden,why", RULES, ids=[r[2] for r in RULES])
def test_no_module_imports_against_the_flow(owners, forbidden, why):
    broken = []
    for name, path in MODULES.items():
        if not any(_owns(o, name) for o in owners):
            continue
        bad = sorted(i for i in imports(name, path) if any(i == f or i.startswith(f.rstrip(".") + ".")
                                                            or (f.endswith(".") and i.startswith(f))
                                                            for f in forbidden))
        if bad:
            broken.append(f"{name}: {bad}")
    assert not broken, f"{why}: " + "; ".join(broken)


def _owns(owner: str, name: str) -> bool:
    if owner.endswith(".*"):
        return name == owner[:-2] or name.startswith(owner[:-1])
    return name == owner


def test_the_rules_see_the_modules_and_their_imports():
    assert {"streamlearn.learner", "streamlearn.state.lmdb_store", "streamlearn.consumers.worker",
            "streamlearn.tasks.classify", "streamlearn.featurize"} <= set(MODULES)
    assert "streamlearn.model" in imports("streamlearn.learner", MODULES["streamlearn.learner"])
    assert "streamlearn.config" in imports("streamlearn.state.factory", MODULES["streamlearn.state.factory"])
    assert "torch" in imports("streamlearn.tasks.base", MODULES["streamlearn.tasks.base"])
    assert _owns("streamlearn.tasks.*", "streamlearn.tasks.mlm") and not _owns("streamlearn.tasks", "streamlearn.tasks.mlm")
