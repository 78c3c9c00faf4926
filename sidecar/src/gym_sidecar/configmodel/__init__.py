"""Typed configuration sections, validated with every problem's key path.

The sidecar's configuration (and the injection webhook's) is a tree of :class:`Section`
classes: each field is an annotated class attribute with a default (or a :func:`Field`
holding the default and its bounds). Input is validated once, as a whole, and every
problem comes out together with its key path, in pydantic's wording, which the docs
quote (``queue.max_bytes: Input should be greater than 0``)::

    class QueueConfig(Section):
        max_bytes: int = Field(default=64 * MiB, gt=0)
        fsync: Literal["always", "interval"] = "always"

        @field_validator("max_bytes")
        @classmethod
        def _check(cls, value: int) -> int: ...

Why not pydantic, which the sidecar used until 2026-12: imported on the serving path,
pydantic, pydantic-core and the modules they load (email, importlib.metadata, decimal,
zoneinfo, uuid, ...) held ~10 MiB resident in every sidecar (idle 46.1 -> 36.1 MiB, peak
at 10k spans/s 52.2 -> 42.1), to check ~150 settings once at start (docs/benchmarks.md,
the sidecar's RSS, "The fifth session"). This package covers what the configuration
uses, lax as pydantic is for values that arrive as text (environment variables):
``bool``, ``int``, ``float``, ``str``, ``Path``, ``Literal``, string enums, ``X | None``,
``list``, ``dict``, nested sections, :class:`Secret`, and ``Annotated[T, after(check)]``
or ``before(check)``. Anything else is a TypeError when the class is first used, not a
silent pass. The injection webhook's Kubernetes AdmissionReview models stay pydantic
(``webhook/admission.py``): that process parses foreign JSON with aliases, and its memory
is not the sidecar's.
"""

from gym_sidecar.configmodel.declare import (
    MISSING,
    Check,
    Field,
    FieldInfo,
    ValidationError,
    after,
    before,
    field_validator,
    model_validator,
)
from gym_sidecar.configmodel.sections import Section
from gym_sidecar.configmodel.values import REDACTED, Opaque, Secret

__all__ = [
    "MISSING",
    "REDACTED",
    "Check",
    "Field",
    "FieldInfo",
    "Opaque",
    "Secret",
    "Section",
    "ValidationError",
    "after",
    "before",
    "field_validator",
    "model_validator",
]
