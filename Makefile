# The two commands of the README are `make demo` and `make test`; CI calls `make test`,
# which runs `make lint` (ruff, ruff format --check, mypy) before it starts the test broker.
# Everything installs from scratch: the venv, the Python packages, the Kafka jars.
#
# Variables (all optional):
#   PYTHON=path          interpreter for .venv (default: the first of python3.13, python3.12,
#                        python3.11, python3 on PATH that is Python >= 3.11)
#   PRISM_KAFKA_PORT=N   port of the demo broker (default 9092, or a free port when 9092 is taken)
#   PYTEST_ARGS='...'    extra pytest arguments for `make test` / `make test-unit`
#   TEST_WORKERS=N       processes for the unit tests (default auto: one per core)

ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell for p in python3.13 python3.12 python3.11 python3; do \
	"$$p" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	&& { echo "$$p"; break; }; done)
endif
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
KAFKA_JARS := devstack/kafka/lib/kafka_2.13-4.4.0.jar
TEST_KAFKA_DIR := .data/test-kafka
DEMO_KAFKA_DIR := .data/kafka
PYTEST_ARGS ?=
TEST_WORKERS ?= auto
# The broker port is passed on only when set, so the tools' own default (9092 or a free port) applies.
KAFKA_PORT_ARG = $(if $(PRISM_KAFKA_PORT),--port $(PRISM_KAFKA_PORT))

.PHONY: help venv jars browser python demo test test-unit test-integration lint fmt bench clean kafka-up kafka-down trace-backends soak compile

help:  ## list targets (variables: PYTHON=..., PRISM_KAFKA_PORT=..., PYTEST_ARGS=...)
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

python:  ## print the Python interpreter .venv is built with, or why none fits
	@$(if $(PYTHON),,echo "error: no Python >= 3.11 found (tried python3.13, python3.12, python3.11, python3); install one or pass PYTHON=/path/to/python3.11+" >&2; exit 1)
	@"$(PYTHON)" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	|| { echo "error: PYTHON=$(PYTHON) is not a Python >= 3.11 interpreter; pass PYTHON=/path/to/python3.11+" >&2; exit 1; }
	@echo "$(PYTHON)"

# pip's editable build prints an informational setuptools notice; nothing else is hidden.
$(STAMP): pyproject.toml
	@$(MAKE) -s python >/dev/null
	@echo "creating $(VENV) with $(PYTHON) and installing the project (once)"
	@"$(PYTHON)" -m venv $(VENV)
	@$(BIN)/pip install -q --disable-pip-version-check --upgrade pip
	@PYTHONWARNINGS="ignore:Editable installation:UserWarning" \
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)  ## create .venv and install the project with dev tools

# Maven's console library prints colour resets even in batch mode: keep its output in a log
# and show it only when the fetch fails.
$(KAFKA_JARS): devstack/kafka/pom.xml
	@command -v mvn >/dev/null || { echo "error: Maven (mvn) is required once to fetch the Kafka jars" >&2; exit 1; }
	@mkdir -p .data
	@echo "fetching the Apache Kafka 4.4.0 broker jars from Maven Central (once)"
	@mvn -q -B -ntp -Dstyle.color=never -f devstack/kafka/pom.xml package >.data/mvn.log 2>&1 \
	|| { tail -n 40 .data/mvn.log >&2; echo "error: Maven could not fetch the Kafka jars (log: .data/mvn.log)" >&2; exit 1; }
	@touch $(KAFKA_JARS)

jars: $(KAFKA_JARS)  ## fetch the Apache Kafka broker jars (once)

browser:  ## install Debian's chromium for the HTML report test, when absent (needs root)
	@mkdir -p .data; command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	echo "installing chromium (headless browser for the HTML report test)"; \
	{ apt-get install -y -q chromium >.data/apt.log 2>&1 \
	  || { apt-get update -q >>.data/apt.log 2>&1 && apt-get install -y -q chromium >>.data/apt.log 2>&1; }; } \
	|| { tail -n 20 .data/apt.log >&2; echo "error: could not install chromium (apt-get install -y chromium, as root); the report test needs it (log: .data/apt.log)" >&2; exit 1; }; }

kafka-up: venv jars  ## start the local broker for the demo (port: PRISM_KAFKA_PORT, default 9092)
	@$(BIN)/prism-pipeline devstack kafka up $(KAFKA_PORT_ARG) --state-dir $(DEMO_KAFKA_DIR)

kafka-down: venv  ## stop the demo broker
	@$(BIN)/prism-pipeline devstack kafka down --state-dir $(DEMO_KAFKA_DIR)

demo: venv jars  ## run the whole job into the default ledger, check it, write the HTML report (broker port: PRISM_KAFKA_PORT, default 9092 or a free one)
	@$(BIN)/python -m prism.devstack.demo $(if $(PRISM_KAFKA_PORT),--kafka-port $(PRISM_KAFKA_PORT)) --kafka-state-dir $(DEMO_KAFKA_DIR)

# The trace export test's backends: Jaeger built with Go (about 5 min, 2 GB of memory, once)
# and Arize Phoenix in a venv of its own (about 2 min, once), both cached under .cache.
# A backend that cannot be installed here is reported and its test skips with the reason.
INSTALL_TRACE_BACKENDS = { $(BIN)/prism-pipeline devstack jaeger install \
	|| echo "warning: Jaeger could not be built (above); the trace export test will skip it" >&2; \
	$(BIN)/prism-pipeline devstack phoenix install \
	|| echo "warning: Phoenix could not be installed (above); the trace export test will skip it" >&2; }

trace-backends: venv  ## build Jaeger v1.75.0 and install Arize Phoenix for the trace export test (once, cached in .cache)
	@$(INSTALL_TRACE_BACKENDS)

# Lint first: a lint failure costs seconds, not a broker start and the whole suite.
# The unit tests are CPU-bound and share nothing: they run on every core (pytest-xdist), while
# the trace backends install beside them (minutes on a clean clone, nothing once cached; their
# output follows the unit tests'). The integration tests share one broker and time the
# pipeline's recoveries, so they run one at a time, with the machine to themselves. pytest's
# exit code 5 (nothing selected, e.g. by a -k in PYTEST_ARGS) is not a failure of either
# half; the first half's failure is the exit code. The unit tests run twice: on the Python
# source of the core (PRISM_CORE=pure) and on its mypyc build (PRISM_CORE=compiled, which
# fails unless the build matches the sources); the integration tests run the build.
test: venv lint jars browser compile  ## set up, lint, compile the core, run the unit tests on every CPU (pure, then compiled), start a test broker on a free port, run the integration tests
	@mkdir -p .data; $(INSTALL_TRACE_BACKENDS) >.data/trace-backends.log 2>&1 & backends=$$!; \
	PRISM_CORE=pure $(BIN)/pytest tests/unit -n $(TEST_WORKERS) $(PYTEST_ARGS); unit=$$?; [ $$unit -eq 5 ] && unit=0; \
	PRISM_CORE=compiled $(BIN)/pytest tests/unit -n $(TEST_WORKERS) $(PYTEST_ARGS); c=$$?; \
	[ $$c -eq 5 ] && c=0; [ $$unit -eq 0 ] && unit=$$c; \
	wait $$backends; cat .data/trace-backends.log; \
	rm -rf $(TEST_KAFKA_DIR); \
	port=$$($(BIN)/python -c 'from prism.devstack import free_port; print(free_port())'); \
	$(BIN)/prism-pipeline devstack kafka up --port $$port --state-dir $(TEST_KAFKA_DIR) || exit 1; \
	PRISM_CORE=compiled PRISM_TEST_KAFKA_BOOTSTRAP=127.0.0.1:$$port $(BIN)/pytest tests/integration $(PYTEST_ARGS); rc=$$?; \
	[ $$rc -eq 5 ] && rc=0; \
	$(BIN)/prism-pipeline devstack kafka down --state-dir $(TEST_KAFKA_DIR); \
	[ $$unit -ne 0 ] && exit $$unit; exit $$rc

test-unit: venv  ## unit tests only (no services), on every CPU, on the build PRISM_CORE picks (auto: the current mypyc build, else the source)
	$(BIN)/pytest tests/unit -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The core and the fast parser compiled with mypyc into build/mypyc (needs a C compiler and
# the Python headers; about a minute), rebuilt when one of their sources changes. The
# source stays the truth: a build that does not match it byte for byte is never loaded.
CORE_SOURCES := $(wildcard pipeline/core/_*.py) schemas/_fast.py schemas/_compiled.py devstack/compile.py
build/mypyc/manifest.json: $(CORE_SOURCES) | venv
	@$(BIN)/python -m prism.devstack.compile

compile: build/mypyc/manifest.json  ## compile the core and the fast parser with mypyc (PRISM_CORE=pure runs the source)

# mypy reads the folders under their installed names (prism.*) through a tree of symlinks.
TYPECHECK := build/typecheck/prism
PACKAGES  := schemas runtime sinks pipeline dashboards devstack

lint: venv  ## ruff (lint + format check) and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@mkdir -p $(TYPECHECK); for p in $(PACKAGES); do ln -sfn ../../../$$p $(TYPECHECK)/$$p; done
	$(BIN)/mypy

fmt: venv  ## apply ruff fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# SOAK_MINUTES (default 10) and SOAK_SEED (default 1) pass through; the verdict says what failed.
soak: venv jars  ## chaos soak: 3 brokers, 3 workers, 5,000 events/s and seeded faults (SOAK_MINUTES=10, SOAK_SEED=1)
	@$(BIN)/python -m prism.devstack.soak $(if $(SOAK_MINUTES),--minutes $(SOAK_MINUTES)) $(if $(SOAK_SEED),--seed $(SOAK_SEED))

bench: venv jars compile  ## run the benchmarks (bench/) and print figures and ratios
	$(BIN)/python -m bench

clean:  ## remove local state (ledger, broker data, report) but keep the venv and jars
	rm -rf .data .bench
