# Two commands on a fresh machine (see README):
#   make demo   - own virtualenv, install with Airflow, run every example DAG through
#                 Airflow's dag.test() on the embedded default (local sites, SQLite)
#   make airflow - airflow standalone on the demo's home: the example DAGs, the plugin
#   make test   - lint, type-check and every test tier (unit, integration/Airflow,
#                 slurm: a real 3-cluster grid started by the suite, postgres)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SLURM_PACKAGES := slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin
# the SFTP staging tests start their own sshd on a free loopback port; the browser tier
# drives Debian's Chromium (headless); debootstrap builds the chroots of the newer Slurm
# releases (tests/slurm_releases.py)
# mariadb-client: the Slurm tier's accounting cluster makes its slurmdbd database with it
SYSTEM_PACKAGES := $(SLURM_PACKAGES) openssh-server chromium debootstrap mariadb-client
# make demo and make airflow keep everything here (Airflow's home and metadata DB,
# gridcore's state DB and sites' storage, airflow.env), so the demo's runs show in the
# UI. Both run on the embedded local sites unless GRIDCORE_GRID names your grid file
# (and GRIDCORE_CENTER_URL a VJ center its clusters reach), in the environment or as
# `make demo GRIDCORE_GRID=/path/grid.toml`; they print which grid they use.
DEMO_HOME ?= $(CURDIR)/.gridcore-demo
DEMO := AIRFLOW_HOME=$(DEMO_HOME)/airflow $(BIN)/python -m gridcore_airflow.demo \
	--home $(DEMO_HOME)

.PHONY: demo airflow test lint typecheck system-packages slurm-chroots experiment bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.airflow: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[airflow]'
	touch $@ $(VENV)/.core

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.core $(VENV)/.airflow

# Every example DAG of dags/ through Airflow's dag.test(): per DAG what ran where and
# the result; exits non-zero if one fails (gridcore_airflow.demo). Writes
# $(DEMO_HOME)/airflow.env first: `set -a; . .gridcore-demo/airflow.env; set +a` puts
# the airflow CLI on the same home.
demo: $(VENV)/.airflow
	$(DEMO)

# airflow standalone with the example DAGs and the plugin; prints the URL and the login.
airflow: $(VENV)/.airflow
	$(DEMO) --standalone

# The slurm tier needs Debian's Slurm packages, the SFTP tests an sshd; install them
# when missing (needs root).
system-packages:
	@if ! command -v slurmctld >/dev/null || ! command -v slurmrestd >/dev/null \
	    || ! ls /usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so >/dev/null 2>&1 \
	    || ! test -x /usr/sbin/sshd || ! command -v chromium >/dev/null \
	    || ! test -x /usr/sbin/debootstrap || ! command -v mariadb >/dev/null; then \
	  echo "installing system packages: $(SYSTEM_PACKAGES)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
	fi

# The slurm tier's grid runs Slurm 24.11 and 26.05 from Debian chroots kept outside the
# clone ($GRIDCORE_SLURM_CHROOTS, default /var/cache/gridcore-slurm). When they are
# missing (a fresh machine) this starts building them in the background (~2 min) and
# returns at once: they build while lint and typecheck run; the slurm tier waits for the
# build on its lock. See docs/slurm-test-grid.md.
slurm-chroots: system-packages | $(BIN)/python
	$(BIN)/python -m tests.slurm_releases build --background

lint: $(VENV)/.dev
	$(BIN)/ruff check .

typecheck: $(VENV)/.dev
	$(BIN)/mypy

# The tiers run side by side on $(TEST_WORKERS) pytest-xdist workers; the Slurm tier and
# the deployment tier each run whole on one worker (tests/tier_scheduling.py), the other
# tests fill all three as they free up. Three, on two cores: the Slurm and deployment
# workers mostly wait on daemons, so a third keeps the cores busy (with two, every other
# test would have one worker until a tier ends). Times: README, "Quick start".
TEST_WORKERS ?= 3

test: $(VENV)/.dev system-packages slurm-chroots lint typecheck
	$(BIN)/pytest -n $(TEST_WORKERS)

experiment: $(VENV)/.core
	$(BIN)/gridcore experiment stateful-selection --json

bench: $(VENV)/.dev
	$(BIN)/gridcore bench selection --json

clean:
	rm -rf $(VENV) .gridcore-demo out build *.egg-info
