"""One exporter that sends every request to several (the backend and the local store).

The result is the worst of the children's: SUCCESS only when all succeeded, else
RETRYABLE if any is retryable (with the longest server hint), else PERMANENT. When the
sender retries a request, children that already succeeded for that same payload object
are skipped, so a down backend does not make the store write the request again and
again. That memory is bounded (``_MAX_REMEMBERED`` requests, oldest forgotten first;
a forgotten entry only costs a repeated, idempotent write).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence

from gym_sidecar.core.exporter import Exporter, ExportResult, Outcome
from gym_sidecar.core.stage import Signal

_MAX_REMEMBERED = 64


class FanOutExporter(Exporter):
    """Exports each request to every child concurrently (see the module docstring)."""

    name = "fanout"

    def __init__(self, children: Sequence[Exporter]) -> None:
        if not children:
            raise ValueError("FanOutExporter needs at least one exporter")
        self.children = list(children)
        self.name = "+".join(c.name for c in self.children)
        # id(payload) -> (payload, indexes of children done); the payload (bytes, or the
        # sender's list of pieces) is held so the id cannot be reused while remembered.
        self._done: OrderedDict[int, tuple[object, set[int]]] = OrderedDict()

    async def export(self, signal: Signal, payload: bytes, items: int) -> ExportResult:
        return await self._fan_out(signal, payload, items)

    async def export_parts(
        self, signal: Signal, parts: Sequence[bytes | memoryview], items: int
    ) -> ExportResult:
        # Each child gets the pieces: the backend's exporter sends or compresses them as
        # they are, the store's joins them (the default), so the batch is joined once
        # at most, by whoever needs it whole.
        return await self._fan_out(signal, parts, items)

    async def _fan_out(
        self, signal: Signal, payload: bytes | Sequence[bytes | memoryview], items: int
    ) -> ExportResult:
        key = id(payload)
        entry = self._done.get(key)
        done = entry[1] if entry is not None and entry[0] is payload else set()
        todo = [i for i in range(len(self.children)) if i not in done]
        results = await asyncio.gather(
            *(
                self.children[i].export(signal, payload, items)
                if isinstance(payload, bytes)
                else self.children[i].export_parts(signal, payload, items)
                for i in todo
            )
        )
        for i, result in zip(todo, results, strict=True):
            if result.outcome is Outcome.SUCCESS:
                done.add(i)
        worst = _combine(list(results))
        if worst.outcome is Outcome.RETRYABLE:
            self._done[key] = (payload, done)
            self._done.move_to_end(key)
            while len(self._done) > _MAX_REMEMBERED:
                self._done.popitem(last=False)
        else:
            self._done.pop(key, None)
        return worst

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.children))


def _combine(results: list[ExportResult]) -> ExportResult:
    if not results:
        return ExportResult.success()
    retryable = [r for r in results if r.outcome is Outcome.RETRYABLE]
    if retryable:
        hints = [r.retry_after_s for r in retryable if r.retry_after_s is not None]
        return ExportResult.retryable(
            "; ".join(r.message for r in retryable), max(hints) if hints else None
        )
    permanent = [r for r in results if r.outcome is Outcome.PERMANENT]
    if permanent:
        return ExportResult.permanent("; ".join(r.message for r in permanent))
    rejected = max(r.rejected_items for r in results)
    return ExportResult.success(rejected, "; ".join(r.message for r in results if r.message))
