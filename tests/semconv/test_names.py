import gym_telemetry_semconv as semconv


def test_scope_name_round_trips_for_every_group() -> None:
    for group in semconv.ALL_GROUPS:
        assert semconv.group_of_scope(semconv.scope_name(group)) == group


def test_foreign_scope_has_no_group() -> None:
    assert semconv.group_of_scope("opentelemetry.instrumentation.fastapi") is None


def test_presets_are_subsets_of_all_groups() -> None:
    for name, groups in semconv.PRESETS.items():
        assert groups <= semconv.PRESETS["all"], name
    assert semconv.PRESETS["default"] == {"job", "server", "http_client", "rollout"}


def test_every_derived_metric_reads_a_derived_group() -> None:
    assert set(semconv.SOURCE_GROUP.values()) == semconv.DERIVED_GROUPS
    assert {
        semconv.GROUP_ROLLOUT,
        semconv.GROUP_VERIFY,
        semconv.GROUP_MODEL_CALL,
        semconv.GROUP_HTTP_CLIENT,
    } == semconv.DERIVED_GROUPS


def test_model_calls_and_hops_are_created_by_default() -> None:
    """Issue 41: the GenAI and hop metrics work with no configuration: ``model_call`` is
    in ``metrics`` mode and ``http_client`` ``on`` (the ``default`` preset)."""
    modes = semconv.resolve_modes(semconv.DEFAULT_SPEC)
    assert modes[semconv.GROUP_MODEL_CALL] is semconv.Mode.METRICS
    assert modes[semconv.GROUP_HTTP_CLIENT] is semconv.Mode.ON
    assert semconv.resolve_modes("rollout")[semconv.GROUP_HTTP_CLIENT] is semconv.Mode.METRICS


def test_admin_paths() -> None:
    assert semconv.SPAN_GROUPS_PATH == "/v1/span-groups"
    assert semconv.DEFAULT_ADMIN_PORT == 13133
