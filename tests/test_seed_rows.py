"""Issue 24's remaining seed rows, end to end under `herder up` on both backends: a timeout
moves a job up one weight once; a job's own mutex_collision or stale_duplicate ends it
quietly; the spawn-failure cap fails a job for a human."""

from __future__ import annotations

import json
import logging
import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cli import herder_argv
from support.local import Harness, shell

from herder.client import Client
from herder.core.errors import ConfigError, Conflict, InputError
from herder.core.fleet import Fleet
from herder.core.model import HostRecord, JobSpec, JobStatus, Outcome, ReservationStatus
from herder.core.settings.loading import load_config
from herder.core.settings.sections import Settings, subagent_caps
from herder.runtime.coordinator import Coordinator
from herder.runtime.scheduler import Scheduler
from herder.services.why import why

WRAPPER = """\
#!/bin/sh
# An agent wrapper script speaking seed 004's exit codes: exit 3 is RAM contention.
exit 3
"""


@pytest.fixture
def seed_harness(tmp_path: Path, store_url: str) -> Iterator[Harness]:
    script = tmp_path / "wrapper"
    script.write_text(WRAPPER)
    script.chmod(0o755)
    h = Harness(tmp_path, store_url, extra_config=(
        '[fleet]\nmax_spawn_failures = 2\nspawn_backoff = "0s"\n\n'
        f'[job_types.wrapper]\ncommand = ["{script}"]\npreflight = false\n'))
    try:
        yield h
    finally:
        h.close()


def stop(h: Harness, up) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM `herder up` and wait for it: every ending it judged is recorded by then,
    alerts included."""
    up.send_signal(signal.SIGTERM)
    h.wait_exit(up, 30, "herder up")


def job_alerts(h: Harness, job_id: int) -> list[str]:
    return [alert.key for alert in h.store.alert_list() if alert.key.startswith(f"job:{job_id}:")]


def test_a_timeout_moves_the_job_up_one_weight_then_fails_it(seed_harness: Harness):
    h = seed_harness
    job_id = h.submit(shell("sleep 60"), weight="light", timeout_seconds=1.0, max_attempts=2)
    up = h.up()
    try:
        job = h.wait_status(job_id, JobStatus.FAILED, timeout=60)
    finally:
        stop(h, up)
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.TIMEOUT, Outcome.TIMEOUT]
    assert (job.weight, job.escalations, job.failures, job.failure_reason, job.actionable) == (
        "heavy", 1, 2, "timeout", True)


@pytest.mark.parametrize(("reason", "ending"), [
    ("mutex_collision", "exit 1"),  # the seed's worker: the lock is held
    ("stale_duplicate", "exit 0"),  # the work already shipped; no outcome named
    # the job's word wins over what its log would have said (a rate limit: a retry)
    ("mutex_collision", "echo 'API Error: 429 rate_limit_error'; exit 1"),
])
def test_a_jobs_own_quiet_reason_ends_it_without_a_retry_or_an_alert(
        seed_harness: Harness, reason: str, ending: str):
    h = seed_harness
    said = h.submit(shell(f"printf '{{\"failure_reason\": \"{reason}\"}}' > \"$HERDER_RESULT\""
                          f"; {ending}"), max_attempts=3)
    broken = h.submit(shell("exit 1"), max_attempts=1)  # an actionable failure beside it
    up = h.up()
    try:
        job = h.wait_status(said, JobStatus.FAILED, timeout=60)
        h.wait_status(broken, JobStatus.FAILED, timeout=60)
    finally:
        stop(h, up)
    assert (job.attempt, job.failures, job.failure_reason, job.actionable,
            job.human_action) == (1, 0, reason, False, False)
    assert job_alerts(h, said) == []
    assert job_alerts(h, broken) == [f"job:{broken}:failed"]
    listed = json.loads(h.cli("jobs", "--status", "failed", "--actionable", "--json").stdout)
    assert [job["id"] for job in listed] == [broken]


def test_the_spawn_failure_cap_fails_a_ram_contended_job_for_a_human(seed_harness: Harness):
    h = seed_harness
    job_id = h.client.submit("wrapper").job_id
    up = h.up()
    try:
        job = h.wait_status(job_id, JobStatus.FAILED, timeout=60)
    finally:
        stop(h, up)
    assert [a.outcome for a in h.attempts(job_id)] == [Outcome.RAM_CONTENTION] * 2
    assert (job.spawn_failures, job.failures, job.failure_reason, job.actionable,
            job.human_action) == (2, 0, "spawn_ram", True, True)
    assert job_alerts(h, job_id) == [f"job:{job_id}:human_action"]
    [alert] = [a for a in h.store.alert_list() if a.key == f"job:{job_id}:human_action"]
    assert "spawn_ram" in alert.message and "a human must act" in alert.message


# -- a job type pinned to hosts (seed 000's hard affinity per type) ---------------------------

PINNED = """\
[job_types.infra]
command = ["true"]
preflight = false
allow_host = true
hosts = ["ops-1"]

[job_types.anywhere]
command = ["true"]
preflight = false
"""


@pytest.mark.parametrize(("hosts", "message"), [
    ("[]", "names no host"),
    ('["ops 1"]', "'ops 1' is not a valid host label"),
    ('["ops-1", "ops-1"]', "names a host twice"),
])
def test_a_pin_that_cannot_work_stops_the_load_naming_the_key(tmp_path: Path, hosts: str,
                                                              message: str):
    path = tmp_path / "herder.toml"
    path.write_text(f'[job_types.infra]\ncommand = ["true"]\nhosts = {hosts}\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert "job_types.infra.hosts" in str(caught.value) and message in str(caught.value)


def test_a_pin_to_a_declared_host_that_refuses_the_type_stops_the_load(tmp_path: Path):
    path = tmp_path / "herder.toml"
    path.write_text(PINNED + '\n[hosts.ops-1]\nram_total_gb = 16\njob_types = ["anywhere"]\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    text = str(caught.value)
    assert "job_types.infra.hosts" in text and "hosts.ops-1.job_types" in text, text
    assert "add 'infra' to hosts.ops-1.job_types" in text
    # A label the file does not declare loads: `herder host add` may register it later.
    path.write_text(PINNED)
    assert load_config(path).settings.job_types["infra"].hosts == ["ops-1"]


def test_a_pinned_type_runs_only_on_its_hosts_through_the_store(store, tmp_path: Path, caplog):
    path = tmp_path / "herder.toml"
    path.write_text(PINNED)
    config = load_config(path)
    fleet = Fleet.from_settings(config.settings)
    now = datetime.now(UTC)  # jobs are submitted at the real time: so is all the rest
    for label in ("big", "ops-1"):
        store.host_insert(HostRecord(label, 32 if label == "big" else 8,
                                     prime_max_workers=1, night_max_workers=1), now)
        store.host_heartbeat(label, now, {})
    client = Client.over(store, config)
    first, second = (client.submit("infra", check_command=False).job_id for _ in range(2))
    free = client.submit("anywhere", check_command=False).job_id
    now = datetime.now(UTC)
    Scheduler(store, fleet).run_once(now)
    assert {job_id: store.job_get(job_id).host for job_id in (first, second, free)} == {
        first: "ops-1", second: None, free: "big"}
    text = why(store, fleet, second, now)
    assert "ops-1 full (1/1 workers)" in text, text
    assert "big not used (job type infra runs only on ops-1)" in text, text
    # Bound elsewhere by a submitter: refused at the edge, nothing stored.
    count = len(store.job_list(None, 100))
    with pytest.raises(InputError) as caught:
        client.submit("infra", affinity="big", check_command=False)
    assert caught.value.field == "affinity"
    assert "job type infra runs only on ops-1" in str(caught.value)
    assert len(store.job_list(None, 100)) == count
    assert client.submit("infra", affinity="ops-1", check_command=False).created
    # A pin to hosts none of which is registered is refused while hosts are.
    path.write_text(PINNED.replace('["ops-1"]', '["ops-9"]'))
    ghost = Client.over(store, load_config(path))
    with pytest.raises(InputError) as caught:
        ghost.submit("infra", check_command=False)
    assert caught.value.field == "job_type" and "herder host add" in str(caught.value)
    # The server says so at start, since herder.toml alone cannot tell.
    with caplog.at_level(logging.WARNING, "herder.coordinator"):
        Coordinator(store, load_config(path)).sync_hosts()
    assert "job_types.infra.hosts names ops-9, not a registered host" in caplog.text


# -- max_subagents_for_weight (seed 004) ------------------------------------------------------


def test_subagent_caps_are_the_seeds_with_the_file_over_them(tmp_path: Path):
    assert subagent_caps(Settings()) == {"light": 0, "heavy": 16, "playwright": 16,
                                         "orchestrator": 10}
    path = tmp_path / "herder.toml"
    path.write_text("[weights]\nplaywright = false\ngpu = 16\n\n[fleet]\n"
                    'escalation = ["light", "heavy", "orchestrator"]\n'
                    'shedding = [[0.5, "heavy"], [0.0, "light"]]\n'
                    "max_subagents_for_weight = { heavy = 4, gpu = 2, orchestrator = false }\n")
    assert subagent_caps(load_config(path).settings) == {"light": 0, "heavy": 4, "gpu": 2}
    for written, message in (("{ heavy = -1 }", "heavy = -1: give a number of slots"),
                             ("{ heavy = true }", "heavy = true: give a number of slots"),
                             ("{ huge = 3 }", "fleet.max_subagents_for_weight.huge: unknown "
                                              "weight 'huge'")):
        path.write_text(f"[fleet]\nmax_subagents_for_weight = {written}\n")
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert "max_subagents_for_weight" in str(caught.value)
        assert message in str(caught.value), str(caught.value)


def running_job(store, weight: str) -> int:  # type: ignore[no-untyped-def]
    [job_id] = [r.job_id for r in store.job_insert([JobSpec(command=("true",), weight=weight)],
                                                   datetime.now(UTC))]
    claimed = store.job_claim("bms-4", "w1", 1, datetime.now(UTC))
    assert [job.id for job in claimed] == [job_id]
    return job_id


def test_a_jobs_subagent_slots_on_a_host_are_capped_by_its_weight(store, tmp_path: Path):
    path = tmp_path / "herder.toml"
    path.write_text("[fleet]\nmax_subagents_for_weight = { heavy = 3 }\n")
    client = Client.over(store, load_config(path))
    now = datetime.now(UTC)
    for label in ("bms-4", "vps-i1"):
        store.host_insert(HostRecord(label, 32), now)
    heavy = running_job(store, "heavy")
    assert len(client.reserve("parent", "bms-4", "subagent", 2, job=heavy)) == 2
    with pytest.raises(Conflict) as caught:
        client.reserve("parent", "bms-4", "subagent", 2, job=heavy)
    text = str(caught.value)
    assert f"job {heavy} (heavy) holds 2 subagent slot(s) on bms-4" in text, text
    assert "[fleet] max_subagents_for_weight.heavy = 3" in text, text
    assert len(store.reservation_list("bms-4")) == 2  # all or none: nothing booked
    assert len(client.reserve("parent", "bms-4", "subagent", 1, job=heavy)) == 1
    # The cap is per host, and a completed slot no longer counts.
    assert len(client.reserve("parent", "vps-i1", "subagent", 3, job=heavy)) == 3
    client.complete_reservation(store.reservation_list("bms-4")[0].id, ReservationStatus.DONE)
    [again] = client.reserve("parent", "bms-4", "subagent", 1, job=heavy)
    assert store.reservation_get(again).job_id == heavy  # type: ignore[union-attr]
    # light books none by default (seed 004: max_subagents_for_weight('vps-i1', 'light') = 0)
    light = running_job(store, "light")
    with pytest.raises(Conflict, match=r"max_subagents_for_weight\.light = 0"):
        client.reserve("child", "bms-4", "subagent", 1, job=light)
    # A booking for no job is capped by the token's limits alone, as before.
    assert len(client.reserve("ci", "bms-4", "subagent", 5)) == 5
    # Only a running job books: one that is queued or unknown is refused naming `job`.
    [queued] = [r.job_id for r in store.job_insert([JobSpec(command=("true",))], now)]
    for job_id in (queued, 999_999):
        with pytest.raises(InputError) as refused:
            client.reserve("parent", "bms-4", "subagent", 1, job=job_id)
        assert refused.value.field == "job"


def test_a_job_books_its_subagents_under_herder_up_within_its_weights_cap(tmp_path: Path,
                                                                         store_url: str):
    """The job itself runs `herder reserve`: $HERDER_JOB_ID names it, so its weight caps what
    it books (2 for heavy here) and the refusal is one line, exit 2."""
    h = Harness(tmp_path, store_url,
                extra_config="[fleet]\nmax_subagents_for_weight = { heavy = 2 }\n")
    try:
        h.cli("host", "add", h.host, "--ram", "32")
        herder = " ".join(herder_argv(db=store_url, config=h.config))
        script = (f"{herder} reserve fan-out --host {h.host} --count 3 2> over.txt; "
                  f"echo \"exit $?\" >> over.txt; "
                  f"{herder} reserve fan-out --host {h.host} --count 2 > booked.txt")
        job_id = h.submit(shell(script), weight="heavy", max_attempts=1)
        up = h.up()
        try:
            h.wait_status(job_id, JobStatus.DONE, timeout=60)
        finally:
            stop(h, up)
        over = (tmp_path / "over.txt").read_text()
        assert f"job {job_id} (heavy) holds 0 subagent slot(s) on {h.host}" in over, over
        assert "max_subagents_for_weight.heavy = 2" in over and over.endswith("exit 2\n"), over
        booked = (tmp_path / "booked.txt").read_text().split()
        assert len(booked) == 2
        assert {r.job_id for r in h.store.reservation_list(h.host)} == {job_id}
    finally:
        h.close()


def test_herder_up_claims_no_job_of_a_type_pinned_to_other_hosts(tmp_path: Path,
                                                                  store_url: str):
    """A `herder up` runs a pinned type only when its --host is one of the type's hosts; a
    job of a type pinned elsewhere stays queued, nothing spent, `why` says which hosts, and
    `--exit-when-idle` does not wait for it."""
    label = h_label(tmp_path)
    h = Harness(tmp_path, store_url, extra_config=(
        f'[job_types.here]\ncommand = ["true"]\npreflight = false\nhosts = ["{label}"]\n'
        '[job_types.there]\ncommand = ["true"]\npreflight = false\nhosts = ["gpu-1", "gpu-2"]\n'))
    try:
        here = h.client.submit("here").job_id
        there = h.client.submit("there").job_id
        ran = h.cli("up", "--exit-when-idle", "--host", label, timeout=120)
        assert "pinned to other hosts (there)" in ran.stderr, ran.stderr
        done, waiting = h.job(here), h.job(there)
        assert done is not None and done.status is JobStatus.DONE
        assert waiting is not None and (waiting.status, waiting.attempt) == (JobStatus.QUEUED, 0)
        why = h.cli("why", str(there)).stdout
        assert "only one whose --host is one of its type's hosts (gpu-1, gpu-2)" in why, why
    finally:
        h.close()


def h_label(folder: Path) -> str:
    """A host label of this test's own (a `herder up` of another test claims nothing of it)."""
    return f"pin-{abs(hash(str(folder))) % 10**8}"
