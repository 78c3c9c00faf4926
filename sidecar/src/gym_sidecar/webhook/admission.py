"""AdmissionReview ``admission.k8s.io/v1`` as typed structures.

Only the fields the injector reads or writes are modelled; everything else the API
server sends is accepted and ignored, so newer API servers stay compatible.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"


class GroupVersionKind(BaseModel):
    model_config = ConfigDict(extra="ignore")

    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(BaseModel):
    """The part of a review the API server fills in."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    uid: str
    kind: GroupVersionKind
    operation: str
    namespace: str | None = None
    name: str | None = None
    object: dict[str, Any] | None = None
    dry_run: bool = Field(default=False, alias="dryRun")


class AdmissionResponse(BaseModel):
    """The webhook's answer. ``patch`` is base64 of a JSON Patch (RFC 6902) array."""

    model_config = ConfigDict(populate_by_name=True)

    uid: str
    allowed: bool = True
    patch: str | None = None
    patch_type: Literal["JSONPatch"] | None = Field(default=None, alias="patchType")
    warnings: list[str] | None = None


class AdmissionReview(BaseModel):
    """Request and response envelope; the same kind travels both ways."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    api_version: Literal["admission.k8s.io/v1"] = Field(default=API_VERSION, alias="apiVersion")
    kind: Literal["AdmissionReview"] = KIND
    request: AdmissionRequest | None = None
    response: AdmissionResponse | None = None


def response_review(
    uid: str, patch: list[dict[str, Any]] | None = None, warnings: list[str] | None = None
) -> AdmissionReview:
    """An allowing review answer, with the JSON patch encoded when there is one."""
    response = AdmissionResponse(uid=uid, allowed=True, warnings=warnings or None)
    if patch:
        response.patch = base64.b64encode(json.dumps(patch).encode()).decode("ascii")
        response.patch_type = "JSONPatch"
    return AdmissionReview(response=response)


def encode_review(review: AdmissionReview) -> bytes:
    """The JSON body sent back to the API server (camelCase keys, no nulls)."""
    return review.model_dump_json(by_alias=True, exclude_none=True).encode()
