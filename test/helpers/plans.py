"""Plans as the engine prepares them."""

from __future__ import annotations


def keep_parent_states(plan):
    """Every parent segment keeps its state in a slot (the engine's rule), the
    others none; returns ``plan``."""
    parents = {seg.parent for seg in plan.tree.segments if seg.parent >= 0}
    plan.assign_slots([s if s in parents else -1 for s in range(plan.num_segments)])
    return plan
