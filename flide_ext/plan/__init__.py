"""A round's data model: the prefix tree of each request's prompts over token
ids (:mod:`.tree`) and the flat stream they are laid out in (:mod:`.flat`)."""

from .flat import FlatPlan, Resume, plan_round
from .tree import MAX_TREE_DEPTH, PrefixTree, Segment, build_prefix_tree

__all__ = ["FlatPlan", "MAX_TREE_DEPTH", "PrefixTree", "Resume", "Segment", "build_prefix_tree", "plan_round"]
