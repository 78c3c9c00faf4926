"""The sidecar's own counters (:class:`LoopCounter`) are exposed exactly as
prometheus_client's ``Counter`` with the same definition would be, in both formats."""

from __future__ import annotations

import random
from typing import Any

import pytest
from gym_sidecar.selfmetrics import LoopCounter, SelfMetrics
from prometheus_client import CollectorRegistry, Counter, Gauge, metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics

LABEL_VALUES: list[Any] = ["traces", "metrics", "x y", 'quote"', "", 7, 1.5, True, None]


def twin(registry: CollectorRegistry, counter: LoopCounter) -> Counter:
    """prometheus_client's Counter with ``counter``'s name, help and label names."""
    return Counter(
        counter._name, counter._documentation, list(counter._labelnames), registry=registry
    )


def render(registry: CollectorRegistry) -> tuple[bytes, bytes]:
    return generate_latest(registry), openmetrics.generate_latest(registry)  # type: ignore[no-untyped-call]


@pytest.mark.parametrize("created", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_every_counter_renders_as_prometheus_clients_counter(
    seed: int, created: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same increments on every counter of a SelfMetrics and on prometheus_client
    twins, label values passed by position or by name (strings or not, first used in
    a random order), render to the same bytes in the classic text format and in
    OpenMetrics, with and without ``_created`` samples."""
    monkeypatch.setattr("time.time", lambda: 1_700_000_000.25)
    monkeypatch.setattr(metrics, "_use_created", created)
    ours = SelfMetrics()
    theirs = CollectorRegistry(auto_describe=True)
    pairs: list[tuple[Any, Any]] = []
    for value in vars(ours).values():
        if isinstance(value, LoopCounter):
            pairs.append((value, twin(theirs, value)))
        elif isinstance(value, Gauge):
            labels = list(value._labelnames)  # an info gauge (the trace scanner) has some
            twin_gauge = Gauge(value._name, value._documentation, labels, registry=theirs)
            pairs.append((value, twin_gauge))
    rng = random.Random(seed)
    for _ in range(300):
        mine, other = rng.choice(pairs)
        if isinstance(mine, Gauge):
            n = rng.randrange(1000)
            if mine._labelnames:
                values = [rng.choice(["native", "python"]) for _ in mine._labelnames]
                mine, other = mine.labels(*values), other.labels(*values)
            mine.set(n)
            other.set(n)
            continue
        names = mine._labelnames
        values = [rng.choice(LABEL_VALUES) for _ in names]
        amount = rng.choice([1, 3, 0, 2.5, 1e9])
        if rng.random() < 0.3:
            named = dict(zip(names, values, strict=True))
            mine.labels(**named).inc(amount)
            other.labels(**named).inc(amount)
        else:
            mine.labels(*values).inc(amount)
            other.labels(*values).inc(amount)
    assert render(ours.registry) == render(theirs)
    for _, other in pairs:
        for sample in (s for m in other.collect() for s in m.samples):
            assert ours.registry.get_sample_value(sample.name, sample.labels) == sample.value


def test_a_counter_refuses_what_prometheus_clients_refuses() -> None:
    counter = LoopCounter("c", "help", ["a", "b"], CollectorRegistry())
    with pytest.raises(ValueError, match="Incorrect label count"):
        counter.labels("x")
    with pytest.raises(ValueError, match="Incorrect label names"):
        counter.labels(a="x", c="y")
    with pytest.raises(ValueError, match="both"):
        counter.labels("x", b="y")
    child = counter.labels("x", "y")
    with pytest.raises(ValueError, match="non-negative"):
        child.inc(-1)
    assert child is counter.labels(a="x", b="y") is counter.labels("x", "y")
    registry = CollectorRegistry(auto_describe=True)
    LoopCounter("c", "one", ["a"], registry)
    with pytest.raises(ValueError, match="Duplicated"):
        LoopCounter("c", "two", ["a"], registry)
