"""``rich`` renderables of the RL figures (issue 41): ``gym-sidecar envs`` and the RL part
of ``gym-sidecar stats``. Pure functions of ``store.rl``'s answers, with every client
string through ``render.untrusted`` (escaped, never parsed as markup)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from gym_sidecar.inspect.render import MAX_ID_CHARS, untrusted
from gym_sidecar.store.rl import (
    Environments,
    EnvSummary,
    ModelSummary,
    Summary,
    VerifierRewards,
)
from gym_sidecar.store.stats import Histogram


def _fig(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _summary(s: Summary) -> list[str]:
    return [_fig(s.mean), *(_fig(q) for q in s.quantiles)]


def envs_table(found: Environments, title: str = "Environments") -> Table:
    """One line per environment (agent server); the caption says what the short column
    names mean."""
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("environment", style="cyan", no_wrap=True, overflow="ellipsis", max_width=40)
    for name in ("n", "fail", "ok %"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("reward", "p10", "p50", "p90", "turns", "p50", "p90", "tok in", "tok out"):
        table.add_column(name, justify="right", no_wrap=True)
    for name in ("p50 ms", "p90 ms", "p99 ms"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("resources", overflow="fold")
    for env in found.envs:
        table.add_row(*_env_cells(env))
    notes = [
        "environment: the agent server (its service without nemo-gym/); n: rollouts; ok %: "
        "not failed; reward and turns: mean, then percentiles; tok in/out: mean tokens per "
        "rollout; ms: latency"
    ]
    if not found.envs:
        notes = ["no rollouts in this window"]
    elif found.truncated:
        notes.append(f"the {found.read:,} most recent rollouts only")
    table.caption = "; ".join(notes)
    return table


def _env_cells(env: EnvSummary) -> list[str | Text]:
    success = env.success
    return [
        untrusted(_short(env.env), MAX_ID_CHARS),
        str(env.rollouts),
        Text(str(env.failed), style="bold red" if env.failed else ""),
        "-" if success is None else f"{success:.1%}",
        *_summary(env.reward),
        *_summary(env.turns),
        _fig(env.input_tokens.mean),
        _fig(env.output_tokens.mean),
        *(_ms(q) for q in env.duration_ms.quantiles),
        untrusted(", ".join(_short(s) for s in env.resources) or "-"),
    ]


def _short(service: str) -> str:
    return service.rsplit("/", 1)[-1]


def _tokens(h: Histogram) -> str:
    return "-" if not h.count else f"{h.total:,.0f}"


def models_table(models: Sequence[ModelSummary]) -> Table:
    """Per model server and requested model: calls, failures, tokens, latency."""
    table = Table(title="Model calls", title_justify="left", header_style="bold")
    table.add_column("model server", style="cyan")
    table.add_column("requested model")
    for name in ("calls", "failed", "tokens in", "tokens out", "p50 s", "p95 s"):
        table.add_column(name, justify="right")
    table.add_column("streamed", justify="right")
    table.add_column("first token p50 s", justify="right")
    for m in models:
        table.add_row(
            untrusted(m.service, MAX_ID_CHARS),
            untrusted(m.model, MAX_ID_CHARS),
            str(m.calls),
            Text(str(m.failed), style="bold red" if m.failed else ""),
            _tokens(m.input_tokens),
            _tokens(m.output_tokens),
            _s(m.duration_s.quantile(0.5)),
            _s(m.duration_s.quantile(0.95)),
            str(m.ttft_s.count),
            _s(m.ttft_s.quantile(0.5)),
        )
    if not models:
        table.caption = "no model calls derived in this window"
    return table


def verifiers_table(verifiers: Sequence[VerifierRewards]) -> Table:
    """Per resources server: the rewards of its verifications (gym.verify.reward)."""
    table = Table(title="Verifier rewards", title_justify="left", header_style="bold")
    table.add_column("resources server", style="cyan")
    for name in ("rewards", "mean", "reward <= 0", "failed with reward"):
        table.add_column(name, justify="right")
    for v in verifiers:
        done = v.completed
        zero = done.at_most(0.0)
        table.add_row(
            untrusted(v.service, MAX_ID_CHARS),
            str(done.count),
            _fig(done.mean),
            "-" if zero is None or not done.count else f"{zero / done.count:.1%}",
            str(v.failed.count),
        )
    if not verifiers:
        table.caption = "no rewards derived in this window"
    return table


def rl_group(
    found: Environments,
    models: Sequence[ModelSummary],
    verifiers: Sequence[VerifierRewards],
) -> Group:
    """What ``gym-sidecar envs`` prints."""
    return Group(envs_table(found), models_table(models), verifiers_table(verifiers))
