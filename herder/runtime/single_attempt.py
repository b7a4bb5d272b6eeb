"""One placed attempt run over ssh (`herder run-attempt`): the agent's HTTP source, for a
single attempt and no adoption."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from herder.core.model import AttemptToken, Job
from herder.runtime.agent import HttpSource
from herder.runtime.agent_client import ServerClient, ServerError
from herder.runtime.local_gate import LocalGate
from herder.wire import agents as protocol


def fetch_attempt(client: ServerClient, token: AttemptToken
                  ) -> tuple[Job | None, float | None]:
    """One placed attempt of the client's host (for `herder run-attempt` over ssh), and the
    lease the server enforces."""
    try:
        reply = protocol.PlacedAttempt.model_validate(
            client.call("GET", f"/attempts/{token.job_id}/{token.attempt}", retry=False))
    except ServerError:
        return None, None
    job = None if reply.job is None else reply.job.job(datetime.now().astimezone())
    return job, reply.lease_seconds


class SingleAttemptSource(HttpSource):
    """Runs exactly one placed attempt, then lets the runner exit (ssh push)."""

    supervised = False
    """One attempt over ssh: nothing to adopt, and none of its attempts is adopted."""

    def __init__(self, client: ServerClient, gate: LocalGate, job: Job, **kwargs: Any) -> None:
        super().__init__(client, gate, concurrency=1, poll=False, **kwargs)
        self.job = job
        self.taken = False

    def take(self, free: int, now: datetime) -> list[Job]:
        if self.taken or free <= 0:
            return []
        self.taken = True
        return [self.job] if self.admit(self.job) else []

    def idle(self) -> bool:
        return self.taken

    def maintain(self, now: datetime) -> None:
        """Orphan recovery belongs to the host's agent, not to a one-shot attempt."""

    def predecessors(self) -> list[tuple[AttemptToken, str]]:
        return []
