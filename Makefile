# The two commands (README): `make run` and `make test`. Both do all set-up first
# (scripts/setup.sh: system packages, MLX for mlx-rs, the default model, test tools).
SHELL := /bin/bash
CACHE := $(or $(SEEDBAR_DEV_CACHE),$(HOME)/.cache/seedbar-dev)
SEEDBAR := target/debug/seedbar
PROMPT ?= What is the capital of France?

.PHONY: run test lint bench build default-model

run: build default-model
	$(SEEDBAR) run "$(PROMPT)"

test: lint
	scripts/setup.sh --tests
	cargo build -p seedbar-cli
	cargo test --workspace
	$(CACHE)/venv/bin/python -m pytest -q

lint:
	scripts/setup.sh
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings

bench: build default-model
	scripts/setup.sh --tests
	scripts/bench.sh

build:
	scripts/setup.sh
	cargo build -p seedbar-cli

# Put the default model (fetched and checked by setup) into the user's store.
default-model:
	$(SEEDBAR) models add "$$(cat $(CACHE)/default-model.path)" --name SmolLM2-135M-Instruct >/dev/null
