"""Reading the run index: a page of the run list (filters, order, limit and offset applied in
SQL), the ids of unfinished runs, and the query tool: filters and sorting on indexed fields and
final metric values, and "the best run per group". Torch-free.

Every reader first brings the index up to date (:mod:`rlhf_lab.index.sync`): the cheap check on
every run, the full check on the rows it returns (for a query that filters, sorts or groups by
a value not taken from run.json, on every row its run.json conditions leave).
"""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from rlhf_lab.errors import InvalidArgument, NextStep
from rlhf_lab.index.hook import indexing, serve_unfinished
from rlhf_lab.index.store import drop_index, with_index
from rlhf_lab.index.sync import refresh_rows, sync_runs

__all__ = [
    "QUERY_FIELDS",
    "IndexPage",
    "QueryOutcome",
    "page_runs",
    "query_index",
    "rebuild_index",
    "unfinished_run_ids",
    "unfinished_run_rows",
]

# the fields of a run a query may filter, sort or group on (metrics are named as logged)
TEXT_FIELDS = (
    "id",
    "campaign",
    "slug",
    "family",
    "algorithm",
    "state",
    "model",
    "device",
    "outcome",
    "headline",
    "wandb_url",
)
TIME_FIELDS = ("created_at", "started_at", "ended_at")
NUMBER_FIELDS = ("seed", "step", "total_steps", "final", "best")
QUERY_FIELDS = (*TEXT_FIELDS, *TIME_FIELDS, *NUMBER_FIELDS)
# the fields a row takes from run.json, which the cheap check of every use keeps true
# (rlhf_lab.index.sync): a query that filters, sorts and groups on these alone gives the full
# check only to the rows it returns, as a page of the run list does
RECORD_FIELDS = ("id", "campaign", "slug", "family", "algorithm", "state", "created_at")
_ROW_FIELDS = (
    "id",
    "campaign",
    "family",
    "algorithm",
    "state",
    "model",
    "seed",
    "created_at",
    "ended_at",
    "step",
    "total_steps",
    "headline",
    "higher_is_better",
    "final",
    "final_step",
    "best",
    "best_step",
    "wandb_url",
)
_SELECT = ", ".join(f"r.{f}" for f in _ROW_FIELDS)
_UNFINISHED = ("queued", "starting", "running")


def _locked_sync(conn: sqlite3.Connection, warnings: list[str]) -> None:
    with indexing():
        sync_runs(conn, warnings)


def _refresh(conn: sqlite3.Connection, ids: list[str], warnings: list[str]) -> None:
    with indexing():
        refresh_rows(conn, ids, warnings)


def _rows(conn: sqlite3.Connection, ids: list[str]) -> list[dict[str, Any]]:
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    found = {
        row[0]: dict(zip(_ROW_FIELDS, row, strict=True))
        for row in conn.execute(f"SELECT {_SELECT} FROM runs r WHERE r.id IN ({marks})", ids)
    }
    return [found[i] for i in ids if i in found]


# ------------------------------------------------------------------------------------- pages


@dataclass
class IndexPage:
    rows: list[dict[str, Any]]  # oldest first
    total: int
    warnings: list[str]


def _list_filter(
    campaign: str | None, state: str | None, family: str | None, algorithm: str | None
) -> tuple[str, list[Any]]:
    clauses, args = [], []
    if campaign is not None:
        clauses.append("(r.campaign = ? OR r.slug = ?)")
        args += [campaign, campaign]
    for name, value in (("state", state), ("family", family), ("algorithm", algorithm)):
        if value is not None:
            clauses.append(f"r.{name} = ?")
            args.append(value)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", args


def page_runs(
    campaign: str | None = None,
    state: str | None = None,
    family: str | None = None,
    algorithm: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> IndexPage:
    """The newest ``limit`` matching runs after skipping the newest ``offset`` (shown oldest
    first) and how many match: filter, order and cut in one SQL query."""
    warnings: list[str] = []
    where, args = _list_filter(campaign, state, family, algorithm)

    def work(conn: sqlite3.Connection) -> IndexPage:
        _locked_sync(conn, warnings)
        total = conn.execute(f"SELECT COUNT(*) FROM runs r{where}", args).fetchone()[0]
        ids = [
            r[0]
            for r in conn.execute(
                f"SELECT r.id FROM runs r{where} ORDER BY r.created_at DESC, r.id DESC "
                "LIMIT ? OFFSET ?",
                [*args, limit, offset],
            )
        ]
        _refresh(conn, ids, warnings)
        return IndexPage(rows=_rows(conn, ids[::-1]), total=total, warnings=warnings)

    return with_index(work, warnings)


def unfinished_run_ids() -> tuple[list[str], list[str]]:
    """Ids of the queued, starting and running runs, oldest first, and the index's warnings."""
    warnings: list[str] = []

    def work(conn: sqlite3.Connection) -> list[str]:
        _locked_sync(conn, warnings)
        return [
            r[0]
            for r in conn.execute(
                "SELECT id FROM runs WHERE state IN (?, ?, ?) ORDER BY created_at, id",
                _UNFINISHED,
            )
        ]

    return with_index(work, warnings), warnings


def unfinished_run_rows() -> tuple[list[tuple[str, str, str]], list[str]]:
    """(id, campaign, state) of the queued, starting and running runs, oldest first, and the
    index's warnings."""
    warnings: list[str] = []

    def work(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
        _locked_sync(conn, warnings)
        query = (
            "SELECT id, campaign, state FROM runs WHERE state IN (?, ?, ?) ORDER BY created_at, id"
        )
        return [tuple(r) for r in conn.execute(query, _UNFINISHED)]

    return with_index(work, warnings), warnings


serve_unfinished(lambda: unfinished_run_rows()[0])  # for the run modules (rlhf_lab.index.hook)


def rebuild_index() -> tuple[int, list[str]]:
    """Drop the index and build it again from every run folder; (runs indexed, warnings)."""
    drop_index()
    warnings: list[str] = []

    def work(conn: sqlite3.Connection) -> int:
        _locked_sync(conn, warnings)
        return conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]

    count = with_index(work, warnings)
    return count, [w for w in warnings if not w.startswith("the run index was built")]


# ------------------------------------------------------------------------------------- query

_CONDITION = re.compile(r"^\s*([A-Za-z0-9_./:-]+?)\s*(>=|<=|!=|=|>|<|~)\s*(.*?)\s*$")
_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)([dhm])$")
_METRIC_NAME = re.compile(r"^[A-Za-z0-9_./:-]+$")


@dataclass
class QueryOutcome:
    rows: list[dict[str, Any]]
    total: int  # matching runs (groups, when grouped) before the limit
    metrics: list[str]  # metric columns each row carries
    warnings: list[str]


def _fields_text() -> str:
    return ", ".join(QUERY_FIELDS)


def _bad(message: str, argument: str) -> InvalidArgument:
    return InvalidArgument(
        f"{argument}: {message}. Fields: {_fields_text()}; or a metric as logged, e.g. "
        "eval/accuracy or loss (final values)",
        next=NextStep("query_runs", {"where": ["state=died", "ended_at>=-7d"]}),
    )


def _time_value(text: str, argument: str) -> str:
    match = _RELATIVE.fullmatch(text)
    if match:
        amount, unit = float(match.group(1)), match.group(2)
        delta = {"d": dt.timedelta(days=amount), "h": dt.timedelta(hours=amount)}.get(
            unit, dt.timedelta(minutes=amount)
        )
        return (dt.datetime.now(dt.UTC) - delta).isoformat(timespec="milliseconds")
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise _bad(
            f"{text!r} is not a time: use an ISO date or time (2026-11-19, "
            "2026-11-19T08:00) or an age such as -7d, -12h, -30m",
            argument,
        ) from None
    if when.tzinfo is None and "T" not in text and " " not in text:
        return text  # a bare date compares as a prefix of the stored ISO times
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.astimezone(dt.UTC).isoformat(timespec="milliseconds")


class _Plan:
    """A query being turned into SQL: the metric joins it needs and its bound arguments."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.joins: dict[str, str] = {}
        self.args: list[Any] = []
        self.values_named: list[str] = []  # fields and metrics not from run.json
        self.record_filter: list[tuple[str, list[Any]]] = []  # conditions on run.json fields

    def column(self, name: str, argument: str) -> tuple[str, str]:
        """(SQL expression, kind: text / time / number) of a field or metric."""
        if name not in RECORD_FIELDS:
            self.values_named.append(name)
        if name in TEXT_FIELDS:
            return f"r.{name}", "text"
        if name in TIME_FIELDS:
            return f"r.{name}", "time"
        if name in NUMBER_FIELDS:
            return f"r.{name}", "number"
        if not _METRIC_NAME.fullmatch(name):
            raise _bad(f"unknown field {name!r}", argument)
        if name not in self.joins:
            known = self.conn.execute(
                "SELECT 1 FROM metrics WHERE name = ? LIMIT 1", (name,)
            ).fetchone()
            if known is None:
                raise _bad(
                    f"unknown field {name!r} (no indexed run logs a metric of that name)", argument
                )
            self.joins[name] = f"m{len(self.joins)}"
        return f"{self.joins[name]}.value", "number"

    def join_sql(self) -> tuple[str, list[Any]]:
        parts, args = [], []
        for name, alias in self.joins.items():
            parts.append(
                f" LEFT JOIN metrics {alias} ON {alias}.run_id = r.id AND {alias}.name = ?"
            )
            args.append(name)
        return "".join(parts), args

    def condition(self, text: str) -> str:
        """The SQL of one ``FIELD OP VALUE`` (its arguments appended to ``args``); one on a
        run.json field is kept in ``record_filter`` as well."""
        named, start = len(self.values_named), len(self.args)
        sql = self._condition(text)
        if len(self.values_named) == named:
            self.record_filter.append((sql, self.args[start:]))
        return sql

    def _condition(self, text: str) -> str:
        argument = f"where {text!r}"
        match = _CONDITION.fullmatch(text) if isinstance(text, str) else None
        if not match:
            raise _bad("expected FIELD OP VALUE with OP one of = != > >= < <= ~", argument)
        name, op, value = match.groups()
        expr, kind = self.column(name, argument)
        if op == "~":
            self.args.append(f"%{value}%")
            return f"{expr} LIKE ?"
        if op in ("=", "!=") and kind != "number":
            values = [v.strip() for v in value.split(",") if v.strip()]
            if kind == "time":
                values = [_time_value(v, argument) for v in values]
            self.args += values
            marks = ",".join("?" * len(values)) or "NULL"
            return f"{expr} {'NOT ' if op == '!=' else ''}IN ({marks})"
        if kind == "number":
            try:
                number = float(value)
            except ValueError:
                raise _bad(f"{value!r} is not a number", argument) from None
            self.args.append(number)
            return f"{expr} {'<>' if op == '!=' else op} ?"
        self.args.append(_time_value(value, argument) if kind == "time" else value)
        return f"{expr} {op} ?"

    def order(self, text: str, argument: str) -> tuple[str, str]:
        """(column name in the query's result, ASC or DESC) for ``field`` or ``-field``."""
        descending = text.startswith("-")
        name = text.lstrip("-")
        self.column(name, argument)
        return self.result_name(name), "DESC" if descending else "ASC"

    def result_name(self, name: str) -> str:
        return self.joins[name] if name in self.joins else name

    def metric_columns(self) -> str:
        return "".join(f", {alias}.value AS {alias}" for alias in self.joins.values())


def _best_order(plan: _Plan, best: str) -> str:
    """ORDER BY text that puts the best value of ``best`` first (``max:``/``min:`` to say
    which way; by default the metric's good direction from the specs, per run for the
    headline's final and best values)."""
    argument = f"best {best!r}"
    direction, name = ("", best)
    if best.startswith(("max:", "min:")):
        direction, name = best[:3], best[4:]
    expr, kind = plan.column(name, argument)
    if kind != "number":
        raise _bad(f"{name!r} is not a number, so it has no best value", argument)
    if not direction and name in ("final", "best"):
        return f"({expr} IS NULL), CASE WHEN r.higher_is_better = 0 THEN {expr} ELSE -{expr} END"
    if not direction:
        from rlhf_lab.planning.catalog import metric_direction

        direction = metric_direction(name) or "max"
    return f"({expr} IS NULL), {expr} {'DESC' if direction == 'max' else 'ASC'}"


def _candidates(conn: sqlite3.Connection, plan: _Plan) -> list[str]:
    """Ids of the rows that the query's conditions on run.json fields do not rule out."""
    clauses = [sql for sql, _ in plan.record_filter]
    args = [a for _, part in plan.record_filter for a in part]
    where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    return [r[0] for r in conn.execute(f"SELECT r.id FROM runs r{where}", args)]


def _query_source(
    plan: _Plan,
    clauses: list[str],
    order: tuple[str, str] | None,
    group: tuple[str, str] | None,
) -> tuple[str, str, list[Any]]:
    """(the query's rows as SQL, its ORDER BY, its arguments); ``group``: (the group_by
    expression, the ranking that picks each group's run)."""
    joins, join_args = plan.join_sql()
    args = [*join_args, *plan.args]
    filt = (" WHERE " + " AND ".join(clauses)) if clauses else ""
    inner = f"SELECT {_SELECT}{plan.metric_columns()}"
    if group is not None:
        expr, ranking = group
        inner += (
            f", ROW_NUMBER() OVER (PARTITION BY {expr} ORDER BY {ranking}, r.id) AS rank_in_"
            f"group, {expr} AS grp FROM runs r{joins}{filt}"
        )
        source = f"SELECT * FROM ({inner}) q WHERE q.rank_in_group = 1"
        default_order = "q.grp"
    else:
        source = f"SELECT * FROM ({inner} FROM runs r{joins}{filt}) q"
        default_order = "q.created_at DESC, q.id DESC"
    order_by = f"(q.{order[0]} IS NULL), q.{order[0]} {order[1]}, q.id" if order else default_order
    return source, order_by, args


def _query_rows(
    conn: sqlite3.Connection, sql: str, args: list[Any], plan: _Plan, grouped: bool
) -> list[dict[str, Any]]:
    rows = []
    metrics = list(plan.joins)
    for raw in conn.execute(sql, args):
        row = dict(zip(_ROW_FIELDS, raw, strict=False))
        row["metrics"] = dict(zip(metrics, raw[len(_ROW_FIELDS) :], strict=False))
        if grouped:
            row["group"] = raw[-1]
        rows.append(row)
    return rows


def query_index(
    where: list[str] | None = None,
    sort: str | None = None,
    group_by: str | None = None,
    best: str | None = None,
    limit: int = 50,
) -> QueryOutcome:
    """Runs matching every ``where`` condition, ordered by ``sort`` (``-field``: descending;
    default newest first); with ``group_by`` one row per value of that field: its best run by
    ``best`` (default the headline's best value, in its good direction).

    Values are read only once checked: when a condition, the order or the grouping names a
    field or metric that does not come from run.json, every row the run.json conditions leave
    gets the full check first (a stat per file); otherwise only the rows returned do, as in a
    page of the run list (no filter: the newest ``limit`` runs, whatever the lab's size)."""
    warnings: list[str] = []

    def work(conn: sqlite3.Connection) -> QueryOutcome:
        _locked_sync(conn, warnings)
        plan = _Plan(conn)
        clauses = [plan.condition(c) for c in where or []]
        order = plan.order(sort, f"sort {sort!r}") if sort else None
        group = None
        if group_by:
            expr = plan.column(group_by, f"group_by {group_by!r}")[0]
            group = (expr, _best_order(plan, best or "best"))
        if plan.values_named:
            _refresh(conn, _candidates(conn, plan), warnings)
        source, order_by, args = _query_source(plan, clauses, order, group)
        total = conn.execute(f"SELECT COUNT(*) FROM ({source})", args).fetchone()[0]
        select = f"{source} ORDER BY {order_by} LIMIT ?"
        rows = _query_rows(conn, select, [*args, limit], plan, group is not None)
        if not plan.values_named:
            changes = conn.total_changes
            _refresh(conn, [r["id"] for r in rows], warnings)
            if conn.total_changes != changes:  # a row was read again: its values anew
                rows = _query_rows(conn, select, [*args, limit], plan, group is not None)
        return QueryOutcome(rows=rows, total=total, metrics=list(plan.joins), warnings=warnings)

    return with_index(work, warnings)
