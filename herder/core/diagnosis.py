"""`herder doctor`'s results: one finding per check (ok, warning or problem, with the fix),
one line each, and the exit code they add up to. Pure: the checks themselves, which read
files, run programs and open connections, are herder.services.doctor's."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence

import msgspec


class Verdict(enum.StrEnum):
    OK = "ok"
    WARNING = "warning"
    """Works, but not as well as it could (the watchdog instead of a cgroup, say)."""
    PROBLEM = "problem"
    """Jobs fail, or never start, until it is fixed."""


class Finding(msgspec.Struct, frozen=True):
    """What one check found. `fix` is empty when there is nothing to do."""

    name: str
    verdict: Verdict
    detail: str
    fix: str = ""


def ok(name: str, detail: str) -> Finding:
    return Finding(name, Verdict.OK, detail)


def warning(name: str, detail: str, fix: str) -> Finding:
    return Finding(name, Verdict.WARNING, detail, fix)


def problem(name: str, detail: str, fix: str) -> Finding:
    return Finding(name, Verdict.PROBLEM, detail, fix)


VERDICT_WIDTH = max(len(verdict.value) for verdict in Verdict)


def line(finding: Finding) -> str:
    """`problem  store: ... (fix: ...)`: the verdicts padded so the names line up; the
    detail and the fix on one line whatever they held."""
    detail = " ".join(finding.detail.split())
    text = f"{finding.verdict.value:<{VERDICT_WIDTH}}  {finding.name}: {detail}"
    fix = " ".join(finding.fix.split())
    return f"{text} (fix: {fix})" if fix else text


def exit_code(findings: Iterable[Finding]) -> int:
    """0 when nothing is a problem (warnings included), 1 otherwise."""
    return 1 if any(finding.verdict is Verdict.PROBLEM for finding in findings) else 0


def summary(findings: Sequence[Finding]) -> str:
    """`3 ok, 1 warning, 0 problems`."""
    counts = {verdict: sum(1 for finding in findings if finding.verdict is verdict)
              for verdict in Verdict}
    return (f"{counts[Verdict.OK]} ok, {counts[Verdict.WARNING]} warning(s), "
            f"{counts[Verdict.PROBLEM]} problem(s)")


def as_json(findings: Sequence[Finding]) -> dict[str, object]:
    """What `--json` prints: the findings in order, and the exit code they make."""
    return {"checks": [msgspec.to_builtins(finding) for finding in findings],
            "exit": exit_code(findings)}


def timed_out(name: str, seconds: float) -> Finding:
    """A check that did not answer within its time: a problem, never a wait."""
    return problem(name, f"no answer within {seconds:g}s (the check was cut)",
                   "find what hangs: the database, the network, or a program it runs")
