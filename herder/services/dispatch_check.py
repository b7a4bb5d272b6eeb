"""`herder should-dispatch KEY --type T`: a job type's own check (a dedup guard the key alone
cannot be, e.g. "a merged pull request already closes this issue"), run after the dedup key is
found free.

The command is `[job_types.T] dispatch_check` from herder.toml, run as an argv (never a
shell line built from values): the caller's key and payload reach it only as environment
variables (`HERDER_DEDUP_KEY`, `HERDER_JOB_TYPE`, `HERDER_PAYLOAD_<FIELD>`), so a value such
as `--force` or `$(rm -rf ~)` stays data. Its contract: exit 0 dispatch; exit 10 skip, its
first non-empty stdout line the reason; anything else (another exit, a signal, no answer
within `dispatch_check_timeout`, a program that cannot start) is an error, `should-dispatch`
exit 2, the exit every herder command uses for an error of the network or the config.

Light on purpose: `should-dispatch` runs in dispatcher loops (no pydantic, no store).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from herder.core.errors import HerderError, InputError
from herder.runtime.hardening import PRIVATE_UMASK
from herder.runtime.short_process import run_within

EXIT_DISPATCH = 0
EXIT_SKIP = 10
REASON_CHARS = 300
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
VALUE_CHARS = 4096
"""The longest payload value passed to a check (an environment variable, not a document)."""


class DispatchCheckFailed(HerderError):
    """The check neither said dispatch nor skip: should-dispatch exits 2."""


def check_payload(payload: Mapping[str, str], where: str = "-p") -> dict[str, str]:
    """Field names that can be variable names, values that can be variable values."""
    checked: dict[str, str] = {}
    variables: dict[str, str] = {}
    for name, value in payload.items():
        if not FIELD_NAME.fullmatch(name):  # fullmatch: `$` would let "a\n" through
            raise InputError(where, f"{name!r} cannot become HERDER_PAYLOAD_{name.upper()}",
                             "use letters, digits and _ in field names")
        other = variables.setdefault(name.upper(), name)
        if other != name:
            raise InputError(where, f"{other!r} and {name!r} both become "
                             f"HERDER_PAYLOAD_{name.upper()}", "pass the field once")
        if "\x00" in value or len(value) > VALUE_CHARS:
            raise InputError(f"{where} {name}", f"holds a NUL byte or is over {VALUE_CHARS} "
                             "characters", "pass a shorter text value")
        checked[name] = value
    return checked


def check_environment(base: Mapping[str, str], job_type: str, dedup_key: str,
                      payload: Mapping[str, str]) -> dict[str, str]:
    """`base` (the host's, without herder's secrets) with the values the check is about."""
    values = {f"HERDER_PAYLOAD_{name.upper()}": value for name, value in payload.items()}
    return {**base, **values, "HERDER_JOB_TYPE": job_type, "HERDER_DEDUP_KEY": dedup_key}


def run_dispatch_check(argv: Sequence[str], timeout: float, environment: Mapping[str, str],
                       where: str, cwd: str | None = None) -> str | None:
    """Run the check in a session of its own (its whole group killed at the timeout);
    the skip reason, None to dispatch, DispatchCheckFailed otherwise."""
    try:
        ended = run_within(argv, timeout, environment, PRIVATE_UMASK, cwd=cwd)
    except OSError as exc:
        raise DispatchCheckFailed(f"{where}: {argv[0]} cannot start: "
                                  f"{exc.strerror or exc}") from None
    if ended is None:
        raise DispatchCheckFailed(f"{where}: no answer within {timeout:g}s")
    code, stdout, stderr = ended
    if code == EXIT_DISPATCH:
        return None
    if code == EXIT_SKIP:
        return first_line(stdout) or "the dispatch check said skip"
    said = last_line(stderr)
    how = f"killed by signal {-code}" if code < 0 else f"exit {code}"
    raise DispatchCheckFailed(f"{where}: {how}{f': {said}' if said else ''} (0 is "
                              "dispatch, 10 skip)")


def first_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    return next((line for line in lines if line), "")[:REASON_CHARS]


def last_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "")[:REASON_CHARS]
