# The two README commands live here: `make demo` (the main job) and `make test`.
.PHONY: demo test bench lint

demo:
	bash scripts/demo.sh

test:
	bash scripts/test.sh

bench:
	bash scripts/bootstrap.sh && uv run --frozen python -m bench

lint:
	bash scripts/bootstrap.sh && uv run --frozen ruff check agent sidecar tests bench && uv run --frozen mypy
