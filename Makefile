# The two README commands live here: `make demo` (the main job) and `make test`.
.PHONY: demo test bench bench-round3 bench-round4 lint mutate screenshots native-wheel

# Where scripts/bootstrap.sh installs uv when the machine has none (it runs in its own shell).
export PATH := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gym-telemetry/uv/bin:$(HOME)/.local/bin:$(PATH)

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

# The web view's pictures in docs/images/ (runs the demo for a store, then Chromium).
screenshots:
	bash scripts/bootstrap.sh && uv run --frozen python scripts/ui_screenshots.py

# The native trace scanner's wheel (needs cargo) where sidecar.Dockerfile installs it
# from: then `docker compose up --build` runs the fast path (docs/native.md).
native-wheel:
	bash scripts/bootstrap.sh && rm -f deploy/docker/wheels/*.whl \
		&& uv build --wheel --package gym-telemetry-sidecar-native --out-dir deploy/docker/wheels

bench:
	bash scripts/bootstrap.sh && uv sync --frozen --quiet --group native && uv run --frozen python -m bench

# Performance round 3 (docs/benchmarks.md): callgrind, the three loads, the same-job
# Collector, memory and the 30-minute soak, in one run.
bench-round3:
	bash scripts/bootstrap.sh && uv sync --frozen --quiet --group native && uv run --frozen python -m bench --round3

# Performance round 4 (issue 42; docs/benchmarks.md): callgrind per load and compression,
# the issue's loads and paths against rotel and the same-job Collector (and the sidecar
# at the peers' gzip level), memory at 10k spans/s, and the targets table
# (docs/benchmarks/round4_targets.md, round4_summary.json); ~35 min on a quiet machine.
bench-round4:
	bash scripts/bootstrap.sh && uv sync --frozen --quiet --group native && uv run --frozen python -m bench --round4

# Mutation testing of the data-critical modules (slow; not part of make test): see
# docs/testing.md#mutation-testing. `make mutate MODULES="disk_queue sender" WORKERS=2`.
MODULES ?=
WORKERS ?= 1
mutate:
	bash scripts/bootstrap.sh && uv run --frozen --group mutate python scripts/mutate.py $(MODULES) --max-children $(WORKERS)

lint:
	bash scripts/bootstrap.sh && uv run --frozen ruff check semconv agent sidecar sidecar-native demo tests testkit bench deploy scripts examples && uv run --frozen mypy
