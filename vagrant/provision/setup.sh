#!/bin/sh
# Provisioning, for Vagrant (the "setup" provisioner) and `make vm-check` alike: the same idempotent set-up as
# `make setup` and every CI run (.ci/run -> make test -> make setup): system packages, Open vSwitch started, .venv
# with the project. Called as `sh .ci/setup` rather than through make because make is one of the packages it
# installs. Runs as root, like `make setup` must, in the checkout as synced into the VM (the argument).
# MPFT_NO_VAGRANT=1: the VM does not need Vagrant itself (only the test that validates the Vagrantfile does).
set -eu
cd "${1:?usage: setup.sh CHECKOUT}"
export MPFT_NO_VAGRANT=1
sh .ci/setup
