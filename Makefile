# calibdcd developer commands. `make test` and `make demo` work on a fresh machine:
# they create .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: test test-slow lint bench demo clean-venv constraints

# constraints.txt pins every other dependency to the versions the published numbers came from
# (docs/reproducibility.md); the venv is reinstalled when it changes.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# exactly this torch: the CPU wheel on local disk (any other spec pulls a CUDA build)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[hf,serve,dev,report,data]'
	@$(PY) -c 'import platform; v = platform.python_version(); v == "3.11.7" or print(f"warning: Python {v}; constraints.txt and the default lab text pool (read from the standard library) come from 3.11.7, so lab results differ")'
	touch $@

# rewrite constraints.txt from the current venv (after a deliberate upgrade)
constraints: $(VENV)/.installed
	{ sed -n '/^#/p' constraints.txt; $(PY) -m pip freeze --exclude-editable | grep -viE '^(torch|calibdcd)[=@ ]' | grep -v '^#'; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

test: $(VENV)/.installed
	$(PY) -m pytest -m "not slow" -q --durations=20

test-slow: $(VENV)/.installed
	$(PY) -m pytest -m slow -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

# builds the demo lab (micro's base and chat-qwen) on first use, runs every detector with and
# without CalibDCD on both models (seed 0), prints the comparison, writes runs/lab-demo/report/
demo: $(VENV)/.installed
	$(PY) -m calibdcd demo

bench: $(VENV)/.installed
	$(PY) benchmarks/calibration.py

clean-venv:
	rm -rf $(VENV)
