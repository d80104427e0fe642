"""A tree's objects brought from the run's sink into a shadow repository (``ShadowRepo``), and
a workspace rebuilt from there (a rewind, a resume elsewhere, a copy restored).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from durable_agent.activities.sinks import ObjectSink
from durable_agent.activities.workspaces.errors import WorkspaceTreeError
from durable_agent.activities.workspaces.objects import _tree_entries
from durable_agent.activities.workspaces.shadow import ShadowRepo

__all__ = ["Fetched", "fetch_tree", "restore_tree"]

_FETCH_BATCH = 500  # objects asked of a sink at once
_PACK_FLUSH_BYTES = 64 * 1024 * 1024  # a restore's objects held before they are written as a pack


@dataclass(frozen=True)
class Fetched:
    """What ``fetch_tree`` brought from the sink: how many objects, and their bytes there."""

    objects: int = 0
    size: int = 0  # bytes

    def __add__(self, got: Mapping[str, bytes]) -> Fetched:
        return Fetched(self.objects + len(got), self.size + sum(len(data) for data in got.values()))


async def fetch_tree(repo: ShadowRepo, tree: str, sink: ObjectSink, *, blobs: bool = True) -> Fetched:
    """Bring ``tree``'s objects the shadow lacks from ``sink`` (its subtrees; with ``blobs``, its
    files' too).

    Returns:
        How many objects came from the sink, and their size there.

    Raises:
        WorkspaceTreeError: The sink lacks one, or gave one that is not what its id names.
    """
    await asyncio.to_thread(repo.prepare)
    level, files = [tree], set()
    fetched = Fetched()
    # what came from the sink, kept in the shadow together (one pack: ``ShadowRepo.add_objects``)
    pending: dict[str, bytes] = {}

    async def keep(got: dict[str, bytes], *, last: bool = False) -> None:
        nonlocal fetched
        pending.update(got)
        fetched += got
        if pending and (last or sum(len(data) for data in pending.values()) >= _PACK_FLUSH_BYTES):
            await asyncio.to_thread(repo.add_objects, dict(pending))
            pending.clear()

    while level:
        local = await asyncio.to_thread(repo.read, level)
        missing = [oid for oid in level if oid not in local]
        for start in range(0, len(missing), _FETCH_BATCH):
            got = await sink.get_objects(missing[start : start + _FETCH_BATCH])
            await keep(got)
            for oid, data in got.items():
                raw = zlib.decompress(data)
                local[oid] = ("tree", raw.partition(b"\0")[2])
        if lacking := [oid for oid in level if oid not in local]:
            raise WorkspaceTreeError(f"the sink does not hold tree {lacking[0]} (of workspace tree {tree})")
        level = []
        for oid in sorted(set(local)):
            for mode, child in _tree_entries(local[oid][1]):
                if mode == b"40000":
                    level.append(child)
                elif mode != b"160000":  # a submodule's commit is not in the workspace's objects
                    files.add(child)
    if blobs:
        wanted = sorted(files)
        held = await asyncio.to_thread(repo.has, wanted)
        missing = [oid for oid in wanted if oid not in held]
        for start in range(0, len(missing), _FETCH_BATCH):
            batch = missing[start : start + _FETCH_BATCH]
            got = await sink.get_objects(batch)
            if lacking := [oid for oid in batch if oid not in got]:
                raise WorkspaceTreeError(
                    f"the sink does not hold object {lacking[0]} (of workspace tree {tree})"
                )
            await keep(got)
    await keep({}, last=True)
    return fetched


async def restore_tree(repo: ShadowRepo, tree: str, sink: ObjectSink) -> None:
    """Make ``repo``'s workspace hold the files of ``tree``, read from ``sink`` as needed
    (``ShadowRepo.checkout`` says which files change)."""
    await fetch_tree(repo, tree, sink)
    await asyncio.to_thread(repo.checkout, tree)
