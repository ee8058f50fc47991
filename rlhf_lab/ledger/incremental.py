"""Recording one run in work proportional to that run: ``ledger.json`` spliced, not re-validated,
and the markdown re-assembled from kept per-run pieces (:mod:`rlhf_lab.ledger.blocks`). Torch-free.

``ledger.json`` is written by pydantic with a one-space indent, so each run's record is a run of
lines between ``  {`` and ``  }`` inside ``"runs"`` (a JSON string never holds a raw newline).
Recording replaces (or appends) that run's lines with the new record dumped the same way, so
the file is byte for byte what a full dump of the whole campaign would be; the other records
are neither parsed nor validated. The pieces of each run are kept in the run index, keyed by
the campaign, the run and a hash of the record's lines: a record changed by any other path gets
a new hash and its pieces are rendered again from it. Whenever something does not fit (no
ledger.json yet, no runs, a chain of runs whose stages read every record, a file that does not
split as expected), the caller takes the full path, which validates everything and refreshes
the kept pieces.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from rlhf_lab.ledger.blocks import PIECES_VERSION, BlockInput, campaign_of, run_pieces
from rlhf_lab.ledger.schema import AnswerEntry, ComparisonEntry, RunRecord, _CampaignMeta

__all__ = [
    "LedgerText",
    "block_input",
    "keep_pieces",
    "parse_record",
    "piece_key",
    "pieces_for",
    "record_lines",
    "split_ledger",
]

_RUNS_OPEN = '\n "runs": [\n'
_RUNS_CLOSE = '\n ],\n "comparisons": '
_ITEM_SEP = "\n  },\n  {\n"
_RUN_ID = re.compile(r'^  \{\n   "run_id": "((?:[^"\\]|\\.)*)"')


@dataclass
class LedgerText:
    """``ledger.json`` cut into the text before the runs, each run's record (``  {`` ... ``  }``)
    and the text after."""

    head: str
    records: list[str]
    tail: str

    def text(self) -> str:
        return self.head + ",\n".join(self.records) + self.tail

    def run_ids(self) -> list[str]:
        out = []
        for rec in self.records:
            match = _RUN_ID.match(rec)
            found = match.group(1) if match else ""
            out.append(json.loads(f'"{found}"') if "\\" in found else found)
        return out

    def meta(self) -> _CampaignMeta:
        cut = self.head[: -len(_RUNS_OPEN)].removesuffix(",")
        return _CampaignMeta.model_validate(json.loads(cut + "\n}")["campaign"])

    def comparisons(self) -> list[ComparisonEntry]:
        data = json.loads("{" + self.tail[len("\n ],") :])
        return [ComparisonEntry.model_validate(c) for c in data["comparisons"]]

    def answer(self) -> AnswerEntry | None:
        data = json.loads("{" + self.tail[len("\n ],") :])
        found = data.get("answer")
        return AnswerEntry.model_validate(found) if found else None


def split_ledger(text: str) -> LedgerText | None:
    """The parts of a ledger.json written by the lab; None when it does not have that shape
    (no runs yet, or written some other way): the caller then reads it whole."""
    start = text.find(_RUNS_OPEN)
    end = text.find(_RUNS_CLOSE, start)
    if start < 0 or end < 0 or not text.startswith('{\n "version": '):
        return None
    region = text[start + len(_RUNS_OPEN) : end]
    if not region.startswith("  {\n") or not region.endswith("\n  }"):
        return None
    items = region[len("  {\n") : -len("\n  }")].split(_ITEM_SEP)
    records = ["  {\n" + item + "\n  }" for item in items]
    return LedgerText(head=text[: start + len(_RUNS_OPEN)], records=records, tail=text[end:])


def record_lines(record: RunRecord) -> str:
    """A record as it sits in ledger.json's runs list."""
    return "\n".join("  " + line for line in record.model_dump_json(indent=1).split("\n"))


def parse_record(lines: str) -> RunRecord:
    return RunRecord.model_validate_json(lines)


def piece_key(campaign: str, lines: str) -> str:
    digest = hashlib.blake2b(lines.encode(), digest_size=16)
    digest.update(f"\0{campaign}\0{PIECES_VERSION}".encode())
    return digest.hexdigest()


# The decoded pieces of the campaign recorded last, by piece key, kept in a long-lived process
# (the MCP server, a script recording run after run): recording the next run decodes only what
# changed. A key hashes the record's lines, so an entry never stands for another record; only
# pieces decoded from their JSON are kept (what a fresh process would use), and rendering only
# reads them.
_DECODED: dict[str, Any] = {"campaign": None, "pieces": {}}


def _decoded(campaign: str) -> dict[str, dict[str, Any]]:
    if _DECODED["campaign"] != campaign:
        _DECODED.update(campaign=campaign, pieces={})
    return _DECODED["pieces"]


def pieces_for(
    conn: sqlite3.Connection, campaign: str, ledger: LedgerText, fresh: dict[str, dict]
) -> tuple[list[dict[str, Any]], list[tuple[str, str, str, str]]]:
    """Each run's pieces in ledger order: ``fresh`` ones (run id -> pieces rendered now), kept
    ones whose record lines are unchanged, and the rest rendered from their lines. Also the
    rows to keep (campaign, run id, key, pieces JSON) for the pieces rendered here."""
    decoded = _decoded(campaign)
    kept = dict(
        conn.execute("SELECT run_id, key FROM ledger_pieces WHERE campaign = ?", (campaign,))
    )
    keys = [piece_key(campaign, lines) for lines in ledger.records]
    ids = ledger.run_ids()
    wanted = [
        run_id
        for run_id, key in zip(ids, keys, strict=True)
        if run_id not in fresh and kept.get(run_id) == key and key not in decoded
    ]
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ",".join("?" * len(chunk))
        query = f"SELECT key, data FROM ledger_pieces WHERE campaign = ? AND run_id IN ({marks})"
        for key, data in conn.execute(query, [campaign, *chunk]):
            decoded[key] = json.loads(data)
    out, new_rows = [], []
    for run_id, lines, key in zip(ids, ledger.records, keys, strict=True):
        if run_id in fresh:
            pieces = fresh[run_id]
        elif kept.get(run_id) == key and key in decoded:
            out.append(decoded[key])
            continue
        else:
            pieces = run_pieces(parse_record(lines), campaign)
        out.append(pieces)
        new_rows.append((campaign, run_id, key, json.dumps(pieces)))
    for gone in set(decoded) - set(keys):  # records replaced since: their pieces go
        del decoded[gone]
    return out, new_rows


def keep_pieces(
    conn: sqlite3.Connection, campaign: str, rows: list[tuple[str, str, str, str]], ids: list[str]
) -> None:
    """Store ``rows`` and forget the pieces of runs no longer in the campaign."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany("INSERT OR REPLACE INTO ledger_pieces VALUES (?, ?, ?, ?)", rows)
        if ids:
            stored = {
                r
                for (r,) in conn.execute(
                    "SELECT run_id FROM ledger_pieces WHERE campaign = ?", (campaign,)
                )
            }
            gone = stored - set(ids)
            conn.executemany(
                "DELETE FROM ledger_pieces WHERE campaign = ? AND run_id = ?",
                [(campaign, r) for r in gone],
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def block_input(ledger: LedgerText, pieces: list[dict[str, Any]]) -> BlockInput | None:
    """The blocks' input from the spliced file (None when a run takes part in a chain of runs:
    the stages table reads every record, so the full path renders it)."""
    if any(p["brief"]["lineage"] for p in pieces):
        return None
    meta = ledger.meta()
    return BlockInput(
        campaign=campaign_of(meta, pieces),
        meta=meta,
        pieces=pieces,
        comparisons=ledger.comparisons(),
        stages=[],
        answer=ledger.answer(),
    )
