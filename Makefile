# Two commands on a fresh clone: `make demo` (the main job) and `make test`.
# Both create .venv when missing and install everything into it. The stamp
# file skips the slow reinstall (the C++ build) until the C++ sources, setup.py
# or pyproject.toml change.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.spyre-installed
INSTALL_INPUTS := pyproject.toml setup.py $(wildcard spyre_runtime/csrc/*.cpp spyre_runtime/csrc/*.h)
# torch is pinned exactly: anything looser pulls a multi-GB CUDA build.
DEPS := setuptools wheel torch==2.13.0 numpy sympy jinja2 pytest hypothesis expecttest==0.3.0 transformers==5.25.0
PIP_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels)

.PHONY: demo test test-slow bench clean

demo: $(STAMP)
	$(PY) tools/demo.py

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

bench: $(STAMP)
	$(PY) benchmarks/run.py

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) $(INSTALL_INPUTS)
	$(PY) -m pip install -q $(PIP_LINKS) $(DEPS)
	MAX_JOBS=2 $(PY) -m pip install -q $(PIP_LINKS) --no-build-isolation --no-deps -e .
	touch $(STAMP)

clean:
	rm -rf build *.egg-info spyre_runtime/_C*.so
