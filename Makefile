# The two commands (README): `make run` and `make test`. Both do all set-up first
# (scripts/setup.sh: system packages, MLX for mlx-rs, the default model, Node.js and the
# chat UI's packages, the Tauri CLI; with --tests the Python test tools).
SHELL := /bin/bash
CACHE := $(or $(SEEDBAR_DEV_CACHE),$(HOME)/.cache/seedbar-dev)
# Node.js from the set-up's cache when the system's is too old (absent otherwise).
export PATH := $(CACHE)/node-bin:$(PATH)
SEEDBAR := target/debug/seedbar
APP := target/debug/seedbar-app
PORT ?= 7337
PROMPT ?= What is the capital of France? Answer in one sentence.
# BACKEND=cuda (Linux x86_64 with an NVIDIA driver): set-up adds MLX's CUDA build
# (scripts/setup.sh --cuda, a 1.4 GB download once) and `make run` and `make ask` run the same
# binaries on it (scripts/cuda-env.sh). The default, cpu, needs neither.
BACKEND ?= cpu
SETUP := scripts/setup.sh
ifeq ($(BACKEND),cuda)
SETUP := scripts/setup.sh --cuda
SEEDBAR := scripts/cuda-env.sh $(SEEDBAR)
APP := scripts/cuda-env.sh $(APP)
else ifneq ($(BACKEND),cpu)
$(error BACKEND is cpu (the default) or cuda, not $(BACKEND))
endif

.PHONY: run ask test lint check-macos bench build setup ui app bundle default-model test-app soak screenshots

# Every command builds the CLI and the app together: cargo resolves the dependencies'
# features per build, so building either alone would compile them anew (minutes) after the
# other, and `make run` after `make test` would not be fast.
BINARIES := -p seedbar-cli -p seedbar-app

# The app where there is a display (macOS, or $DISPLAY / $WAYLAND_DISPLAY); without one,
# the same server and chat UI in the foreground for a browser.
run: build app default-model
	@if [[ "$$(uname -s)" == Darwin || -n "$${DISPLAY:-}" || -n "$${WAYLAND_DISPLAY:-}" ]]; then \
	  echo "Starting Seedbar (menu bar / tray and the chat window)"; \
	  exec $(APP); \
	else \
	  echo "No display: serving the chat UI at http://127.0.0.1:$(PORT)/ (Ctrl-C stops)"; \
	  exec $(SEEDBAR) serve --port $(PORT) --ui-dir ui/dist; \
	fi

# Answer one prompt on the command line.
ask: build default-model
	$(SEEDBAR) run "$(PROMPT)"

# The Python test tools (`setup.sh --tests`: a virtualenv, mostly downloads) install beside
# the lint and the builds (CPU-bound), which compile every test too; the tests run when both
# are done.
test: ui
	@scripts/setup.sh --tests & tools=$$!; \
	  ( set -x && $(LINT) && cargo build $(BINARIES) && cargo test --workspace --no-run ); \
	  built=$$?; wait $$tools && exit $$built
	cargo test --workspace
	cd ui && npm test
	cd ui && npm run e2e
	$(CACHE)/venv/bin/python -m pytest -q --durations=25

# The app's own tests: its Rust tests and the real window under Xvfb.
test-app: app
	scripts/setup.sh --tests
	cargo test -p seedbar-app
	$(CACHE)/venv/bin/python -m pytest -q tests/test_tauri_app.py

# The README's pictures: the app under Xvfb and the chat page in a browser, written into
# docs/screenshots/ (the tests otherwise write theirs to target/screenshots/).
screenshots: app
	scripts/setup.sh --tests
	SEEDBAR_SCREENSHOTS=$(CURDIR)/docs/screenshots $(CACHE)/venv/bin/python -m pytest -q tests/test_tauri_app.py
	cd ui && SEEDBAR_SCREENSHOTS=$(CURDIR)/docs/screenshots node --test ../tests/e2e/chat.test.mjs ../tests/e2e/welcome.test.mjs

# The workspace holds the app, which bundles ui/dist: build the UI before any cargo run.
LINT := cargo fmt --all --check && cargo clippy --workspace --all-targets -- -D warnings
lint: ui
	$(LINT)

# The app's and the CLI's code for macOS, type-checked on Linux (scripts/check-macos.sh; a
# no-op on a Mac, which builds the real thing). The app embeds ui/dist, so the UI comes first.
# Not part of `make test`: cold, it builds std and every dependency for the target (about 11
# CPU minutes); the Linux workflow runs it with its target dir cached.
check-macos: ui
	scripts/setup.sh --macos-check
	scripts/check-macos.sh

bench: build default-model
	scripts/setup.sh --bench
	scripts/bench.sh

# A long soak (tests/soak.py): 64 concurrent clients for 10 minutes against a server of its own
# (seeded replies checked against their solo references, cancels, disconnects, bad and oversize
# requests; then no rows left, RSS bounded), then the loopback load test for 10 minutes, then
# 104 schema-constrained samples. `make test` runs short ones (tests/test_soak.py for 20 s,
# tests/test_server_load.py for 30 s, 48 samples).
soak:
	scripts/setup.sh --tests
	cargo build $(BINARIES)
	$(CACHE)/venv/bin/python tests/soak.py --concurrency 64 --seconds 600
	SEEDBAR_LOAD_SECONDS=600 $(CACHE)/venv/bin/python -m pytest -q tests/test_server_load.py
	SEEDBAR_SCHEMA_SEEDS=13 $(CACHE)/venv/bin/python -m pytest -q tests/test_structured_outputs.py \
	  -k test_a_pydantic_schema_is_obeyed_by_every_seeded_sample

setup:
	$(SETUP)

# The app bundles ui/dist, so the UI is built first.
build: ui
	cargo build $(BINARIES)

# The chat UI (ui/dist), bundled into the app and served by `seedbar serve --ui-dir`.
ui: setup
	cd ui && npm run build

app: build

# macOS: Seedbar.app and a .dmg under target/release/bundle (signing: see the README).
bundle: ui
	scripts/bundle.sh --bundles app,dmg

# Put the default models (fetched and checked by setup) into the user's store: the chat model
# and the embedding model.
default-model:
	$(SEEDBAR) models add "$$(cat $(CACHE)/default-model.path)" --name SmolLM2-135M-Instruct >/dev/null
	$(SEEDBAR) models add "$$(cat $(CACHE)/embedding-model.path)" --name all-minilm-l6-v2 >/dev/null
