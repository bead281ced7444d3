# The two commands a newcomer needs: `make demo` and `make test`. Both create .venv if it is missing.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast docs-check bench fx-init clean federation

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

# Digits: 2 collaborators, few members per party (train ratio 0.1) and 5 local epochs, so the local models
# overfit within a few rounds, as the audit should then show. Same settings as plan/plan.yaml's defaults; RMIA
# with every kind of reference, intervals and epsilon lower bounds are on by default; TPR at FPR 0.001 is marked
# unresolvable (404 population samples per party).
demo: $(STAMP)
	$(PY) cifar10_PM.py --dataset digits --comm_round 8 --collaborators 2 --log_dir demo --replace_log_dir \
		--train_dataset_ratio 0.1 --test_dataset_ratio 0.45 --audit_dataset_ratio 0.45 \
		--optimizer_type Adam --learning_rate 0.003 --local_epochs 5 --fpr_tolerance 0.001 0.01 0.1 0.5

# The whole suite on TEST_WORKERS pytest-xdist workers; tests that share a federation or a demo run stay on one worker
# (tests/conftest.py), so each is made once. test-fast: the edit-test loop, without federations and slow tests
# (tests/README.md).
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) tests

test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not federation and not slow" tests

# Every command and code block of README.md and docs/ run as written, in a scratch copy of this checkout (the README's
# one-machine fx walkthrough included; tools/docs_check.py says which blocks run). A few minutes; CI runs it after the
# suite.
docs-check: $(STAMP)
	$(PY) -m tools.docs_check

bench: $(STAMP)
	$(PY) benchmarks/bench_audit.py
	$(PY) benchmarks/bench_gradient_norm.py

# A real federation on this machine: aggregator + 3 collaborators as separate `fx` processes on 127.0.0.1, each in
# its own workspace under runs/<timestamp>, with mTLS certificates made by OpenFL's commands (docs/deployment.md).
federation: $(STAMP)
	$(PY) -m workspace run --collaborators 3 --rounds 3

# Initialise the plan the way a deployment does (writes save/init.pbuf).
fx-init: $(STAMP)
	$(VENV)/bin/fx plan initialize

clean:
	rm -rf save local_state logs reports/demo
