"""The one configuration loader of ``gym-sidecar`` (``run``, ``check-config``, the inspect
commands) and of the injection webhook (``gym-sidecar webhook``).

A program describes its configuration as a :class:`~gym_sidecar.configmodel.Section`
tree and calls :func:`load_layers` with its environment prefix. Sources, highest
precedence first:

1. arguments (``overrides``: the nested dict spelled by the command-line flags);
2. environment variables ``<PREFIX><KEY>``, nested keys joined with ``__``
   (``GYM_SIDECAR_BACKEND__URL``, ``GYM_INJECTOR_RESOURCES__LIMITS__CPU``), plus the
   program's aliases (``GYM_SIDECAR_BACKEND``). Every value is read by the same rules
   (:func:`env_value`): text, converted by the field's type (``"5"``, ``"true"``);
   ``null`` or ``~``: none; a value starting with ``{`` or ``[``: a YAML flow collection;
3. the YAML file, after Collector-style ``${env:VAR}`` expansion (:func:`expand_env`);
4. the model's defaults.

The layers are merged as plain dicts (a nested section merges key by key) and validated
once, so every problem of every layer comes out together, each with its dotted key path
(``queue.max_bytes: Input should be greater than 0``), as one :class:`ConfigError`.

A program adds a setting by adding a field to its model; nothing here changes.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar

from gym_telemetry_semconv.safetext import escape_controls

from gym_sidecar.configmodel import Opaque, Section, ValidationError, after
from gym_sidecar.hostport import split_host_port

ENV_NESTED_DELIMITER = "__"
"""Separator of nested keys in environment variable names."""

M = TypeVar("M", bound=Section)


class ConfigError(Exception):
    """The configuration could not be loaded; ``errors`` lists every problem found, each
    prefixed by its key path (or the file / variable it came from). Keys and values in
    them come from the file or the environment: their control characters are escaped
    (``gym_telemetry_semconv.safetext``), so each error is one printable line."""

    header = "invalid configuration"

    def __init__(self, errors: list[str]) -> None:
        errors = [escape_controls(e) for e in errors]
        super().__init__(f"{self.header}:\n  " + "\n  ".join(errors))
        self.errors = errors


# -- opaque values ---------------------------------------------------------------------------
OpaqueStr = Annotated[str, after(Opaque)]
"""A config field holding a secret: validated as text, kept as :class:`Opaque`, dumped
as ``[REDACTED]`` in JSON mode (``check-config`` prints that dump)."""


# -- host:port ---------------------------------------------------------------------------
def _check_listen(value: str) -> str:
    split_host_port(value)
    return value


ListenAddress = Annotated[str, after(_check_listen)]
"""A validated ``HOST:PORT`` (:func:`split_host_port`)."""


# -- ${env:VAR} expansion ----------------------------------------------------------------
_REFERENCE = re.compile(r"\$\$|\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _expand_text(text: str, environ: Mapping[str, str], where: str, errors: list[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"  # the escape: "$${env:X}" is the literal text "${env:X}"
        body = match.group(1)
        ref = body.removeprefix("env:")
        name, has_default, default = ref.partition(":-")
        if not _ENV_NAME.match(name):
            errors.append(
                f"{where}: ${{{body}}} is not an environment reference "
                "(use ${env:NAME}, ${NAME} or ${env:NAME:-default}; $$ for a literal $)"
            )
            return match.group(0)
        if name in environ:
            return environ[name]
        if has_default:
            return default
        errors.append(f"{where}: environment variable {name} is not set (${{{body}}})")
        return match.group(0)

    return _REFERENCE.sub(replace, text)


def expand_env(data: Any, environ: Mapping[str, str], path: str = "") -> tuple[Any, list[str]]:
    """Expand ``${env:VAR}``, ``${VAR}`` and ``${env:VAR:-default}`` in every string value
    of ``data``, as the OpenTelemetry Collector does in its config; ``$$`` is a literal
    ``$``. Keys are not expanded. Returns the expanded copy and the problems found (an
    unset variable without a default, a malformed reference), each with its key path."""
    errors: list[str] = []

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, str):
            return _expand_text(node, environ, where or "<root>", errors) if "$" in node else node
        if isinstance(node, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(data, path), errors


# -- the file ------------------------------------------------------------------------------
def _yaml_problem(exc: Exception) -> str:
    """A YAML error without PyYAML's ``in "<unicode string>"`` marks (the caller names the
    file): ``line 3, column 1: expected the node content, but found '<stream end>'``."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


def read_yaml_file(path: str | Path, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Read a YAML mapping and expand its environment references (``environ``; None: no
    expansion). Raises :class:`ConfigError` (never OSError/YAMLError) naming the file."""
    # Imported here: a sidecar run from flags and the environment never loads yaml (~4 MiB
    # resident; docs/benchmarks.md, sidecar RSS).
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML at {_yaml_problem(exc)}"]) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: top level must be a mapping, got {type(data).__name__}"])
    if environ is None:
        return data
    expanded, errors = expand_env(data, environ)
    if errors:
        raise ConfigError([f"{path}: {e}" for e in errors])
    return dict(expanded)


# -- the environment -----------------------------------------------------------------------
def env_value(name: str, raw: str) -> Any:
    """One environment value by the shared rules (see the module doc). Raises ValueError
    naming the variable when a flow collection is not valid YAML."""
    stripped = raw.strip()
    if stripped in ("null", "~"):
        return None
    if stripped.startswith(("{", "[")):
        import yaml  # only for flow collections (see read_yaml_file)

        try:
            return yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise ValueError(
                f"{name}: not a valid YAML flow collection at {_yaml_problem(exc)}"
            ) from None
    return raw


def env_overrides(
    environ: Mapping[str, str],
    prefix: str,
    aliases: Mapping[str, str] | None = None,
    ignore: Collection[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    """The nested dict spelled by ``<prefix>*`` variables (keys lower-cased) and the
    problems found. ``aliases`` maps a variable name to the ``__``-joined key it sets (the
    nested spelling wins over an alias); ``ignore`` names variables that are not keys."""
    out: dict[str, Any] = {}
    errors: list[str] = []
    alias_map = aliases or {}
    # Sorted so that the nested spelling (GYM_SIDECAR_BACKEND__URL) beats the alias.
    for name, raw in sorted(environ.items()):
        if not name.startswith(prefix) or name == prefix or name in ignore:
            continue
        key = alias_map.get(name) or name[len(prefix) :].lower()
        try:
            value = env_value(name, raw)
        except ValueError as exc:
            errors.append(str(exc))
            continue
        set_path(out, key.split(ENV_NESTED_DELIMITER), value)
    return out, errors


def set_path(target: dict[str, Any], path: list[str], value: Any) -> None:
    """Set ``target[path[0]][path[1]]... = value``, creating mappings on the way."""
    node = target
    for key in path[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = {}
            node[key] = child
        node = child
    node[path[-1]] = value


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``override`` wins key by key; nested mappings merge instead of replacing."""
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(current, value)
        else:
            out[key] = value
    return out


def format_validation_error(exc: ValidationError) -> list[str]:
    """One ``dotted.key.path: message`` line per problem."""
    out = []
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "<root>"
        out.append(f"{path}: {err['msg']}")
    return out


# -- all layers ----------------------------------------------------------------------------
def load_layers(
    model: type[M],
    *,
    prefix: str,
    environ: Mapping[str, str],
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    aliases: Mapping[str, str] | None = None,
    ignore_env: Collection[str] = (),
    onto_defaults: bool = False,
    error: type[ConfigError] = ConfigError,
) -> M:
    """Merge defaults < file < environment < ``overrides`` and validate once.

    ``onto_defaults``: start from the dumped defaults, for models whose nested sections
    have required fields with defaults only at the parent (a partial ``resources.limits``
    keeps its sibling ``memory``). Raises ``error`` (a :class:`ConfigError`) listing every
    problem: the file's unset variables, bad environment values and every validation
    error, together.
    """
    problems: list[str] = []
    data: dict[str, Any] = model().model_dump() if onto_defaults else {}
    if config_file is not None:
        try:
            raw = read_yaml_file(config_file)
        except ConfigError as exc:
            problems.extend(exc.errors)
        else:
            # Unset variables are reported with the rest; their text stays in place.
            expanded, expand_errors = expand_env(raw, environ)
            problems.extend(f"{config_file}: {e}" for e in expand_errors)
            data = deep_merge(data, expanded)
    from_env, env_errors = env_overrides(environ, prefix, aliases, ignore_env)
    problems.extend(env_errors)
    data = deep_merge(data, from_env)
    if overrides:
        data = deep_merge(data, overrides)
    try:
        loaded = model.model_validate(data)
    except ValidationError as exc:
        problems.extend(format_validation_error(exc))
    if problems:
        raise error(problems)
    return loaded
