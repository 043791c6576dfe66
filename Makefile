# Two commands do all the set-up (see README):
#   make run    execute every notebook headlessly and write results, figures and a report
#   make test   lint (ruff, import floors) + unit tests (Triton kernels under the interpreter on a CPU) +
#               the kernel fuzz suite + every notebook, quick profile + the browser tests (Chromium)
#   make lab    JupyterLab on the notebooks (--allow-root added when run as root)
# All create .venv on first use and reuse it afterwards; it is rebuilt only when pyproject.toml changes.
# To use an environment you already have (conda, a GPU image), pass PYTHON=python and nothing is installed.
VENV    ?= .venv
EXTRAS  ?= notebooks,triton,dev
ARGS    ?=

ifdef PYTHON
  PY    := $(PYTHON)
  READY :=
else
  PY    := $(VENV)/bin/python
  READY := $(VENV)/.installed
endif

.PHONY: run test test-fast fuzz lint format env lab browser clean-venv

run: $(READY)
	$(PY) -m mahia run $(ARGS)

# Two pytest workers (the CI machine has two cores); the fuzz suite at MAHIA_FUZZ_EXAMPLES cases per property.
test: lint browser
	$(PY) -m pytest -n 2 --dist loadgroup $(ARGS)

# The fuzz suite alone, at 200 cases per property (make test runs 25).
fuzz: $(READY)
	MAHIA_FUZZ_EXAMPLES=200 $(PY) -m pytest -m fuzz $(ARGS)

# The browser tests (tests/test_site.py, tests/test_lab.py) drive Debian's Chromium through Playwright, which
# cannot download a browser of its own here. As root, install it when it is missing; otherwise say how (the
# browser tests skip, saying why, when there is no Chromium).
CHROMIUM ?= /usr/bin/chromium
browser:
	@if [ -x "$(CHROMIUM)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium for the browser tests (apt-get, a minute)"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium; } \
	    >/dev/null 2>&1 || echo "chromium could not be installed: the browser tests will be skipped"; \
	else \
	  echo "no $(CHROMIUM): the browser tests will be skipped (install it: sudo apt-get install chromium)"; \
	fi

# Style and structure: ruff (lint and format) and the import floors (import-linter, pyproject.toml).
lint: $(READY)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"

format: $(READY)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# Unit tests only (no notebook execution): the quick loop while developing.
test-fast: $(READY)
	$(PY) -m pytest -m "not notebooks" $(ARGS)

env: $(READY)

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[$(EXTRAS)]"
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

# A lesson notebook is saved as it is committed (mahia.runner.strip_on_save: no outputs, no per-machine metadata),
# so running and autosaving in JupyterLab leave git status clean.
LAB_FLAGS := --ContentsManager.pre_save_hook=mahia.runner.strip_on_save
lab: $(READY)
	$(PY) -m pip install --quiet -e ".[lab]" && $(PY) -m jupyter lab $(LAB_FLAGS) $(if $(filter 0,$(shell id -u)),--allow-root) notebooks

clean-venv:
	rm -rf $(VENV)
