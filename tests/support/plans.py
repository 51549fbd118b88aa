"""EXPLAIN plans read as if the job table were one table (schema/0029 partitions it by id).

A statement over `job` plans one scan per partition under an Append or a Merge Append; the
plan tests ask which index a statement walks and how much it reads, not how many partitions a
fresh database has. `unpartitioned` names each partition `job` and each of its indexes by the
job table's index it belongs to (a partition's indexes are named `<partition>_<suffix>` after
`job_<suffix>`), and folds an Append whose scans are alike (one node type, one index) into one
scan of `job`, with their row and buffer counts summed (where they walk different indexes, each
partition by its own statistics, the scan of the one expected to hold the most rows stands
for them). Where some partitions' scans walk an
index and others read the heap, the heap reads are of partitions the planner knows to be
empty or tiny (a fresh database's default partition and tomorrow's: it reads the heap where
that is cheapest): they are left out, and the rest folded. Scans that are still not alike are
kept as they are, under their Append.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

Plan = dict[str, object]

_PARTITION = re.compile(r"^job_(?:legacy|default|p\d{8}t\d{6})(?:_(?P<suffix>.+))?$")
_SUMMED = (
    "Plan Rows",
    "Actual Rows",
    "Rows Removed by Filter",
    "Rows Removed by Index Recheck",
    "Heap Fetches",
    "Shared Hit Blocks",
    "Shared Read Blocks",
    "Shared Dirtied Blocks",
    "Shared Written Blocks",
)


def _job_name(name: object) -> object:
    m = _PARTITION.match(name) if isinstance(name, str) else None
    if m is None:
        return name
    return "job" if m["suffix"] is None else f"job_{m['suffix']}"


def unpartitioned(plan: Plan) -> Plan:
    """`plan` (a node of EXPLAIN's JSON) with job's partitions folded into one scan of job."""
    node = dict(plan)
    for key in ("Relation Name", "Index Name", "Alias"):
        if key in node:
            node[key] = _job_name(node[key])
    children = node.get("Plans")
    if isinstance(children, list):
        node["Plans"] = [unpartitioned(c) for c in children if isinstance(c, dict)]
        folded = _fold(node)
        if folded is not None:
            return folded
    return node


def _fold(node: Plan) -> Plan | None:
    listed = node["Plans"]
    assert isinstance(listed, list)
    children: list[Plan] = [c for c in listed if isinstance(c, dict)]
    if node.get("Node Type") not in ("Append", "Merge Append") or not children:
        return None
    walks = [c for c in children if c.get("Node Type") != "Seq Scan"]
    if walks and all(c.get("Relation Name") == "job" for c in children):
        children = walks
    shape = {(c.get("Node Type"), c.get("Relation Name")) for c in children}
    if len(shape) != 1 or next(iter(shape))[1] != "job":
        return None
    # where the partitions walk different indexes (each by its own statistics), the scan of
    # the partition the planner expects the most rows from stands for them
    biggest: Plan = max(children, key=lambda c: float(str(c.get("Plan Rows", 0))))
    one: Plan = dict(biggest)
    for key in _SUMMED:
        values = [v for c in children if isinstance(v := c.get(key), int | float)]
        if values:
            one[key] = sum(values)
    return one


def nodes(plan: Plan) -> Iterator[Plan]:
    """Every node of `plan`, unpartitioned, the plan first."""
    yield from _walk(unpartitioned(plan))


def _walk(plan: Plan) -> Iterator[Plan]:
    yield plan
    children = plan.get("Plans", [])
    assert isinstance(children, list)
    for child in children:
        assert isinstance(child, dict)
        yield from _walk(child)
