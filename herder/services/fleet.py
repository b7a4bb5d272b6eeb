"""The fleet's operations: hosts (`herder hosts`, `host add/set/drain/remove/token`), the
fleet-wide cap (`herder fleet cap`), accounts (`herder account`) and alerts."""

from __future__ import annotations

import builtins
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from herder.core.errors import Conflict, InputError, NotFound
from herder.core.model import INT_MAX, Account, HostRecord, Scope
from herder.services.base import OperationsBase

if TYPE_CHECKING:
    from herder.core.host_settings import HostSettings
    from herder.store.records import Alert
    from herder.wire.accounts import AccountView
    from herder.wire.fleet import FleetCapView
    from herder.wire.hosts import HostView


def check_account_names(host: str, name: str) -> None:
    """InputError naming HOST or NAME when either is not a valid name."""
    from herder.core.settings.fields import NAME as _NAME

    for field, value in (("HOST", host), ("NAME", name)):
        if not _NAME.match(value):
            what = "host label" if field == "HOST" else "account name"
            raise InputError(field, f"{value!r} is not a valid {what}",
                             "use letters, digits, '.', '_' and '-'")


class FleetOperations(OperationsBase):
    """The host, cap, account and alert operations of
    `herder.services.operations.Operations`."""


    def _host(self, label: str) -> HostRecord:
        record = self.store.host_get(label)
        if record is None:
            raise NotFound(f"no host {label!r} (see `herder hosts`)")
        return record

    def hosts(self) -> builtins.list[HostView]:
        from herder.runtime.read_models import host_views

        return host_views(self.store, self._fleet(), datetime.now(UTC))

    def fleet_cap(self) -> FleetCapView:
        """`[fleet] emergency_max_workers` now, and the jobs running against it."""
        from herder.runtime.read_models import fleet_cap_view

        return fleet_cap_view(self.store, self.config.settings.fleet.emergency_max_workers)

    def fleet_cap_set(self, max_workers: int | None, by: str = "cli") -> FleetCapView:
        """Set the fleet-wide cap on running jobs for every replica (None lifts it): new
        starts beyond it wait (`herder why` says so); running jobs are not stopped."""
        from herder.runtime.scheduler import EMERGENCY_MAX_WORKERS

        if max_workers is not None and (isinstance(max_workers, bool)
                                        or not isinstance(max_workers, int)
                                        or not 0 <= max_workers <= INT_MAX):
            raise InputError("max_workers", f"{max_workers!r} is not a cap",
                             "give a whole number of jobs, 0 or more, or lift the cap")
        self.store.fleet_setting_put(EMERGENCY_MAX_WORKERS, max_workers, datetime.now(UTC), by)
        view = self.fleet_cap()
        self.on_change()  # a lifted cap places the waiting work now, not at the next tick
        return view

    def fleet_cap_reset(self) -> FleetCapView:
        """Hand the cap back to herder.toml's `[fleet] emergency_max_workers`."""
        from herder.runtime.scheduler import EMERGENCY_MAX_WORKERS

        self.store.fleet_setting_delete(EMERGENCY_MAX_WORKERS)
        view = self.fleet_cap()
        self.on_change()
        return view

    def host_enable(self, label: str, enabled: bool) -> None:
        """Drain a host (enabled False: running jobs finish, nothing new) or enable it."""
        record = self._host(label)
        self.store.host_update(msgspec.structs.replace(record, enabled=enabled), datetime.now(UTC))

    def host_add(self, label: str, settings: HostSettings, enabled: bool = True) -> str:
        """Register a host; its first agent token (only the hash is stored)."""
        from herder.core.settings.fields import NAME as _NAME
        from herder.services.host_settings import apply_settings

        if not _NAME.match(label):
            raise InputError("LABEL", f"{label!r} is not a valid host label",
                             "use letters, digits, '.', '_' and '-'")
        if settings.ram_total_gb is None:
            raise InputError("--ram", "is required", "pass the host's total RAM in GB")
        record = apply_settings(HostRecord(label=label, ram_total_gb=0.0, enabled=enabled),
                                settings, self.config)
        if not self.store.host_insert(record, datetime.now(UTC)):
            raise Conflict(f"host {label!r} exists already (use `herder host set`)")
        return self._agent_token(label)

    def host_set(self, label: str, settings: HostSettings) -> None:
        from herder.services.host_settings import apply_settings

        self.store.host_update(apply_settings(self._host(label), settings, self.config),
                               datetime.now(UTC))

    def host_remove(self, label: str) -> None:
        """Forget a host (Conflict while jobs are claimed or running on it)."""
        self._host(label)
        if not self.store.host_remove(label):
            raise Conflict(f"host {label!r} still has claimed or running jobs; drain it first")
        # A host added again later under this label must not accept the old tokens.
        self.store.token_revoke_host(label, datetime.now(UTC))

    def host_token(self, label: str) -> str:
        """A new agent token for the host; its old ones stop working."""
        self._host(label)
        self.store.token_revoke_host(label, datetime.now(UTC))
        return self._agent_token(label)

    def _agent_token(self, label: str) -> str:
        from herder.core.access import new_token, token_hash  # pure: hashlib and secrets

        token = new_token()
        self.store.token_insert(f"host:{label}", Scope.AGENT, token_hash(token),
                                datetime.now(UTC), host=label)
        return token

    def accounts(self, host: str | None = None) -> builtins.list[AccountView]:
        from herder.services.views import account_view

        now = datetime.now(UTC)
        cooldown = self.config.settings.fleet.auth_revoked_cooldown
        return [account_view(record, now, cooldown) for record in self.store.account_list(host)]

    def account_add(self, account: Account) -> None:
        """Add or update an account; InputError naming the CLI option when it is invalid."""
        from herder.core.settings.fields import ENV_NAME as _ENV_NAME

        check_account_names(account.host, account.name)
        for key in account.env:
            if not _ENV_NAME.match(key):
                raise InputError("--env", f"{key!r} is not NAME=VALUE with a variable name",
                                 "e.g. --env CLAUDE_CONFIG_DIR=/home/me/.claude-2")
        if not 1 <= account.max_sessions <= 10_000:
            raise InputError("--max-sessions", f"{account.max_sessions} is out of range",
                             "use 1 to 10000")
        if account.probe is not None and not account.probe:
            raise InputError("--probe", "is empty", "give a command, or leave it out")
        known = self.config.settings.job_types
        unknown = sorted(set(account.job_types or ()) - set(known))
        if unknown:
            raise InputError("--job-type", f"unknown job type {unknown[0]!r}",
                             f"use one of {sorted(known)}")
        self.store.account_upsert(account, datetime.now(UTC))

    def account_remove(self, host: str, name: str) -> None:
        if not self.store.account_delete(host, name):
            raise NotFound(f"no account {name!r} on {host!r} (see `herder accounts`)")

    def account_clear(self, host: str, name: str) -> bool:
        """Clear `depleted` and `auth_revoked`; False when it was healthy already."""
        if not [r for r in self.store.account_list(host) if r.account.name == name]:
            raise NotFound(f"no account {name!r} on {host!r} (see `herder accounts`)")
        return self.store.account_clear(host, name, datetime.now(UTC))

    def alerts(self, open_only: bool = True, limit: int = 100) -> builtins.list[Alert]:
        return self.store.alert_list(open_only, limit)
