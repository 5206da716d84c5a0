# Every target bootstraps what it needs (virtualenv, jars) idempotently.
.DEFAULT_GOAL := help
SHELL := /bin/bash
VENV := .venv/bin
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: help bootstrap demo test test-unit test-pythons chaos chaos-report bench bench-quick bench-prices bench-longhaul lint fmt broker-start broker-stop spark-connect spark-connect-start spark-connect-stop status airflow-ui airflow-ui-stop stop spark-cluster lock clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-14s %s\n", $$1, $$2}'

bootstrap: ## create .venv from the lock file and fetch the jars (idempotent)
	@bash scripts/bootstrap.sh

demo: bootstrap ## run the main job end to end on the embedded default (local broker, Spark Connect server on local[*], Airflow/SQLite)
	@$(VENV)/python -m slicewise_dev.demo

test: ## run lint and every test (starts the real broker, Spark, Delta, Airflow, PostgreSQL and Chromium itself); prints each phase's wall time
	@bash scripts/test.sh

test-pythons: bootstrap ## the unit tier on Python 3.10, 3.12 and 3.13 (venvs from the declared ranges)
	@bash scripts/test_pythons.sh

test-unit: bootstrap ## only the unit tests: no JVM, no server, under a minute (tests/unit/conftest.py enforces it)
	@$(VENV)/python -m pytest tests/unit -n 0

chaos: bootstrap ## the chaos suite, each run appended to chaos/chaos_runs.jsonl: RUNS=5 per scenario, SCENARIOS=a,b to choose, WORKERS=2 (CI runs 1 of mixed)
	@SLICEWISE_CHAOS_RUNS=$${SLICEWISE_CHAOS_RUNS:-$(or $(RUNS),5)} \
	SLICEWISE_CHAOS_SCENARIOS=$${SLICEWISE_CHAOS_SCENARIOS:-$(SCENARIOS)} \
	SLICEWISE_CHAOS_RECORD=$${SLICEWISE_CHAOS_RECORD:-$(CURDIR)/chaos/chaos_runs.jsonl} \
	$(VENV)/python -m pytest tests/integration/test_chaos.py -n $(or $(WORKERS),2) --dist loadgroup --maxschedchunk 1 --timeout 0  # one run per item, longest first, the next to a free worker

chaos-report: bootstrap ## the chaos table summed over every run recorded in chaos/chaos_runs.jsonl
	@$(VENV)/python tests/integration/chaos_log.py

bench: bootstrap ## the benchmark (W0-W3 side by side, 70-100 min on 2 cores): table, raw numbers and plot in bench/results/
	@$(VENV)/python bench/run.py $(BENCH_ARGS)

bench-quick: bootstrap ## W2 beside W1+ at 0.5 M (medians of 3, alternating) and the one-minute slices (median of 10), about 14 min: bench/results/quick.md
	@$(VENV)/python bench/run.py --quick $(BENCH_ARGS)

bench-prices: bootstrap ## each guarantee's price a slice, one-minute and 0.5 M, beside W1+ (about 10 min): bench/results/price-list.md
	@$(VENV)/python bench/price_list.py $(PRICES_ARGS)

bench-longhaul: bootstrap ## one-minute slices after a day, a week and a month of history grown in bulk, locally and on s3proxy (not in CI): bench/results/longhaul-*
	@$(VENV)/python bench/longhaul.py $(LONGHAUL_ARGS)

lint: bootstrap ## ruff lint (with Airflow AIR3 rules) and format check
	@$(VENV)/ruff check .
	@$(VENV)/ruff format --check .

fmt: bootstrap ## format the code
	@$(VENV)/ruff format .
	@$(VENV)/ruff check --fix .

broker-start: bootstrap ## start the local Kafka broker (state in .state/kafka)
	@$(VENV)/python -m slicewise_dev.broker start

broker-stop: ## stop the local Kafka broker
	@$(VENV)/python -m slicewise_dev.broker stop

spark-connect: bootstrap ## the Spark Connect server the steps run on (sc://127.0.0.1:15002), until Ctrl-C
	@$(VENV)/python -m slicewise.connect_server run

spark-connect-start: bootstrap ## start the Spark Connect server in the background (as the demo does)
	@$(VENV)/python -m slicewise.connect_server start

spark-connect-stop: ## stop the background Spark Connect server
	@$(VENV)/python -m slicewise.connect_server stop

status: bootstrap ## slices, offsets, steps and counts from the ledger
	@$(VENV)/slicewise status

airflow-ui: bootstrap ## the Airflow UI (airflow standalone, :8080) on the demo's state, until Ctrl-C; needs `make demo` (or broker-start + spark-connect-start) first
	@$(VENV)/python -m slicewise_dev.airflow_env standalone

airflow-ui-stop: ## stop `make airflow-ui` (and every process it started) from another shell
	@$(VENV)/python -m slicewise_dev.airflow_env stop

stop: airflow-ui-stop broker-stop spark-connect-stop ## stop everything the demo and `make airflow-ui` started

spark-cluster: bootstrap ## a Spark standalone master + worker on loopback (until Ctrl-C); prints the spark_default to use
	@$(VENV)/python -m slicewise_dev.spark_cluster

lock: ## re-resolve constraints.txt from requirements*.txt (needs the package registry)
	@$(VENV)/uv pip compile requirements-dev.txt --python 3.11 -o constraints.txt

clean: broker-stop spark-connect-stop ## delete local state (.state: broker data, lakehouse, Airflow DB); keeps caches
	rm -rf .state
