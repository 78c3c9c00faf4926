# The two README commands live here: `make demo` (the main job) and `make test`.
.PHONY: demo test bench lint screenshots

# Where scripts/bootstrap.sh installs uv when the machine has none (it runs in its own shell).
export PATH := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gym-telemetry/uv/bin:$(HOME)/.local/bin:$(PATH)

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

# The web view's pictures in docs/images/ (runs the demo for a store, then Chromium).
screenshots:
	bash scripts/bootstrap.sh && uv run --frozen python scripts/ui_screenshots.py

bench:
	bash scripts/bootstrap.sh && uv run --frozen python -m bench

lint:
	bash scripts/bootstrap.sh && uv run --frozen ruff check semconv agent sidecar demo tests bench && uv run --frozen mypy
