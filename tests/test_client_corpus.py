"""The classifier over what real agent CLIs print when their API refuses them.

The fixtures are the clients' own output (tests/fixtures/clients, recorded against local
stand-ins of their APIs by record.py, or taken from the program's own strings and its users'
reports where it could not be run); the manifest (README.md there) says per fixture what
the log must classify as, what herder must decide for the attempt, and when a usage limit
it reports resets. The CLIs are not needed here: only the checked-in files are read.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import NamedTuple

import pytest

from herder.core.model import Outcome
from herder.core.scheduling.classification import (
    SEED_EXIT_CODES,
    SUCCESS_LOG_OUTCOMES,
    classify,
    verdict,
)
from herder.runtime.attempt_files import read_ending

FIXTURES = Path(__file__).parent / "fixtures" / "clients"
MANIFEST = FIXTURES / "README.md"
NOT_FIXTURES = {"README.md", "record.py"}
RESET_SLACK = timedelta(minutes=1)
"""A printed reset is rounded to the minute; the stand-in's was exact to the second."""


class Row(NamedTuple):
    fixture: str
    client: str
    provenance: str
    exit_code: int
    log_says: Outcome | None
    verdict: Outcome
    recorded_at: datetime
    resets_at: datetime | None


def _outcome(cell: str) -> Outcome | None:
    return None if cell == "nothing" else Outcome(cell)


def manifest() -> list[Row]:
    """Every table row of the manifest whose first cell names a fixture."""
    rows = []
    for line in MANIFEST.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not (line.startswith("| `") and len(cells) == 10):
            continue
        fixture, client, provenance, _, _, exit_code, says, decided, at, resets = cells
        rows.append(Row(fixture.strip("`"), client, provenance, int(exit_code),
                        _outcome(says), Outcome(decided), datetime.fromisoformat(at),
                        datetime.fromisoformat(resets) if resets else None))
    return rows


ROWS = manifest()


def test_every_fixture_has_one_manifest_row_and_every_row_a_fixture() -> None:
    files = sorted(str(path.relative_to(FIXTURES)) for path in FIXTURES.rglob("*")
                   if path.is_file() and path.name not in NOT_FIXTURES)
    named = [row.fixture for row in ROWS]
    assert len(named) == len(set(named)), "a fixture has two manifest rows"
    assert sorted(named) == files


def test_the_corpus_covers_every_client_and_case() -> None:
    clients = {row.fixture.split("/")[0] for row in ROWS}
    assert {"claude", "codex", "gemini", "aider-openai", "aider-anthropic"} <= clients
    said = {row.log_says for row in ROWS}
    assert {Outcome.TRANSIENT, Outcome.USAGE_BLOCKED, Outcome.AUTH_REVOKED,
            Outcome.FAILED, None} <= said


@pytest.mark.parametrize("row", ROWS, ids=[row.fixture for row in ROWS])
def test_each_fixture_classifies_to_its_outcome(row: Row) -> None:
    # Read as herder reads an attempt's log: its last 16 KB, undecoded bytes replaced.
    tail, _ = read_ending(FIXTURES / row.fixture)
    found = classify(tail, row.recorded_at)
    assert found.outcome is row.log_says, found.evidence
    if row.log_says is not None:
        assert found.evidence and found.evidence in tail
    ended = Outcome.OK if row.exit_code == 0 else Outcome.FAILED
    decided = verdict(ended, row.exit_code, tail, row.recorded_at,
                      exit_codes=SEED_EXIT_CODES)
    assert decided.outcome is row.verdict
    if row.verdict is Outcome.USAGE_BLOCKED:
        if row.resets_at is None:
            assert decided.resume_at is None
        else:
            assert decided.resume_at is not None
            assert abs(decided.resume_at - row.resets_at) <= RESET_SLACK


def test_a_usage_limit_s_reset_is_read_from_every_form_the_corpus_has() -> None:
    with_reset = [row for row in ROWS if row.resets_at is not None]
    assert {row.fixture.split("/")[0] for row in with_reset} >= {"claude", "codex"}
    assert all(row.log_says is Outcome.USAGE_BLOCKED for row in with_reset)


AIDER = [row for row in ROWS if row.fixture.startswith("aider") and row.exit_code == 0]


@pytest.mark.parametrize("row", AIDER, ids=[row.fixture for row in AIDER])
def test_log_on_success_turns_aider_s_exit_0_after_a_quota_or_bad_key_into_its_outcome(
        row: Row) -> None:
    # aider ends 0 after an API error: with `log_on_success` its log's usage limit or revoked
    # key stands, while a 429 or 5xx it printed (and may have recovered from) does not.
    tail, _ = read_ending(FIXTURES / row.fixture)
    decided = verdict(Outcome.OK, 0, tail, row.recorded_at, exit_codes=SEED_EXIT_CODES,
                      log_on_success=True)
    expected = row.log_says if row.log_says in SUCCESS_LOG_OUTCOMES else Outcome.OK
    assert decided.outcome is expected
    if expected is not Outcome.OK:
        assert decided.source == "log" and decided.evidence


def test_the_aider_corpus_has_both_a_bad_key_and_a_quota_after_exit_0() -> None:
    said = {row.log_says for row in AIDER}
    assert {Outcome.AUTH_REVOKED, Outcome.USAGE_BLOCKED} <= said
    assert said - SUCCESS_LOG_OUTCOMES  # and something log_on_success leaves as done
