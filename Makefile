# The two commands a newcomer needs: `make demo` and `make test`. Both create .venv if it is missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test bench fx-init clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

demo: $(STAMP)
	$(PY) cifar10_PM.py --dataset digits --comm_round 4 --collaborators 2 --log_dir demo \
		--fpr_tolerance 0.01 0.1 0.5

test: $(STAMP)
	$(PY) -m pytest -q tests

bench: $(STAMP)
	$(PY) benchmarks/bench_audit.py
	$(PY) benchmarks/bench_gradient_norm.py

# Initialise the plan the way a deployment does (writes save/init.pbuf).
fx-init: $(STAMP)
	$(VENV)/bin/fx plan initialize

clean:
	rm -rf save local_state logs reports/demo
