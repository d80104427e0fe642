"""What every run's plan repeats, built once a worker: its tools' offers (each a JSON schema
copied from the tool's spec), their sizes in canonical JSON, and the capability binding of a
catalog and rules seen before (a digest of every tool's definition).

A burst of run starts spent a tenth of its resolve time rebuilding them (issue 38). Each is
keyed by the identity of what it is built from, which is kept with it and checked, so an MCP
server's refreshed tools (new specs) get new offers; each table is bounded, cleared when full.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.capability_binding import CapabilityBinding
from durable_agent.core.models import InstructionFile
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_specs import ToolOffer, ToolSpec, capability_binding

__all__ = ["OfferCache"]

# Entries a table holds before it is cleared: a worker's own tools and its MCP servers' for a
# few refreshes, and the bindings of a few sets of rules.
MAX_ENTRIES = 512
MAX_BINDINGS = 64


class OfferCache:
    """Offers, sizes and bindings, built once and shared by the runs a worker resolves (they
    are frozen models: no run changes another's)."""

    def __init__(self) -> None:
        self._offers: dict[tuple[int, bool, bool], tuple[ToolSpec, ToolOffer]] = {}
        self._sizes: dict[int, tuple[ToolOffer, int]] = {}
        self._bindings: dict[tuple[Any, ...], tuple[Sequence[ToolOffer], CapabilityBinding]] = {}
        self._keyed: dict[Hashable, ToolOffer] = {}

    def offer(self, spec: ToolSpec, *, parallel: bool, local: bool) -> ToolOffer:
        """``spec.offer(parallel=parallel, local=local)``, built once for this spec."""
        key = (id(spec), parallel, local)
        held = self._offers.get(key)
        if held is not None and held[0] is spec:
            return held[1]
        offer = spec.offer(parallel=parallel, local=local)
        _bounded(self._offers, MAX_ENTRIES)[key] = (spec, offer)
        return offer

    def keyed(self, key: Hashable, build: Callable[[], ToolOffer]) -> ToolOffer:
        """An offer made from what ``key`` says in full (the ``task`` tool's, whose description
        names the worker's agent types), built once."""
        held = self._keyed.get(key)
        if held is None:
            held = _bounded(self._keyed, MAX_ENTRIES)[key] = build()
        return held

    def size(self, offer: ToolOffer) -> int:
        """The bytes of the offer's definition in canonical JSON."""
        held = self._sizes.get(id(offer))
        if held is not None and held[0] is offer:
            return held[1]
        size = len(canonical_bytes(offer.definition))
        _bounded(self._sizes, MAX_ENTRIES)[id(offer)] = (offer, size)
        return size

    def binding(
        self, offers: Sequence[ToolOffer], policy: PermissionPolicy, files: Sequence[InstructionFile]
    ) -> CapabilityBinding:
        """``capability_binding`` of the offers' definitions, the rules and the instruction files,
        built once for the same offers (the same objects), rules and files."""
        key = (
            tuple(id(o) for o in offers),
            policy.model_dump_json(),
            tuple(f.model_dump_json() for f in files),
        )
        held = self._bindings.get(key)
        if held is not None and all(a is b for a, b in zip(held[0], offers, strict=True)):
            return held[1]
        binding = capability_binding((o.definition for o in offers), policy, files)
        _bounded(self._bindings, MAX_BINDINGS)[key] = (tuple(offers), binding)
        return binding


def _bounded(table: dict[Any, Any], most: int) -> dict[Any, Any]:
    if len(table) >= most:
        table.clear()
    return table
