#!/bin/sh
# A short smoke test (the full suite takes too long for provisioning), for Vagrant (the "smoke" provisioner) and
# `make vm-check`: doctor shows which datapath, qdiscs and congestion controls the emulator will use in this
# kernel; topo builds the default fabric model. Runs as root in the synced checkout (the argument).
set -eu
cd "${1:?usage: smoke.sh CHECKOUT}"
.venv/bin/mpft doctor
.venv/bin/mpft topo --json
