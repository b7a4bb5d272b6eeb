"""The environment a `herder` subprocess of a test runs with.

Nothing herder reads from the developer's shell (database, config, tokens, server, an
attempt marker of a job this test runs inside) may leak into the processes a test starts.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from herder.runtime.process import TOKEN_VARIABLE

SCRUBBED = ("HERDER_DB", "HERDER_CONFIG", "HERDER_API_TOKEN", "HERDER_AGENT_TOKEN",
            "HERDER_SERVER", "HERDER_TOKEN", "HERDER_TOKEN_FILE", "HERDER_CA", TOKEN_VARIABLE)


def clean_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without `SCRUBBED`, unbuffered (a log line a test waits
    for must not sit in a buffer), plus `extra`."""
    environment = {name: value for name, value in os.environ.items() if name not in SCRUBBED}
    environment["PYTHONUNBUFFERED"] = "1"
    environment.update(extra or {})
    return environment
