"""The account health gate (herder.core.scheduling.accounts) as pure functions: only positive
evidence removes an account, the healthiest with the most headroom is picked, and a probe's
output counts only when it is exactly the three booleans. Plus the probe's process (a hang
is killed at its timeout and counts as unknown) and the config's checks."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from support.processes import escaping_daemon

from herder.core.errors import ConfigError
from herder.core.model import Account, AccountHealth
from herder.core.scheduling.accounts import (
    AccountState,
    Probe,
    account_needs,
    coerce_probe,
    pick,
    state_of,
)
from herder.core.settings.loading import load_config
from herder.runtime.accounts import ProbeCommand, Prober, run_probe

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
GOOD = '{"credentials_present": true, "has_refresh_token": true, "access_expired": true}'


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


@pytest.mark.parametrize("text", [
    "", "yes", "[]", "null", '{"credentials_present": true}',
    '{"credentials_present": true, "has_refresh_token": false}',
    '{"credentials_present": "false", "has_refresh_token": false, "access_expired": true}',
    '{"credentials_present": 0, "has_refresh_token": false, "access_expired": true}',
    GOOD[:-1] + ', "token": "sk-123"}', "[" * 100_000,
])
def test_a_probe_that_does_not_print_exactly_three_booleans_says_nothing(text: str):
    assert coerce_probe(text) is None


@pytest.mark.parametrize(("present", "refresh", "expired", "dead"), [
    (True, True, True, False),    # expired, but it can renew
    (True, False, False, False),  # cannot renew, but still valid
    (True, False, True, True),    # cannot authenticate now, cannot renew
    (False, True, False, True),   # nothing to authenticate with
])
def test_a_token_is_dead_only_when_it_can_neither_authenticate_nor_renew(
        present: bool, refresh: bool, expired: bool, dead: bool):
    text = (f'{{"credentials_present": {str(present).lower()}, "has_refresh_token": '
            f'{str(refresh).lower()}, "access_expired": {str(expired).lower()}}}')
    probe = coerce_probe(text)
    assert probe is not None and probe.dead is dead


def test_the_state_comes_from_positive_evidence_only():
    assert state_of(AccountHealth(), NOW)[0] is AccountState.HEALTHY
    assert state_of(AccountHealth(dead_token=None), NOW)[0] is AccountState.HEALTHY
    assert state_of(AccountHealth(depleted_until=later(60)), NOW)[0] is AccountState.DEPLETED
    assert state_of(AccountHealth(depleted_until=NOW), NOW)[0] is AccountState.HEALTHY
    revoked = AccountHealth(auth_revoked_at=NOW)
    assert state_of(revoked, later(1799))[0] is AccountState.AUTH_REVOKED
    assert state_of(revoked, later(1800))[0] is AccountState.HEALTHY  # the 30 min cooldown
    assert state_of(AccountHealth(dead_token=True), NOW)[0] is AccountState.DEAD_TOKEN


def test_pick_takes_the_healthiest_account_with_the_most_headroom():
    accounts = [Account("h", "a", max_sessions=2), Account("h", "b", max_sessions=3),
                Account("h", "c", max_sessions=3)]
    # Unknown health alike: the most free sessions, then the name.
    assert pick(accounts, {}, {}, "t", None, NOW).account == accounts[1]
    assert pick(accounts, {}, {"b": 2}, "t", None, NOW).account == accounts[2]
    assert pick(accounts, {}, {"b": 2, "c": 2}, "t", None, NOW).account == accounts[0]
    # An account a probe found healthy comes before unknown ones with more headroom.
    healths = {"c": AccountHealth(dead_token=False)}
    assert pick(accounts, healths, {"c": 2}, "t", None, NOW).account == accounts[2]
    # Only the names a job type allows, and only accounts serving its type.
    assert pick(accounts, {}, {}, "t", frozenset({"a"}), NOW).account == accounts[0]
    typed = [Account("h", "x", job_types=frozenset({"other"}))]
    choice = pick(typed, {}, {}, "t", None, NOW)
    assert choice.account is None and choice.refusals == () and not choice.full


def test_no_healthy_account_says_why_and_when_the_first_turns_usable():
    accounts = [Account("h", "a"), Account("h", "b"), Account("h", "c")]
    healths = {"a": AccountHealth(depleted_until=later(600)),
               "b": AccountHealth(auth_revoked_at=later(-1700)),
               "c": AccountHealth(dead_token=True)}
    choice = pick(accounts, healths, {}, "t", None, NOW)
    assert choice.account is None and not choice.full
    assert choice.resume_at == later(100)  # b's cooldown ends first
    text = choice.describe()
    assert "a (depleted until 2030-01-01T12:10:00Z)" in text
    assert "b (auth_revoked since" in text and "c (dead_token" in text


def test_every_healthy_account_busy_is_full_not_unhealthy():
    choice = pick([Account("h", "a")], {}, {"a": 1}, "t", None, NOW)
    assert choice.account is None and choice.full


def test_a_hanging_probe_is_killed_at_its_timeout_and_says_nothing(tmp_path: Path):
    started = time.monotonic()
    assert run_probe(ProbeCommand(("sleep", "60"), 0.5, 300)) is None
    assert time.monotonic() - started < 30
    dead = tmp_path / "dead"
    dead.write_text("#!/bin/sh\necho '{\"credentials_present\": false, "
                    "\"has_refresh_token\": false, \"access_expired\": true}'\n")
    dead.chmod(0o755)
    found = run_probe(ProbeCommand((str(dead),), 5, 300))
    assert found is not None and found.dead is True
    found = run_probe(ProbeCommand(("/bin/sh", "-c", f"echo '{GOOD}'"), 5, 300))
    assert found is not None and found.dead is False
    assert run_probe(ProbeCommand(("/bin/sh", "-c", f"echo '{GOOD}'; exit 3"), 5, 300)) is None
    assert run_probe(ProbeCommand((str(tmp_path / "missing"),), 5, 300)) is None


def test_the_prober_runs_each_probe_once_per_interval():
    calls: list[tuple[str, ...]] = []
    clock = [0.0]

    fine = Probe(True, True, False)

    def runner(command: ProbeCommand, _env: object) -> Probe | None:
        calls.append(command.argv)
        return fine

    prober = Prober(runner=runner, clock=lambda: clock[0])
    probes = {"a": ProbeCommand(("a",), 1, 300), "b": ProbeCommand(("b",), 1, 60)}
    assert prober.refresh(probes) == {"a": fine, "b": fine}
    clock[0] = 100.0
    assert prober.refresh(probes) == {"b": fine}
    assert prober.refresh({"a": probes["a"]}) == {}
    assert prober.view() == {"a": False}
    assert calls == [("a",), ("b",), ("b",)]


def test_a_job_type_naming_an_account_no_host_has_is_a_config_error(tmp_path: Path):
    config = tmp_path / "herder.toml"
    config.write_text('[hosts.h1]\nram_total_gb = 8\n[hosts.h1.accounts.main]\n'
                      'env = {CLAUDE_CONFIG_DIR = "/home/me/.claude"}\n\n'
                      '[job_types.fix]\ncommand = ["claude"]\naccounts = ["main", "spare"]\n')
    with pytest.raises(ConfigError, match=r"job_types\.fix\.accounts: no host has an account "
                                          r"'spare'"):
        load_config(config)
    config.write_text(config.read_text().replace(', "spare"', ""))
    assert account_needs(load_config(config).settings) == {"fix": frozenset({"main"})}


def test_an_account_with_a_bad_key_is_refused_naming_it(tmp_path: Path):
    config = tmp_path / "herder.toml"
    config.write_text('[hosts.h1]\nram_total_gb = 8\n[hosts.h1.accounts.main]\n'
                      'max_sessions = 0\n')
    with pytest.raises(ConfigError, match=r"hosts\.h1\.accounts\.main\.max_sessions"):
        load_config(config)


def test_placement_learns_which_hosts_cannot_serve_a_type_and_why():
    from herder.core.model import AccountRecord
    from herder.core.scheduling.accounts import AccountRules
    from herder.core.scheduling.placement import Reason

    rules = AccountRules({"fix": None})
    records = [
        AccountRecord(Account("depleted", "a"), AccountHealth(depleted_until=later(60))),
        AccountRecord(Account("busy", "b"), AccountHealth(), sessions=1),
        AccountRecord(Account("fine", "c"), AccountHealth(dead_token=None)),
    ]
    blocked = rules.blocked(records, ["depleted", "busy", "fine", "none"], NOW)
    assert blocked["depleted"]["fix"][0] is Reason.NO_HEALTHY_ACCOUNT
    assert blocked["depleted"]["fix"][1].startswith(
        "no healthy account for fix (0 of 1): a (depleted until")
    assert blocked["busy"]["fix"] == (Reason.SLOTS_FULL, "every account for fix in use")
    assert blocked["none"]["fix"] == (Reason.NO_HEALTHY_ACCOUNT,
                                      "no healthy account for fix: no account serves it")
    assert "fine" not in blocked


def test_a_daemon_the_probe_left_holding_its_stdout_does_not_hold_the_probe_loop(
        tmp_path: Path) -> None:
    with escaping_daemon(tmp_path) as daemon:
        assert run_probe(ProbeCommand(daemon.argv, 1.0, 300)) is None
        daemon.assert_alive()
