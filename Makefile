# Two commands for a newcomer: `make run` and `make test`. Both create or reuse .venv.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test lint run bench clean

$(PY):
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# torch 2.13.0 first: it is the CPU wheel on this machine kind; an unpinned resolve
# would pull a multi-GB CUDA build.
$(STAMP): $(PY) setup.py
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

# The rule set and why each group is in it: ruff.toml. The whole tree, bench/ included.
lint: $(STAMP)
	$(VENV)/bin/ruff check --no-cache .

run: $(STAMP)
	$(PY) -m streamlearn.demo

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
