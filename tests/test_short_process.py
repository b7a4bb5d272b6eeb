"""The one runner of a short bounded subprocess (dispatch check, preflight, account probe)
and the one bounded reader of a request body."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from herder.api.body import declared_over, read_within
from herder.runtime.short_process import run_within

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_a_short_process_says_its_exit_and_output():
    ended = run_within([sys.executable, "-c", "import sys; print('out'); "
                        "print('err', file=sys.stderr); sys.exit(3)"], 30, ENV, 0o077)
    assert ended is not None
    assert (ended.returncode, ended.stdout.strip(), ended.stderr.strip()) == (3, b"out", b"err")


def test_a_discarded_stream_comes_back_empty():
    ended = run_within([sys.executable, "-c", "print('out')"], 30, ENV, 0o077, stdout=False)
    assert ended is not None and ended.stdout == b""


def test_a_process_past_its_time_gives_no_answer_and_is_killed():
    started = time.monotonic()
    assert run_within([sys.executable, "-c", "import time; time.sleep(60)"], 0.5, ENV,
                      0o077) is None
    assert time.monotonic() - started < 30


def test_a_program_that_cannot_start_raises_oserror():
    with pytest.raises(OSError):
        run_within(["/nonexistent/program"], 5, ENV, 0o077)


async def chunks(*parts: bytes):
    for part in parts:
        yield part


@pytest.mark.parametrize(("parts", "limit", "expected"), [
    ((b"ab", b"cd"), 4, b"abcd"),
    ((b"ab", b"cd"), 3, None),
    ((), 0, b""),
])
def test_a_body_is_read_up_to_its_limit(parts, limit, expected):
    assert asyncio.run(read_within(chunks(*parts), limit)) == expected


@pytest.mark.parametrize(("declared", "over"), [
    (None, False), ("10", False), (b"11", True), ("11", True), ("x", False),
])
def test_a_declared_length_is_judged_against_the_limit(declared, over):
    assert declared_over(declared, 10) is over
