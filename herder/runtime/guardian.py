"""What an agent's guardian tells the server when the agent dies.

The guardian (`herder.runtime.agent.start_guardian`) kills a dead agent's jobs; then this
reports the agent gone, so the server declares its attempts lost and keeps work off the
host at once instead of after the lease. Best effort: a few seconds of retries, then the
lease still applies. The token is sent, never logged.
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Callable

import httpx

from herder.backoff import Backoff

log = logging.getLogger("herder.guardian")

REPORT_BUDGET_SECONDS = 5.0
"""How long the guardian keeps trying; a supervisor restarting the agent must not wait."""


def report_gone(
    server: str,
    token: str,
    label: str,
    worker: str,
    ca: str | None = None,
    budget_seconds: float = REPORT_BUDGET_SECONDS,
    backoff: Backoff | None = None,
    transport: httpx.BaseTransport | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """POST /api/v1/agent/{label}/gone for the dead `worker`; True once the server took it.

    Network errors and 5xx are retried with jittered backoff within the budget; any other
    answer is final (a 4xx cannot improve by asking again)."""
    backoff = backoff or Backoff(base=0.2, cap=1.0)
    deadline = time.monotonic() + budget_seconds
    verify: bool | ssl.SSLContext = ssl.create_default_context(cafile=ca) if ca else True
    with httpx.Client(base_url=server.rstrip("/"), verify=verify, timeout=2.0,
                      transport=transport,
                      headers={"Authorization": f"Bearer {token}",
                               "User-Agent": "herder-guardian"}) as client:
        while True:
            try:
                response = client.post(f"/api/v1/agent/{label}/gone",
                                       params={"worker": worker})
                if response.status_code < 500:
                    if response.status_code == 200:
                        log.warning("guardian: reported agent %s gone (%s)", worker,
                                    response.json())
                        return True
                    log.error("guardian: the server refused the report that agent %s is "
                              "gone: HTTP %d", worker, response.status_code)
                    return False
                problem = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                problem = type(exc).__name__  # its text could name the URL; keep it short
            delay = backoff.next()
            if time.monotonic() + delay > deadline:
                log.error("guardian: could not tell the server agent %s is gone (%s); its "
                          "attempts are lost after the lease instead", worker, problem)
                return False
            sleep(delay)
