# Two commands on a fresh machine (see README):
#   make demo   - own virtualenv, install, run the ensemble demo on the embedded local sites
#   make test   - lint, type-check and every test tier (unit, integration/Airflow,
#                 slurm: a real 3-cluster grid started by the suite, postgres)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SLURM_PACKAGES := slurmctld slurmd slurm-client munge slurmrestd slurm-wlm-jwt-plugin
# the SFTP staging tests start their own sshd on a free loopback port
SYSTEM_PACKAGES := $(SLURM_PACKAGES) openssh-server

.PHONY: demo test lint typecheck system-packages experiment bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@ $(VENV)/.core

demo: $(VENV)/.core
	GRIDCORE_HOME=$${GRIDCORE_HOME:-$(CURDIR)/.gridcore-demo} $(BIN)/gridcore demo

# The slurm tier needs Debian's Slurm packages, the SFTP tests an sshd; install them
# when missing (needs root).
system-packages:
	@if ! command -v slurmctld >/dev/null || ! command -v slurmrestd >/dev/null \
	    || ! ls /usr/lib/x86_64-linux-gnu/slurm-wlm/auth_jwt.so >/dev/null 2>&1 \
	    || ! test -x /usr/sbin/sshd; then \
	  echo "installing system packages: $(SYSTEM_PACKAGES)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends $(SYSTEM_PACKAGES) >/dev/null; \
	fi

lint: $(VENV)/.dev
	$(BIN)/ruff check .

typecheck: $(VENV)/.dev
	$(BIN)/mypy

test: $(VENV)/.dev system-packages lint typecheck
	$(BIN)/pytest

experiment: $(VENV)/.core
	$(BIN)/gridcore experiment stateful-selection --json

bench: $(VENV)/.dev
	$(BIN)/gridcore bench selection --json

clean:
	rm -rf $(VENV) .gridcore-demo out build *.egg-info
