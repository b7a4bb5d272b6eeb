"""The operator's commands over the HTTP API: `herder --server URL jobs` and the others.

`RemoteClient` answers what `herder.services.operations.Operations` answers (the same model
objects and views; both are `herder.services.operator.Operator`s), so each command prints
the same lines whichever it talks to. Every answer of the
server ends as a result or one of herder's errors, which the CLI prints as one line:
a refused token, an unknown job, a refused input naming its field, a server or network
failure. Loaded only with --server: the local commands import no HTTP client."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx
import msgspec

from herder.core.errors import Conflict, HerderError, InputError, NotFound
from herder.core.host_settings import HostSettings
from herder.core.model import Account, Attempt, Event, Job, JobStatus, ReservationStatus
from herder.core.settings.fields import NAME as _NAME
from herder.core.urls import loopback_name
from herder.services.fleet import check_account_names
from herder.services.jobs import Submitted, submit_request_of, wait_for_end
from herder.wire.accounts import AccountBody, AccountChanged, AccountView
from herder.wire.alerts import AlertView
from herder.wire.fleet import FleetCapView
from herder.wire.hosts import HostSettingsBody, HostToken, HostView
from herder.wire.jobs import (
    AttemptView,
    Cancelled,
    DedupHolder,
    DispatchChecked,
    EventView,
    JobDetail,
    JobView,
    Retried,
    Why,
)
from herder.wire.jobs import Submitted as SubmittedReply
from herder.wire.reservations import ReservationEnded, Reserved, SlotClaimed, SlotReleased

TIMEOUT_SECONDS = 30.0
"""How long one call may take before the command gives up with one line."""


class TokenRefused(HerderError):
    """401 or 403: the token is unknown, revoked, or lacks the scope."""


class ServerFailed(HerderError):
    """The server could not be reached, timed out or failed (5xx)."""


class NotOverServer(HerderError):
    """A command that works against the database only (`State.store` in herder.cli.root)."""

    def __init__(self) -> None:
        super().__init__("this command works against the database only; "
                         "run it without --server / HERDER_SERVER, with HERDER_DB")


def loopback(url: str) -> bool:
    return loopback_name(httpx.URL(url).host)


def plain_http_warning(url: str) -> str | None:
    """What to say when the token would cross a network in clear text."""
    if url.startswith("http://") and not loopback(url):
        return (f"herder: warning: {url} is plain http; the token crosses the network "
                "unencrypted (use https:// with a TLS server)")
    return None


HIDDEN_FIELDS: dict[str, Any] = {"shell": False, "env": {}, "backoff_base_seconds": 0.0,
                                 "backoff_max_seconds": 0.0}
"""What the API never shows of a job (env values, the backoff, the shell flag), left at
its neutral value, which no command prints."""


def job_of(view: JobView) -> Job:
    """A job as the API shows it (`HIDDEN_FIELDS` at their neutral values)."""
    return msgspec.convert({**HIDDEN_FIELDS, **{name: getattr(view, name)
                                                for name in JobView.model_fields}}, Job)


def attempt_of(job_id: int, view: AttemptView) -> Attempt:
    memory = None if view.memory_enforcement is None else {
        "peak_rss_bytes": view.peak_rss_bytes, "budget_bytes": view.memory_budget_bytes,
        "enforcement": view.memory_enforcement}
    return msgspec.convert({**dict(view), "job_id": job_id, "memory": memory}, Attempt)


def event_of(job_id: int, view: EventView) -> Event:
    return msgspec.convert({**dict(view), "job_id": job_id}, Event)


def host_path(label: str) -> str:
    """The host's path; a label no host can have is NotFound here, as in the database
    (and a `/` or `?` in it never reaches another route)."""
    if not _NAME.match(label):
        raise NotFound(f"no host {label!r} (see `herder hosts`)")
    return f"/api/v1/hosts/{label}"


def account_path(host: str, name: str) -> str:
    if not (_NAME.match(host) and _NAME.match(name)):
        raise NotFound(f"no account {name!r} on {host!r} (see `herder accounts`)")
    return f"/api/v1/accounts/{host}/{name}"


def refusal(response: httpx.Response) -> str:
    """The server's own words for a refusal: `detail`, or `error` (which names the field)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:200] or f"HTTP {response.status_code}"
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            return str(body["error"])
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):  # pydantic's: each problem with where it is
            return "; ".join(
                f"{'.'.join(str(part) for part in item.get('loc', ())[1:]) or 'body'}: "
                f"{item.get('msg', 'invalid')}" for item in detail if isinstance(item, dict))
    return f"HTTP {response.status_code}"


class RemoteClient:
    """The operator's side of the HTTP API, with an operator token (read, submit or admin)."""

    def __init__(self, server: str, token: str, *, ca: str | None = None,
                 transport: httpx.BaseTransport | None = None,
                 timeout: float = TIMEOUT_SECONDS) -> None:
        self.server = server
        self._http = httpx.Client(
            base_url=server, timeout=timeout, transport=transport, verify=ca or True,
            headers={"Authorization": f"Bearer {token}", "User-Agent": "herder-cli"})

    def close(self) -> None:
        self._http.close()

    # -- one call -------------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One call; a 2xx answer, else the error that says what went wrong in one line."""
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ServerFailed(f"{self.server} did not answer within "
                               f"{self._http.timeout.read or TIMEOUT_SECONDS:.0f}s") from None
        except httpx.HTTPError as exc:
            raise ServerFailed(f"cannot reach {self.server}: {exc or type(exc).__name__} "
                               "(is `herder server` running there?)") from None
        status = response.status_code
        if 200 <= status < 300:
            return response
        if status in (401, 403):
            raise TokenRefused(f"token refused by {self.server}: {refusal(response)} "
                               "(check --token-file / HERDER_TOKEN_FILE / HERDER_TOKEN)")
        if status == 404:
            raise NotFound(refusal(response))
        if status == 409:
            raise Conflict(refusal(response))  # its words, as against the database
        if status in (400, 413, 422):
            body = response.json() if "json" in response.headers.get("content-type", "") else {}
            field = body.get("field") if isinstance(body, dict) else None
            message = refusal(response)
            if field and message.startswith(f"{field}: "):
                message = message[len(field) + 2:]
            raise InputError(field or "request", message)
        if 300 <= status < 400:
            raise ServerFailed(f"{self.server} answers with a redirect (HTTP {status}); "
                               "pass the URL it redirects to")
        raise ServerFailed(f"{self.server} failed (HTTP {status}): {refusal(response)}")

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.request(method, path, **kwargs)
        try:
            return response.json()
        except ValueError:
            raise ServerFailed(f"{self.server} answered {path} with no JSON "
                               "(is it a herder server?)") from None

    # -- jobs -------------------------------------------------------------------------------------

    def submit(self, job_type: str | None = None, command: Sequence[str] | None = None,
               payload: Mapping[str, Any] | None = None, *,
               available_at: datetime | None = None, check_command: bool = True,
               **fields: Any) -> Submitted:
        """As `Client.submit`; the server validates against its config, and the host that
        runs the job checks its command and workdir (preflight), not this machine."""
        del check_command
        request = submit_request_of(job_type, command, payload, available_at,
                                    datetime.now(UTC), fields)
        body = {key: value for key, value in msgspec.structs.asdict(request).items()
                if value is not None and value != {} and key != "force"}
        body["force"] = request.force
        reply = SubmittedReply.model_validate(self.json("POST", "/api/v1/jobs", json=body))
        return Submitted(reply.id, reply.created, reply.status)

    def get(self, job_id: int) -> Job:
        return job_of(JobView.model_validate(self.json("GET", f"/api/v1/jobs/{job_id}")))

    def list(self, status: Sequence[JobStatus] | None = None, limit: int = 100
             ) -> builtins.list[Job]:
        params: dict[str, Any] = {"limit": limit}
        if status:
            params["status"] = [str(s) for s in status]
        return [job_of(JobView.model_validate(item))
                for item in self.json("GET", "/api/v1/jobs", params=params)]

    def history(self, job_id: int) -> tuple[Job, builtins.list[Attempt], builtins.list[Event]]:
        detail = JobDetail.model_validate(self.json("GET", f"/api/v1/jobs/{job_id}"))
        return (job_of(detail), [attempt_of(job_id, a) for a in detail.attempts],
                [event_of(job_id, e) for e in detail.events])

    def attempts(self, job_id: int) -> builtins.list[Attempt]:
        return self.history(job_id)[1]

    def events(self, job_id: int) -> builtins.list[Event]:
        return self.history(job_id)[2]

    def log(self, job_id: int, number: int, offset: int) -> bytes | None:
        try:
            response = self.request("GET", f"/api/v1/jobs/{job_id}/log",
                                    params={"attempt": number, "offset": offset})
        except NotFound as exc:
            if "does not exist" in str(exc):  # the attempt has logged nothing yet
                return None
            raise
        return response.content

    def why(self, job_id: int) -> str:
        return Why.model_validate(self.json("GET", f"/api/v1/jobs/{job_id}/why")).why

    def cancel(self, job_id: int) -> JobStatus:
        return Cancelled.model_validate(
            self.json("POST", f"/api/v1/jobs/{job_id}/cancel")).status

    def retry(self, job_id: int) -> bool:
        return Retried.model_validate(
            self.json("POST", f"/api/v1/jobs/{job_id}/retry")).retried

    def should_dispatch(self, dedup_key: str) -> tuple[int, JobStatus] | None:
        holder = DedupHolder.model_validate(self.json(
            "GET", "/api/v1/jobs/dedup-holder", params={"key": dedup_key}))
        if holder.job_id is None or holder.status is None:
            return None
        return holder.job_id, holder.status

    def dispatch_check(self, job_type: str, dedup_key: str,
                       payload: Mapping[str, str]) -> str | None:
        """The server runs the check (its herder.toml has the command)."""
        from herder.services.dispatch_check import DispatchCheckFailed

        answer = DispatchChecked.model_validate(self.json(
            "POST", "/api/v1/jobs/dispatch-check", json={
                "job_type": job_type, "dedup_key": dedup_key, "payload": dict(payload)}))
        if answer.error is not None:
            raise DispatchCheckFailed(answer.error)
        return (answer.reason or "the dispatch check said skip") if answer.skip else None

    def wait(self, job_id: int, timeout: float | None = None) -> Job:
        return wait_for_end(self.get, time.sleep, job_id, timeout)

    # -- hosts, accounts, alerts -----------------------------------------------------------------

    def hosts(self) -> builtins.list[HostView]:
        return [HostView.model_validate(item) for item in self.json("GET", "/api/v1/hosts")]

    def fleet_cap(self) -> FleetCapView:
        return FleetCapView.model_validate(self.json("GET", "/api/v1/fleet/cap"))

    def fleet_cap_set(self, max_workers: int | None, by: str = "cli") -> FleetCapView:
        del by  # the server records the token's name
        return FleetCapView.model_validate(self.json(
            "PUT", "/api/v1/fleet/cap", json={"max_workers": max_workers}))

    def fleet_cap_reset(self) -> FleetCapView:
        return FleetCapView.model_validate(self.json("DELETE", "/api/v1/fleet/cap"))

    def host_enable(self, label: str, enabled: bool) -> None:
        self.request("POST", f"{host_path(label)}/{'enable' if enabled else 'drain'}")

    def host_add(self, label: str, settings: HostSettings, enabled: bool = True) -> str:
        body = {"label": label, "enabled": enabled, **HostSettingsBody.body_of(settings)}
        return HostToken.model_validate(self.json("POST", "/api/v1/hosts", json=body)).token

    def host_set(self, label: str, settings: HostSettings) -> None:
        self.request("PATCH", host_path(label), json=HostSettingsBody.body_of(settings))

    def host_remove(self, label: str) -> None:
        self.request("DELETE", host_path(label))

    def host_token(self, label: str) -> str:
        return HostToken.model_validate(self.json("POST", f"{host_path(label)}/token")).token

    def account_add(self, account: Account) -> None:
        check_account_names(account.host, account.name)
        body = AccountBody(
            env=dict(account.env), max_sessions=account.max_sessions,
            job_types=None if account.job_types is None else sorted(account.job_types),
            probe=None if account.probe is None else list(account.probe))
        self.request("PUT", account_path(account.host, account.name),
                     json=body.model_dump(exclude_none=True))

    def account_remove(self, host: str, name: str) -> None:
        self.request("DELETE", account_path(host, name))

    def account_clear(self, host: str, name: str) -> bool:
        return AccountChanged.model_validate(
            self.json("POST", f"{account_path(host, name)}/clear")).changed

    # -- reservations and CI slots -------------------------------------------------------------

    def claim_slot(self, run_id: str, label: str, weight: str) -> int:
        return SlotClaimed.model_validate(self.json(
            "POST", "/api/v1/slots/claim",
            json={"run_id": run_id, "host": label, "weight": weight})).id

    def release_slot(self, run_id: str) -> bool:
        return SlotReleased.model_validate(self.json(
            "POST", "/api/v1/slots/release", json={"run_id": run_id})).released

    def reserve(self, owner: str, label: str, weight: str, count: int,
                job: int | None = None) -> builtins.list[int]:
        return Reserved.model_validate(self.json(
            "POST", "/api/v1/reservations",
            json={"owner": owner, "host": label, "weight": weight, "count": count,
                  **({} if job is None else {"job": job})})).reserved

    def complete_reservation(self, reservation_id: int,
                             status: ReservationStatus) -> ReservationStatus:
        return ReservationEnded.model_validate(self.json(
            "POST", f"/api/v1/reservations/{reservation_id}/complete",
            json={"status": str(status)})).status

    def accounts(self, host: str | None = None) -> builtins.list[AccountView]:
        params = {} if host is None else {"host": host}
        return [AccountView.model_validate(item)
                for item in self.json("GET", "/api/v1/accounts", params=params)]

    def alerts(self, open_only: bool = True, limit: int = 100) -> builtins.list[AlertView]:
        return [AlertView.model_validate(item) for item in self.json(
            "GET", "/api/v1/alerts", params={"all": not open_only, "limit": limit})]
