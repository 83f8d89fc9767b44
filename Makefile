# Two commands on a fresh machine: `sudo make run` (the main job) and `sudo make test` (the whole suite).
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup run test unit integration bench vm-check lint clean

setup:
	sh .ci/setup

run: setup
	$(VENV)/bin/mpft run routing --quick

test: setup
	$(PY) -m pytest -q

unit: setup
	$(PY) -m pytest -q -m "not root"

integration: setup
	$(PY) -m pytest -q -m root

bench: setup
	$(PY) benchmarks/bringup.py
	$(PY) benchmarks/routing.py
	$(PY) benchmarks/transport.py
	$(PY) benchmarks/agents.py
	$(PY) benchmarks/congestion.py
	$(PY) benchmarks/marking.py
	$(PY) benchmarks/pause.py
	$(PY) benchmarks/asymmetry.py
	$(PY) benchmarks/servers.py
	$(PY) benchmarks/reference.py
	$(PY) benchmarks/paper_fabric.py
	$(PY) benchmarks/studies.py
	$(PY) benchmarks/studies.py lossless

# The stock-kernel tier in a Debian 12 guest under QEMU, as a Vagrant user's VM (vagrant/qemu/check.py; slow under
# TCG: not part of `make test`).
vm-check: setup
	$(PY) vagrant/qemu/check.py

lint: setup
	$(VENV)/bin/ruff check emulator controllers traffic tests benchmarks vagrant
	$(VENV)/bin/lint-imports --no-cache

clean:
	$(VENV)/bin/mpft clean
