"""The tools' offers, sizes and bindings a worker builds once for every run it resolves
(``activities/offer_cache.py``): the same as built for each run, and built again for what changed."""

from __future__ import annotations

import dataclasses

from durable_agent.activities.offer_cache import MAX_ENTRIES, OfferCache
from durable_agent.activities.resolve_run import within_catalog_budget
from durable_agent.activities.tools.builtin import builtin_tools
from durable_agent.core.canonical import canonical_bytes
from durable_agent.core.permissions import PermissionPolicy
from durable_agent.core.tool_specs import capability_binding


def test_offers_are_built_once_a_spec_and_again_for_a_new_one() -> None:
    cache = OfferCache()
    specs = [t.spec for t in builtin_tools().values()]
    first = [cache.offer(s, parallel=s.read_only, local=False) for s in specs]
    again = [cache.offer(s, parallel=s.read_only, local=False) for s in specs]
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert first == [s.offer(parallel=s.read_only, local=False) for s in specs]  # as built for each run
    # other options, or a spec that changed (an MCP server's refreshed tool): another offer
    assert cache.offer(specs[0], parallel=not specs[0].read_only, local=False) is not first[0]
    changed = dataclasses.replace(specs[0], description="another description")
    assert cache.offer(changed, parallel=changed.read_only, local=False).definition.description == (
        "another description"
    )
    # bounded: a full table is cleared, and answers stay right
    for _ in range(MAX_ENTRIES + 1):
        fresh = dataclasses.replace(specs[0])
        assert cache.offer(fresh, parallel=False, local=False) == fresh.offer(parallel=False)


def test_sizes_and_bindings_are_those_built_for_each_run() -> None:
    cache = OfferCache()
    offers = [cache.offer(t.spec, parallel=False, local=False) for t in builtin_tools().values()]
    assert [cache.size(o) for o in offers] == [len(canonical_bytes(o.definition)) for o in offers]
    assert within_catalog_budget(offers, 10**9, size=cache.size) == within_catalog_budget(offers, 10**9)
    rules = PermissionPolicy(allow=("read(**)",))
    binding = cache.binding(offers, rules, ())
    assert binding == capability_binding((o.definition for o in offers), rules, ())
    assert cache.binding(offers, rules, ()) is binding
    other = PermissionPolicy(allow=("read(**)", "bash"))
    assert cache.binding(offers, other, ()) == capability_binding((o.definition for o in offers), other, ())
    assert cache.binding(offers, other, ()).catalog_digest != binding.catalog_digest
    assert cache.binding(offers[1:], rules, ()).tools == tuple(sorted(o.definition.name for o in offers[1:]))
