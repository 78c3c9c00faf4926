"""The RL operator's views (issue 41): the environments page and the stats page's time
series. Pure functions of what the store returned (:mod:`gym_sidecar.store.rl`,
``store.stats.span_samples``); every value that came from a span is escaped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gym_sidecar.store.rl import Environments, EnvSummary, ModelSummary, VerifierRewards
from gym_sidecar.store.rl import Summary as FigureSummary
from gym_sidecar.store.stats import Histogram, SpanSample
from gym_sidecar.webui import svg
from gym_sidecar.webui.html import clip, e, fmt_ms, page, table, url
from gym_sidecar.webui.pages import when

MAX_BINS: Final = 24
BIN_STEPS_S: Final = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
"""Bin widths the time series pick from: the smallest that needs at most MAX_BINS bins."""


def fmt(value: float | None, digits: int = 3) -> str:
    """A figure for a cell: ``-`` for None, else ``digits`` significant digits."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}g}" if abs(value) < 1e6 else f"{value:,.0f}"


def fmt_s(value: float | None) -> str:
    return "-" if value is None else fmt_ms(value * 1000.0)


# -- the time series ------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutSeries:
    """Rollouts per minute, mean reward and tokens per minute, per time bin."""

    width_s: int
    rate: list[svg.SeriesPoint]
    reward: list[svg.SeriesPoint]
    tokens: list[svg.SeriesPoint]


def rollout_series(samples: Sequence[SpanSample]) -> RolloutSeries:
    """The stored rollouts (by start time) in at most :data:`MAX_BINS` bins of a width
    from :data:`BIN_STEPS_S`; an empty bin is a zero rate and a gap in the other lines."""
    if not samples:
        return RolloutSeries(0, [], [], [])
    t0, t1 = samples[0].start_ns, samples[-1].start_ns
    span_s = (t1 - t0) / 1e9
    width = next((w for w in BIN_STEPS_S if span_s / w < MAX_BINS), BIN_STEPS_S[-1])
    first = (t0 // (width * 10**9)) * width * 10**9
    n_bins = int((t1 - first) // (width * 10**9)) + 1
    bins: list[list[SpanSample]] = [[] for _ in range(n_bins)]
    for s in samples:
        bins[int((s.start_ns - first) // (width * 10**9))].append(s)
    per_minute = 60.0 / width
    rate, reward, tokens = [], [], []
    for i, found in enumerate(bins):
        label = when(first + i * width * 10**9)[11:19]
        rate.append(svg.SeriesPoint(label, len(found) * per_minute, len(found)))
        rewards = [s.reward for s in found if s.reward is not None]
        reward.append(
            svg.SeriesPoint(
                label, math.fsum(rewards) / len(rewards) if rewards else None, len(rewards)
            )
        )
        counted = [s.tokens for s in found if s.tokens is not None]
        tokens.append(
            svg.SeriesPoint(label, sum(counted) * per_minute if counted else None, len(counted))
        )
    return RolloutSeries(width, rate, reward, tokens)


def series_section(series: RolloutSeries) -> str:
    """The stats page's RL time series (three charts)."""
    every = f"{series.width_s} s bins" if series.width_s else ""
    return "".join(
        [
            f'<h2>Rollouts per minute</h2><p class="hint">{e(every)}; by start time of the '
            "stored rollouts.</p>",
            svg.series_chart(
                series.rate, "rate-chart", "rollouts per minute", "per min", bars=True
            ),
            '<h2>Reward over time</h2><p class="hint">The mean reward of the rollouts '
            "started in each bin (their rollout span's nemo.gym.reward).</p>",
            svg.series_chart(
                series.reward, "reward-chart", "mean reward", "reward", empty="no rewards"
            ),
            '<h2>Tokens over time</h2><p class="hint">Input plus output tokens per minute of '
            "the rollouts started in each bin (the usage Gym summed into each /run).</p>",
            svg.series_chart(
                series.tokens, "tokens-chart", "tokens per minute", "tokens/min", empty="no tokens"
            ),
        ]
    )


# -- the environments page ------------------------------------------------------------------


def _figure_cells(summary: FigureSummary) -> str:
    return f'<td class="num">{e(fmt(summary.mean))}</td>' + "".join(
        f'<td class="num">{e(fmt(q))}</td>' for q in summary.quantiles
    )


def _env_row(env: EnvSummary, since: str) -> str:
    success = env.success
    link = url("/rollouts", {"env": env.env, "since": since})
    failed = url("/rollouts", {"env": env.env, "since": since, "failed": "1"})
    latency = "".join(f'<td class="num">{e(fmt_ms(q))}</td>' for q in env.duration_ms.quantiles)
    return (
        f'<tr data-testid="env-row" data-env="{e(env.env)}" data-rollouts="{env.rollouts}" '
        f'data-failed="{env.failed}" data-reward-mean="{e(fmt(env.reward.mean, 6))}" '
        f'data-turns-mean="{e(fmt(env.turns.mean, 6))}" '
        f'data-input-tokens-mean="{e(fmt(env.input_tokens.mean, 6))}" '
        f'data-output-tokens-mean="{e(fmt(env.output_tokens.mean, 6))}">'
        f'<td><a href="{link}" data-testid="env-link">{clip(env.env, 80)}</a></td>'
        f'<td class="num">{env.rollouts}</td>'
        f'<td class="num"><a href="{failed}">{env.failed}</a></td>'
        f'<td class="num">{"-" if success is None else f"{success:.1%}"}</td>'
        f"{_figure_cells(env.reward)}"
        f'<td class="num">{e(fmt(env.turns.mean))}</td>'
        f'<td class="num">{e(fmt(env.turns.quantiles[0]))}</td>'
        f'<td class="num">{e(fmt(env.turns.quantiles[1]))}</td>'
        f'<td class="num">{e(fmt(env.input_tokens.mean))}</td>'
        f'<td class="num">{e(fmt(env.output_tokens.mean))}</td>'
        f"{latency}"
        f"<td>{clip(', '.join(env.resources) or '-')}</td></tr>"
    )


def _tokens(h: Histogram) -> str:
    return "-" if not h.count else f"{h.total:,.0f} ({fmt(h.mean)}/call)"


def _model_row(m: ModelSummary) -> str:
    return (
        f'<tr data-testid="model-row" data-service="{e(m.service)}" data-model="{e(m.model)}" '
        f'data-calls="{m.calls}" data-failed="{m.failed}" '
        f'data-input-tokens="{m.input_tokens.total:.0f}" '
        f'data-output-tokens="{m.output_tokens.total:.0f}" data-streamed="{m.ttft_s.count}">'
        f"<td>{clip(m.service, 80)}</td><td>{clip(m.model, 80)}</td>"
        f'<td class="num">{m.calls}</td><td class="num">{m.failed}</td>'
        f'<td class="num">{e(_tokens(m.input_tokens))}</td>'
        f'<td class="num">{e(_tokens(m.output_tokens))}</td>'
        f'<td class="num">{e(fmt_s(m.duration_s.quantile(0.5)))}</td>'
        f'<td class="num">{e(fmt_s(m.duration_s.quantile(0.95)))}</td>'
        f'<td class="num">{m.ttft_s.count}</td>'
        f'<td class="num">{e(fmt_s(m.ttft_s.quantile(0.5)))}</td></tr>'
    )


def _verifier_row(v: VerifierRewards) -> str:
    done = v.completed
    zero = done.at_most(0.0)
    share = "-" if zero is None or not done.count else f"{zero / done.count:.1%}"
    return (
        f'<tr data-testid="verifier-row" data-service="{e(v.service)}" '
        f'data-count="{done.count}" data-mean="{e(fmt(done.mean, 6))}" '
        f'data-zero="{"" if zero is None else zero}" '
        f'data-failed-with-reward="{v.failed.count}">'
        f'<td>{clip(v.service, 80)}</td><td class="num">{done.count}</td>'
        f'<td class="num">{e(fmt(done.mean))}</td>'
        f'<td class="num">{e(share)}</td>'
        f'<td class="num">{v.failed.count}</td></tr>'
    )


def envs_page(
    found: Environments,
    models: Sequence[ModelSummary],
    verifiers: Sequence[VerifierRewards],
    since: str,
    error: str = "",
) -> str:
    """Per environment (agent server): rollouts, success, reward, turns, tokens, latency,
    each linking to its rollouts; then the model calls and the verifiers' rewards."""
    form = (
        '<form class="filters" method="get" action="/envs"><label>since '
        f'<input name="since" size="6" value="{e(since)}" placeholder="all"></label>'
        '<button type="submit">Show</button></form>'
    )
    body = [form]
    if error:
        body.append(f'<p class="message error" data-testid="filter-error">{e(error)}</p>')
    bound = f" Only the {found.read:,} most recent rollouts were read." if found.truncated else ""
    body.append(
        f'<p class="hint" data-testid="envs-scope" data-rollouts="{found.read}">An environment '
        "is the agent server that ran the rollout (one agent config binds its resources and "
        "model servers). Reward, turns and tokens are each rollout span's (the /run answer's "
        "reward, its model calls, the usage Gym summed); success is the share of rollouts "
        f"that did not fail. Click an environment for its rollouts.{e(bound)}</p>"
    )
    headers = [
        "environment",
        "rollouts",
        "failed",
        "success",
        "reward mean",
        "p10",
        "p50",
        "p90",
        "turns mean",
        "turns p50",
        "p90",
        "input tokens / rollout",
        "output tokens / rollout",
        "latency p50",
        "p90",
        "p99",
        "resources servers",
    ]
    if found.envs:
        body.append(table(headers, (_env_row(env, since) for env in found.envs), "envs"))
    else:
        body.append('<p class="empty" data-testid="no-envs">No rollouts in this window.</p>')
    body.append(
        "<h2>Model calls</h2>"
        '<p class="hint">From the derived gen_ai.client.operation.duration, '
        "gen_ai.client.token.usage and gen_ai.server.time_to_first_token: every call, at the "
        "model server it reached (also while the model_call spans are not kept).</p>"
    )
    if models:
        body.append(
            table(
                [
                    "model server",
                    "requested model",
                    "calls",
                    "failed",
                    "input tokens",
                    "output tokens",
                    "duration p50",
                    "p95",
                    "streamed",
                    "first token p50",
                ],
                (_model_row(m) for m in models),
                "models",
            )
        )
    else:
        body.append('<p class="empty" data-testid="no-models">No model calls derived.</p>')
    body.append(
        "<h2>Verifier rewards</h2>"
        '<p class="hint">From the derived gym.verify.reward: every completed verification '
        "that returned a reward (a verifier that raised has none), per resources server; "
        "reward &le; 0 is the share of answers scored 0 (or below), exact from the "
        "histogram's first bucket.</p>"
    )
    if verifiers:
        body.append(
            table(
                ["resources server", "rewards", "mean", "reward ≤ 0", "failed with reward"],
                (_verifier_row(v) for v in verifiers),
                "verifiers",
            )
        )
    else:
        body.append('<p class="empty" data-testid="no-verifiers">No rewards derived.</p>')
    return page("Environments", "".join(body), active="/envs")
