"""``make mutate``: mutation testing of the modules where a wrong decision loses or
misreports data, with mutmut 3 (a workspace dev group, ``uv sync --group mutate``).

For each module in ``MODULES`` this lays out a scratch project under
``~/.cache/gym-telemetry/mutate/<name>/`` the way mutmut expects one (``src/`` holding
the workspace's four packages, ``tests/`` and ``testkit/``, a ``pyproject.toml`` whose
``[tool.mutmut]`` mutates that one file and runs only the tests listed for it), runs
``mutmut run`` there with ``--max-children`` workers (default 1: the machine is shared), and
collects killed / survived / timed out / no tests per module. mutmut itself then runs, for each
mutant, only the listed tests that called the mutated function.

The tests listed per module are in-process ones: a test that starts a sidecar as a
subprocess imports the installed (unmutated) code and would only cost time.

    uv run --frozen --group mutate python scripts/mutate.py            # every module
    uv run --frozen --group mutate python scripts/mutate.py disk_queue # one or more
    ... --max-children 2 --report docs/mutation-report.md

The report (markdown) lists per module the counts, the kill rate and each survivor's
name and changed line; a module not run keeps its previous row. Exit 0 when every
module ran (survivors are not a failure: they are read and explained in
docs/testing.md).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gym-telemetry" / "mutate"
PACKAGES = (
    "semconv/src/gym_telemetry_semconv",
    "agent/src/gym_telemetry",
    "sidecar/src/gym_sidecar",
    "demo/src/gym_telemetry_demo",
)
DEFAULT_REPORT = ROOT / "docs" / "mutation-report.md"


@dataclass(frozen=True)
class Module:
    name: str
    source: str
    """Path inside the workspace."""
    tests: tuple[str, ...]
    """The in-process tests that cover it."""
    functions: tuple[str, ...] = ()
    """The functions holding the module's data decisions, mutated by default (all of the
    file's functions with ``--all-functions``)."""

    def mutant_globs(self) -> list[str]:
        return [f"*{fn}__mutmut_*" for fn in self.functions]

    @property
    def package_path(self) -> str:
        return "src/" + self.source.split("/src/", 1)[1]


MODULES: tuple[Module, ...] = (
    Module(
        "disk_queue",
        "sidecar/src/gym_sidecar/export/disk_queue.py",
        ("tests/sidecar/export/test_disk_queue.py",),
        ("_lease", "ack", "_release", "_collect", "_take"),
    ),
    Module(
        "sender",
        "sidecar/src/gym_sidecar/export/sender.py",
        (
            "tests/sidecar/export/test_sender_logs.py",
            "tests/sidecar/export/test_queue.py",
            "tests/sidecar/export/test_grpc_export.py",
        ),
        ("_send", "_drop"),
    ),
    Module(
        "otlp_http",
        "sidecar/src/gym_sidecar/export/otlp_http.py",
        ("tests/sidecar/export/test_http_export.py", "tests/sidecar/export/test_http_post.py"),
        ("classify_status", "parse_retry_after"),
    ),
    Module(
        "otlp_grpc",
        "sidecar/src/gym_sidecar/export/otlp_grpc.py",
        ("tests/sidecar/export/test_otlp_grpc_exporter.py",),
        ("classify", "retry_delay_s", "_seconds"),
    ),
    Module(
        "metrics_spans",
        "sidecar/src/gym_sidecar/metrics/spans.py",
        ("tests/sidecar/metrics/test_derive_stage.py",),
        ("_rollouts", "_verifications", "_verify_attrs", "_is_nested", "_record_points"),
    ),
    Module(
        "metrics_series",
        "sidecar/src/gym_sidecar/metrics/series.py",
        ("tests/sidecar/metrics/test_derive_stage.py",),
        ("record", "succeeded"),
    ),
    Module(
        "gating_policy",
        "sidecar/src/gym_sidecar/gating/policy.py",
        ("tests/sidecar/gating/test_policy.py", "tests/sidecar/gating/test_gate_stage.py"),
        ("_compute", "for_service", "joining_warnings"),
    ),
    Module(
        "protobuf_bounds",
        "sidecar/src/gym_sidecar/wire/protobuf/bounds.py",
        (
            "tests/sidecar/wire/protobuf/test_message_depth.py",
            "tests/sidecar/wire/protobuf/test_otlp_json.py",
            "tests/sidecar/wire/protobuf/test_request_messages.py",
            "tests/sidecar/receiver/test_bad_input.py",
            "tests/sidecar/wire/protobuf/test_bounds.py",
        ),
        ("json_values_exceed", "rewrite_json_ids"),
    ),
    Module(
        "webhook_mutate",
        "sidecar/src/gym_sidecar/webhook/mutate.py",
        ("tests/sidecar/webhook/test_webhook_mutate.py",),
        ("decide", "already_injected", "mutate"),
    ),
    Module(
        "agent_span_groups",
        "agent/src/gym_telemetry/span_groups.py",
        ("tests/agent/test_span_groups.py",),
        ("parse_spec", "enabled_for_spec", "set_enabled", "is_enabled", "configure_from_env"),
    ),
    Module(
        "agent_outcomes",
        "agent/src/gym_telemetry/outcomes.py",
        ("tests/agent/test_outcomes.py",),
        ("failure_of", "_from_view", "_from_response", "_extra", "_view"),
    ),
)
BY_NAME = {m.name: m for m in MODULES}
STATUSES = ("killed", "survived", "timeout", "no tests", "suspicious", "skipped", "segfault")


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def stage(module: Module) -> Path:
    """The scratch project for ``module`` (rebuilt each run; mutmut's own cache is kept
    only inside it, so a changed test or module is always tested anew)."""
    work = CACHE / module.name
    shutil.rmtree(work, ignore_errors=True)
    (work / "src").mkdir(parents=True)
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, work / "src" / Path(pkg).name)
    for tree in ("tests", "testkit"):
        shutil.copytree(ROOT / tree, work / tree, ignore=shutil.ignore_patterns("__pycache__"))
    pytest_args = ["-p", "no:cacheprovider", "-q", "-x"]
    (work / "pyproject.toml").write_text(
        "[tool.mutmut]\n"
        'source_paths = ["src"]\n'
        'also_copy = ["testkit"]\n'
        f"only_mutate = {_toml_list([module.package_path])}\n"
        f"pytest_add_cli_args_test_selection = {_toml_list(list(module.tests))}\n"
        f"pytest_add_cli_args = {_toml_list(pytest_args)}\n"
        "use_git_change_detection = false\n"
        "timeout_multiplier = 5.0\n"
        "\n[tool.pytest.ini_options]\n"
        'pythonpath = ["."]\n'
        "timeout = 300\n"
        'markers = ["slow: long-running"]\n',
        encoding="utf-8",
    )
    return work


def _mutmut(
    work: Path, *args: str, timeout_s: float | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout_s,
    )


@dataclass
class Result:
    module: Module
    counts: dict[str, int]
    survivors: list[tuple[str, str]]
    """(mutant name, changed line)."""
    seconds: float
    error: str = ""
    before: dict[str, int] | None = None
    """The counts before survivors were tested again (``--retest-survivors-of``)."""
    first_rate: str = ""
    """The "before new tests" rate the earlier report already had, kept over re-tests."""

    @property
    def tested(self) -> int:
        return sum(self.counts.get(s, 0) for s in ("killed", "survived", "timeout"))

    @property
    def kill_rate(self) -> str:
        return _rate(self.counts)

    @property
    def kill_rate_before(self) -> str:
        if self.before is None:
            return "-"
        return self.first_rate or _rate(self.before)


def _rate(counts: dict[str, int]) -> str:
    caught = counts.get("killed", 0) + counts.get("timeout", 0)
    tested = caught + counts.get("survived", 0)
    return "-" if not tested else f"{caught / tested:.1%}"


_RESULT_LINE = re.compile(r"^\s+(\S+): (.+)$")


def _functions(path: Path) -> dict[str, str]:
    """Source of every function (methods included) in mutmut's copy of a file."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out: dict[str, str] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            out[node.name] = "\n".join(lines[node.lineno - 1 : node.end_lineno])
    return out


def _changed_line(functions: dict[str, str], name: str) -> str:
    """The first line a mutant changed, from mutmut's copy (the mutant's function next to
    the original, ``..._mutmut_orig``), without a ``mutmut show`` process per mutant."""
    short = name.rsplit(".", 1)[-1]
    mutant = functions.get(short, "")
    original = functions.get(re.sub(r"__mutmut_\d+$", "__mutmut_orig", short), "")
    old, new = original.splitlines()[1:], mutant.splitlines()[1:]  # past the def line
    for line in difflib.ndiff(old, new):
        if line.startswith("+ "):
            return line[2:].strip()
    return "(a line removed)" if len(new) < len(old) else "?"


def run_module(module: Module, max_children: int, names: list[str], rerun: bool = True) -> Result:
    """mutmut over ``names`` (mutant names or globs) of ``module``; ``rerun=False`` only
    reads the results of the last run in its scratch project."""
    started = time.monotonic()
    work = CACHE / module.name
    if rerun:
        work = stage(module)
        print(f"== {module.name}: mutmut run in {work} ({max_children} worker(s))", flush=True)
        run = _mutmut(work, "run", "--max-children", str(max_children), *names)
        (work / "mutmut-run.log").write_text(run.stdout + run.stderr, encoding="utf-8")
    else:
        run = subprocess.CompletedProcess([], 0, "", "")
    results = _mutmut(work, "results", "--all", "true")
    wanted = [n for n in names if "*" not in n]
    counts = dict.fromkeys(STATUSES, 0)
    survivors: list[tuple[str, str]] = []
    functions = _functions(work / "mutants" / module.package_path)
    for line in results.stdout.splitlines():
        match = _RESULT_LINE.match(line)
        if not match:
            continue
        name, status = match.groups()
        if status == "not checked" or (wanted and name not in wanted):
            continue
        counts[status] = counts.get(status, 0) + 1
        if status == "survived":
            survivors.append((name, _changed_line(functions, name)))
    error = ""
    if run.returncode != 0 or not any(counts.values()):
        tail = (run.stdout + run.stderr).strip().splitlines()[-15:]
        error = f"mutmut run exited {run.returncode}: " + " / ".join(tail)
    result = Result(module, counts, survivors, time.monotonic() - started, error)
    print(
        f"   {module.name}: "
        + ", ".join(f"{k} {v}" for k, v in counts.items() if v)
        + f"; kill rate {result.kill_rate}; {result.seconds:.0f} s"
        + (f"\n   {error}" if error else ""),
        flush=True,
    )
    return result


def _row(r: Result) -> str:
    c = r.counts
    return (
        f"| {r.module.name} | `{r.module.source}` | {c.get('killed', 0)} | {c.get('survived', 0)} "
        f"| {c.get('timeout', 0)} | {c.get('no tests', 0)} | {r.kill_rate} "
        f"| {r.kill_rate_before} | {r.seconds:.0f} |"
    )


def write_report(path: Path, results: list[Result], max_children: int) -> None:
    """Rows of modules run now replace their previous rows; the others are kept."""
    old_rows: dict[str, str] = {}
    old_survivors: dict[str, str] = {}
    old_notes = ""
    if path.exists():
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            cells = [c.strip() for c in line.split("|")]
            if len(cells) > 2 and cells[1] in BY_NAME:
                old_rows[cells[1]] = line
        # Hand-written notes between the table and "## Survivors" are kept as they are.
        notes = re.search(r"(?ms)^\|[^\n]*\|\n(?!\|)(.*?)^## Survivors", text)
        old_notes = notes.group(1).strip() if notes else ""
        for block in re.split(r"(?m)^### ", text)[1:]:
            name = block.split("\n", 1)[0].strip()
            if name in BY_NAME:
                old_survivors[name] = "### " + block.rstrip() + "\n"
    new = {r.module.name: r for r in results}
    load = os.getloadavg()[0]
    lines = [
        "# Mutation testing report",
        "",
        "Written by `make mutate` (`scripts/mutate.py`, mutmut 3); how to run it and what the",
        "survivors mean: [testing.md](testing.md#mutation-testing). Last run "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, {max_children} worker(s), "
        f"load average {load:.1f} at the end.",
        "",
        "Kill rate = (killed + timed out) / (killed + survived + timed out); `no tests`: "
        "mutants in code the listed tests never call.",
        "",
        "| module | file | killed | survived | timed out | no tests | kill rate "
        "| before new tests | seconds |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in MODULES:
        if m.name in new:
            lines.append(_row(new[m.name]))
        elif m.name in old_rows:
            lines.append(old_rows[m.name])
    if old_notes:
        lines += ["", old_notes]
    lines += ["", "## Survivors", ""]
    for m in MODULES:
        if m.name in new:
            r = new[m.name]
            lines.append(f"### {m.name}")
            lines.append("")
            if r.error:
                lines.append(f"Run failed: {r.error}")
                lines.append("")
            crashed = {k: r.counts.get(k, 0) for k in ("segfault", "suspicious", "skipped")}
            if any(crashed.values()):
                lines.append(
                    "Not tested (outside the kill rate): "
                    + ", ".join(f"{n} {k}" for k, n in crashed.items() if n)
                    + "."
                )
                lines.append("")
            if not r.survivors:
                lines.append("none")
            for name, changed in r.survivors:
                lines.append(f"- `{name}`: `{changed}`")
            lines.append("")
        elif m.name in old_survivors:
            lines.append(old_survivors[m.name])
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")


def _previous(report: Path) -> dict[str, tuple[dict[str, int], list[str], str]]:
    """Per module of an earlier report: its counts, its survivors' names and its "before
    new tests" rate ("" when it has none)."""
    out: dict[str, tuple[dict[str, int], list[str], str]] = {}
    if not report.exists():
        return out
    text = report.read_text(encoding="utf-8")
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 7 and cells[1] in BY_NAME:
            counts = {
                "killed": int(cells[3]),
                "survived": int(cells[4]),
                "timeout": int(cells[5]),
                "no tests": int(cells[6]),
            }
            first_rate = cells[8] if len(cells) > 9 and cells[8] != "-" else ""
            out[cells[1]] = (counts, [], first_rate)
    for block in re.split(r"(?m)^### ", text)[1:]:
        name = block.split("\n", 1)[0].strip()
        if name in out:
            out[name][1].extend(re.findall(r"^- `([^`]+)`", block, re.MULTILINE))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"of {', '.join(BY_NAME)}")
    parser.add_argument("--max-children", type=int, default=1)
    parser.add_argument("--report", type=Path, default=DEFAULT_REPORT)
    parser.add_argument(
        "--all-functions", action="store_true", help="mutate every function, not the listed ones"
    )
    parser.add_argument(
        "--retest-survivors-of",
        type=Path,
        metavar="REPORT",
        help="test again only the survivors listed in REPORT (after adding tests); the "
        "counts are REPORT's with those survivors' new verdicts",
    )
    parser.add_argument(
        "--results-only", action="store_true", help="report the last run's results, run nothing"
    )
    args = parser.parse_args(argv)
    unknown = [n for n in args.modules if n not in BY_NAME]
    if unknown:
        parser.error(f"unknown module(s) {unknown}; known: {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in args.modules] or list(MODULES)
    before = _previous(args.retest_survivors_of) if args.retest_survivors_of else {}
    results = []
    failed: list[str] = []
    for module in chosen:
        if args.retest_survivors_of:
            if module.name not in before:
                continue
            counts, survivors, first_rate = before[module.name]
            if not survivors:
                result = Result(module, dict(counts), [], 0.0)
            else:
                result = run_module(
                    module, args.max_children, survivors, rerun=not args.results_only
                )
                if result.error:  # the previous row and survivors stand
                    print(f"   {module.name}: re-test failed, its row is kept: {result.error}")
                    failed.append(module.name)
                    continue
                for status in ("killed", "timeout"):
                    result.counts[status] = counts[status] + result.counts.get(status, 0)
                result.counts["no tests"] = counts["no tests"]
            result.before = counts
            result.first_rate = first_rate
        else:
            names = [] if args.all_functions else module.mutant_globs()
            result = run_module(module, args.max_children, names, rerun=not args.results_only)
        results.append(result)
        write_report(args.report, results, args.max_children)  # after each: partial runs count
    print(f"report: {args.report}")
    return 1 if failed or any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
