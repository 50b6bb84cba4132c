"""``vr.Flow``: a parent job and the children it waits on (``queue.enqueue_flow``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Flow:
    """A job that waits on its children, as ``queue.enqueue_flow`` returns it.

    Pass a ``Flow`` as a child of another ``enqueue_flow`` to make a tree: the
    new parent then waits on this flow's parent (which itself waits on its
    children), so it runs after the whole subtree.

    Attributes:
        parent_id: The id of the waiting job.
        children_ids: The ids it waits on, in the order the children were given.
    """

    parent_id: str
    children_ids: tuple[str, ...]
