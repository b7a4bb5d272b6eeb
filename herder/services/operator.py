"""The operator's operations as one interface: `Operations` answers them against the
database, `RemoteClient` over a server's HTTP API, and the CLI holds either as an
`Operator`, so each command prints the same lines whichever it talks to."""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from herder.core.host_settings import HostSettings
    from herder.core.model import Account, Attempt, Event, Job, JobStatus, ReservationStatus
    from herder.services.jobs import Submitted
    from herder.services.operations import Operations
    from herder.services.remote import RemoteClient
    from herder.store.records import Alert
    from herder.wire.accounts import AccountView
    from herder.wire.alerts import AlertView
    from herder.wire.fleet import FleetCapView
    from herder.wire.hosts import HostView


class Operator(Protocol):
    def close(self) -> None: ...

    # -- jobs -----------------------------------------------------------------------------------

    def submit(self, job_type: str | None = None, command: Sequence[str] | None = None,
               payload: Mapping[str, Any] | None = None, *,
               available_at: datetime | None = None, check_command: bool = True,
               **fields: Any) -> Submitted: ...

    def get(self, job_id: int) -> Job: ...

    def list(self, status: Sequence[JobStatus] | None = None, limit: int = 100
             ) -> builtins.list[Job]: ...

    def attempts(self, job_id: int) -> builtins.list[Attempt]: ...

    def events(self, job_id: int) -> builtins.list[Event]: ...

    def history(self, job_id: int
                ) -> tuple[Job, builtins.list[Attempt], builtins.list[Event]]: ...

    def log(self, job_id: int, number: int, offset: int) -> bytes | None: ...

    def why(self, job_id: int) -> str: ...

    def cancel(self, job_id: int) -> JobStatus: ...

    def retry(self, job_id: int) -> bool: ...

    def wait(self, job_id: int, timeout: float | None = None) -> Job: ...

    def should_dispatch(self, dedup_key: str) -> tuple[int, JobStatus] | None: ...

    def dispatch_check(self, job_type: str, dedup_key: str,
                       payload: Mapping[str, str]) -> str | None: ...

    # -- hosts, the fleet's cap, accounts, alerts ------------------------------------------------

    def hosts(self) -> builtins.list[HostView]: ...

    def fleet_cap(self) -> FleetCapView: ...

    def fleet_cap_set(self, max_workers: int | None, by: str = "cli") -> FleetCapView: ...

    def fleet_cap_reset(self) -> FleetCapView: ...

    def host_enable(self, label: str, enabled: bool) -> None: ...

    def host_add(self, label: str, settings: HostSettings, enabled: bool = True) -> str: ...

    def host_set(self, label: str, settings: HostSettings) -> None: ...

    def host_remove(self, label: str) -> None: ...

    def host_token(self, label: str) -> str: ...

    def accounts(self, host: str | None = None) -> builtins.list[AccountView]: ...

    def account_add(self, account: Account) -> None: ...

    def account_remove(self, host: str, name: str) -> None: ...

    def account_clear(self, host: str, name: str) -> bool: ...

    def alerts(self, open_only: bool = True, limit: int = 100
               ) -> Sequence[Alert] | Sequence[AlertView]: ...

    # -- reservations and CI slots ---------------------------------------------------------------

    def claim_slot(self, run_id: str, label: str, weight: str) -> int: ...

    def release_slot(self, run_id: str) -> bool: ...

    def reserve(self, owner: str, label: str, weight: str, count: int,
                job: int | None = None) -> builtins.list[int]: ...

    def complete_reservation(self, reservation_id: int,
                             status: ReservationStatus) -> ReservationStatus: ...


if TYPE_CHECKING:
    def _both_implement(database: Operations, server: RemoteClient) -> list[Operator]:
        """mypy checks here that both are Operators (tests/test_operator.py at run time)."""
        return [database, server]
