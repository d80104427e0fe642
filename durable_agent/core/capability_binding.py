"""What a run was allowed to use, pinned in its exports: the capability binding, and what differs
between a checkpoint's and this worker's (a resume is refused on a difference unless forced)."""

from __future__ import annotations

from durable_agent.core.models import InstructionFile, Sparse
from durable_agent.core.permissions import PermissionPolicy


class CapabilityBinding(Sparse):
    """What the model was allowed to use: the catalog generation and its digest.

    ``tools`` and ``permissions`` name what the digest covers, so that a
    refused resume can say what differs; the digest is what is compared.
    """

    catalog_generation: int = 0
    catalog_digest: str
    tools: tuple[str, ...] = ()
    permissions: PermissionPolicy | None = None
    # The project instruction files in the run's system prompt (the digest covers them). Left out
    # of the JSON when there are none: the binding of a run without them keeps its bytes.
    instruction_files: tuple[InstructionFile, ...] = ()

    left_out_at_default = ("instruction_files",)


def instruction_differences(checkpoint: CapabilityBinding, here: CapabilityBinding) -> list[str]:
    """The project instruction files read for the checkpoint's run and not here, or with
    other content; empty when the same files were read."""
    was = {f.path: f.digest for f in checkpoint.instruction_files}
    now = {f.path: f.digest for f in here.instruction_files}
    out = []
    gone = sorted(set(was) - set(now))
    new = sorted(set(now) - set(was))
    changed = sorted(p for p in set(was) & set(now) if was[p] != now[p])
    if gone:
        out.append(f"instruction files no longer read: {', '.join(gone)}")
    if new:
        out.append(f"instruction files read here only: {', '.join(new)}")
    if changed:
        out.append(f"instruction files changed since: {', '.join(changed)}")
    return out


def binding_differences(checkpoint: CapabilityBinding, here: CapabilityBinding) -> list[str]:
    """What differs between a checkpoint's binding and this worker's; empty when they match."""
    if checkpoint.catalog_digest == here.catalog_digest and (
        checkpoint.catalog_generation == here.catalog_generation
    ):
        return []
    out = []
    if checkpoint.catalog_generation != here.catalog_generation:
        out.append(f"catalog generation {checkpoint.catalog_generation} here is {here.catalog_generation}")
    gone = sorted(set(checkpoint.tools) - set(here.tools))
    new = sorted(set(here.tools) - set(checkpoint.tools))
    if gone:
        out.append(f"tools no longer offered: {', '.join(gone)}")
    if new:
        out.append(f"tools offered here only: {', '.join(new)}")
    before, after = checkpoint.permissions, here.permissions
    if before is not None and after is not None and before != after:
        for field in ("allow", "deny", "ask", "default"):
            was, now = getattr(before, field), getattr(after, field)
            if was != now:
                out.append(f"permissions.{field} was {was!r}, here {now!r}")
    instructions = instruction_differences(checkpoint, here)
    if not out and not instructions:
        out.append("the tool definitions differ (same tools, other descriptions or schemas)")
    return out + instructions
