"""Support shared by the tests (``tests/``) and the benchmarks (``bench/``).

The benchmarks import nothing from the test tree; what both need lives here: OTLP
sinks (:mod:`testkit.sink` over gRPC, :mod:`testkit.http_sink` over OTLP/HTTP), the
independent peers (:mod:`testkit.rotel`, :mod:`testkit.otelcol` for the gateway
Collector), real Gym servers (:mod:`testkit.gym_stack`), OTLP request builders
(:mod:`testkit.otlp_samples`, :mod:`testkit.rollout_requests`) and waiting
(:mod:`testkit.wait`). Helpers only the tests use stay in ``tests/support/``.
``tests/test_tree_layers.py`` keeps the direction: product packages import neither
tree, ``testkit`` and ``bench`` never import ``tests``, and ``testkit`` never imports
``bench``.
"""
