# The two commands of the README are `make demo` and `make test`; CI calls `make test`.
# Everything installs from scratch: the venv, the Python packages, the Kafka jars.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
KAFKA_JARS := devstack/kafka/lib/kafka_2.13-4.4.0.jar
TEST_KAFKA_DIR := .data/test-kafka
DEMO_KAFKA_DIR := .data/kafka
DEMO_KAFKA_PORT ?= 9092
PYTEST_ARGS ?=

.PHONY: help venv jars demo test test-unit test-integration lint fmt bench clean kafka-up kafka-down

help:  ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*##/\t/'

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; Python >= 3.11 is required" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)  ## create .venv and install the project with dev tools

$(KAFKA_JARS): devstack/kafka/pom.xml
	@command -v mvn >/dev/null || { echo "error: Maven (mvn) is required once to fetch the Kafka jars" >&2; exit 1; }
	mvn -q -B -f devstack/kafka/pom.xml package
	@touch $(KAFKA_JARS)

jars: $(KAFKA_JARS)  ## fetch the Apache Kafka broker jars (once)

kafka-up: venv jars  ## start the local broker for the demo (127.0.0.1:$(DEMO_KAFKA_PORT))
	$(BIN)/prism-pipeline devstack kafka up --port $(DEMO_KAFKA_PORT) --state-dir $(DEMO_KAFKA_DIR)

kafka-down: venv  ## stop the demo broker
	$(BIN)/prism-pipeline devstack kafka down --port $(DEMO_KAFKA_PORT) --state-dir $(DEMO_KAFKA_DIR)

demo: venv jars  ## set up and run the whole job on the embedded default, then print a report
	$(BIN)/python -m prism.devstack.demo --kafka-port $(DEMO_KAFKA_PORT) --kafka-state-dir $(DEMO_KAFKA_DIR)

test: venv jars  ## set up, start a test broker, run unit + integration tests, stop the broker
	@rm -rf $(TEST_KAFKA_DIR); \
	port=$$($(BIN)/python -c 'from prism.devstack import free_port; print(free_port())'); \
	$(BIN)/prism-pipeline devstack kafka up --port $$port --state-dir $(TEST_KAFKA_DIR) || exit 1; \
	PRISM_TEST_KAFKA_BOOTSTRAP=127.0.0.1:$$port $(BIN)/pytest $(PYTEST_ARGS); rc=$$?; \
	$(BIN)/prism-pipeline devstack kafka down --port $$port --state-dir $(TEST_KAFKA_DIR); \
	exit $$rc

test-unit: venv  ## unit tests only (no services)
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

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

bench: venv jars  ## run the benchmarks (bench/) and print figures and ratios
	$(BIN)/python -m bench

clean:  ## remove local state (ledger, broker data) but keep the venv and jars
	rm -rf .data .bench
