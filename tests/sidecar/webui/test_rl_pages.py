"""The RL view in the web view (issue 41), over real HTTP and a store written the way the
sidecar writes it (trace requests, and the derived metrics its derive stage exported for
them): the environments page's figures, drill-down and the model and verifier tables;
reward, turns and tokens on the rollouts list and the trace page; the stats page's time
series; hostile environment and model names stay text."""

from __future__ import annotations

import html
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from gym_sidecar.webui.app import ViewConfig

from tests.sidecar.webui.data import (
    MODEL,
    RESOURCES,
    derived_metrics,
    gym_trace,
    request,
    write,
    write_points,
)
from tests.sidecar.webui.serve import Clock, get, serve

NOW = time.time_ns()
S = 1_000_000_000
WEATHER = "nemo-gym/weather_agent"
MATH = "nemo-gym/math_agent"
HOSTILE = 'nemo-gym/<script>alert("env")</script>&x'
HOSTILE_MODEL = "<img src=x onerror=alert(1)>"


def _attr(text: str, name: str) -> list[str]:
    return [html.unescape(v) for v in re.findall(rf'{name}="([^"]*)"', text)]


def _rows(text: str, testid: str) -> list[dict[str, str]]:
    """The data-* attributes of each ``<tr data-testid=testid>``."""
    out = []
    for tag in re.findall(rf'<tr[^>]* data-testid="{testid}"[^>]*>', text):
        out.append({k: html.unescape(v) for k, v in re.findall(r'data-([a-z-]+)="([^"]*)"', tag)})
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """weather: 4 rollouts (rewards 1, 1, 0, 1; 2 turns and 34/13 tokens each; one model
    call each) and a failed one (verifier raised: turns 2, no reward or tokens); math: 3
    rollouts (rewards 0.25, 0.5, 0.75; turns 1, 3, 5; tokens 100/10, 200/20, 300/30); a
    hostile environment with one rollout. Started 10 s apart, 10 minutes ago."""
    path = tmp_path_factory.mktemp("rl-webui") / "traces.db"
    payloads = []
    start = NOW - 600 * S
    for i, reward in enumerate((1.0, 1.0, 0.0, 1.0)):
        tid, specs = gym_trace(
            f"w{i}",
            start + i * 10 * S,
            agent=WEATHER,
            reward=reward,
            turns=2,
            tokens=(34, 13),
            model_call=("policy-7b", 13 + i, 5),
        )
        payloads.append(request(tid, specs))
    tid, specs = gym_trace("w-fail", start + 40 * S, agent=WEATHER, fail_verify=True, turns=2)
    payloads.append(request(tid, specs))
    for i, (reward, turns, tokens) in enumerate(
        ((0.25, 1, (100, 10)), (0.5, 3, (200, 20)), (0.75, 5, (300, 30)))
    ):
        tid, specs = gym_trace(
            f"m{i}",
            start + (50 + 10 * i) * S,
            agent=MATH,
            reward=reward,
            turns=turns,
            tokens=tokens,
            model_call=(HOSTILE_MODEL, 1, 1) if i == 0 else None,
        )
        payloads.append(request(tid, specs))
    tid, specs = gym_trace("h0", start + 80 * S, agent=HOSTILE, reward=0.5, turns=1)
    payloads.append(request(tid, specs))
    write(path, payloads, NOW - 500 * S)
    write_points(path, derived_metrics(payloads), NOW - 490 * S)
    return path


@pytest.fixture(scope="module")
def base(store: Path) -> Iterator[str]:
    with serve(ViewConfig(store, clock_ns=Clock(NOW))) as url:
        yield url


def test_environments_page_figures(base: str) -> None:
    page = get(base + "/envs")
    assert page.status == 200
    envs = {row["env"]: row for row in _rows(page.text, "env-row")}
    assert set(envs) == {WEATHER, MATH, HOSTILE}
    weather, math = envs[WEATHER], envs[MATH]
    assert (weather["rollouts"], weather["failed"]) == ("5", "1")
    assert float(weather["reward-mean"]) == 0.75  # the failed rollout has no reward
    assert float(weather["turns-mean"]) == 2.0  # the failed one's turns count
    assert float(weather["input-tokens-mean"]) == 34.0
    assert (math["rollouts"], math["failed"]) == ("3", "0")
    assert float(math["reward-mean"]) == 0.5
    assert float(math["turns-mean"]) == 3.0
    assert (float(math["input-tokens-mean"]), float(math["output-tokens-mean"])) == (200.0, 20.0)
    # p10/p50/p90 of math's rewards by nearest rank: 0.25, 0.5, 0.75
    row = re.search(r'<tr data-testid="env-row" data-env="nemo-gym/math_agent".*?</tr>', page.text)
    assert row is not None
    cells = re.findall(r'<td class="num">([^<]*)</td>', row.group(0))  # (not the linked)
    assert cells[:6] == ["3", "100.0%", "0.5", "0.25", "0.5", "0.75"]  # reward mean, p10..
    # the resources server its rollouts reached (their stored verify spans)
    assert RESOURCES in row.group(0)


def test_an_environment_drills_down_to_its_rollouts(base: str) -> None:
    page = get(base + "/envs")
    links = _attr(page.text, "href")
    weather = next(h for h in links if h.startswith("/rollouts?") and "weather_agent" in h)
    listed = get(base + weather)
    assert listed.status == 200
    assert sorted(_attr(listed.text, "data-rollout")) == ["w-fail", "w0", "w1", "w2", "w3"]
    assert set(_attr(listed.text, "data-env")) == {WEATHER}
    failed = get(base + "/rollouts?" + urllib.parse.urlencode({"env": WEATHER, "failed": "1"}))
    assert _attr(failed.text, "data-rollout") == ["w-fail"]


def test_the_rollouts_list_shows_reward_turns_and_tokens(base: str) -> None:
    page = get(base + "/rollouts")
    rows = {row["rollout"]: row for row in _rows(page.text, "rollout-row")}
    assert (rows["w0"]["reward"], rows["w0"]["turns"], rows["w0"]["tokens"]) == ("1", "2", "47")
    assert (rows["w2"]["reward"], rows["w2"]["tokens"]) == ("0", "47")
    assert (rows["w-fail"]["reward"], rows["w-fail"]["turns"], rows["w-fail"]["tokens"]) == (
        "-",
        "2",
        "-",
    )
    assert (rows["m2"]["reward"], rows["m2"]["turns"], rows["m2"]["tokens"]) == ("0.75", "5", "330")
    assert "34 / 13" in page.text and "300 / 30" in page.text


def test_the_trace_page_shows_the_rollouts_figures(base: str) -> None:
    page = get(base + "/trace/m1")
    assert page.status == 200
    figures = dict(re.findall(r'data-testid="trace-(reward|turns|tokens)">([^<]*)<', page.text))
    assert figures == {"reward": "0.5", "turns": "3", "tokens": "200 / 20"}


def test_model_calls_and_verifier_rewards_from_the_derived_points(base: str) -> None:
    page = get(base + "/envs").text
    models = {(r["service"], r["model"]): r for r in _rows(page, "model-row")}
    weather = models[(MODEL, "policy-7b")]
    assert (weather["calls"], weather["failed"]) == ("4", "0")
    assert weather["input-tokens"] == str(13 + 14 + 15 + 16)
    assert weather["output-tokens"] == "20"
    assert (MODEL, HOSTILE_MODEL) in models
    [verifier] = _rows(page, "verifier-row")
    # every verification with a reward: weather's 4 (1, 1, 0, 1), math's 3, the hostile 1
    assert (verifier["service"], verifier["count"]) == (RESOURCES, "8")
    assert float(verifier["mean"]) == pytest.approx((3 + 1.5 + 0.5) / 8)
    assert verifier["zero"] == "1"  # one reward of 0: exact, the first bucket's bound


def test_hostile_names_are_text(base: str) -> None:
    page = get(base + "/envs").text
    assert "<script>" not in page and "<img" not in page
    assert html.escape(HOSTILE, quote=True) in page
    assert html.escape(HOSTILE_MODEL, quote=True) in page
    listed = get(base + "/rollouts?" + urllib.parse.urlencode({"env": HOSTILE})).text
    assert _attr(listed, "data-rollout") == ["h0"]
    assert "<script>" not in listed


def test_the_stats_page_time_series(base: str) -> None:
    page = get(base + "/stats").text
    for testid in ("rate-chart", "reward-chart", "tokens-chart", "success-chart"):
        assert f'data-testid="{testid}"' in page, testid
    rate = re.search(r'data-testid="rate-chart".*?</svg>', page, re.S)
    assert rate is not None
    counts = [int(n) for n in re.findall(r'data-n="(\d+)"', rate.group(0))]
    assert sum(counts) == 9  # every stored rollout, once
    reward = re.search(r'data-testid="reward-chart".*?</svg>', page, re.S)
    assert reward is not None
    n_rewards = [int(n) for n in re.findall(r'data-n="(\d+)"', reward.group(0))]
    assert sum(n_rewards) == 8  # the failed rollout has none


def test_a_bad_window_is_a_clear_400(base: str) -> None:
    page = get(base + "/envs?since=soon")
    assert page.status == 400 and "since" in page.text


def test_an_empty_store_says_so(tmp_path: Path) -> None:
    path = tmp_path / "traces.db"
    write(path, [])
    with serve(ViewConfig(path, clock_ns=Clock(NOW))) as url:
        page = get(url + "/envs").text
    assert 'data-testid="no-envs"' in page and 'data-testid="no-models"' in page
