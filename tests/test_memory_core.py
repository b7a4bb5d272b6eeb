"""The memory module's pure parts and its cgroup files, without processes: the budget, the
watchdog's decision, reading /proc/self/cgroup and mountinfo, detection on a fake cgroup
tree (and its graceful failure), the cgroup counters, config and wire edges."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from msgspec.structs import replace

from herder.core.errors import ConfigError
from herder.core.model import Enforcement, Job, JobStatus, MemoryUse, Outcome
from herder.core.scheduling.capacity import WeightTable
from herder.core.settings.loading import load_config
from herder.core.settings.sections import RuntimeSection
from herder.runtime.cgroup import (
    SUPERVISOR_FILE,
    CgroupParent,
    CgroupV1,
    CgroupV2,
    detect,
    mounts,
    own_cgroups,
    sweep,
)
from herder.runtime.memory import MemoryControl, Watch, budget_bytes, limit_bytes
from herder.runtime.process import process_start_time
from herder.runtime.runner_options import RunnerOptions
from herder.wire.agents import FinishBody

NOW = datetime(2026, 1, 1, tzinfo=UTC)
GB, MB = 1024**3, 1024**2
WEIGHTS = WeightTable({"light": 3.0, "heavy": 8.0, "subagent": 0.0}, ("light", "heavy"))


def a_job(weight: str = "light", ram_gb: float = 0.0) -> Job:
    return Job(7, "agent", ("claude",), False, {}, 10, weight, None, None, NOW, 3, None, {},
               None, 10.0, 600.0, JobStatus.RUNNING, 1, 0, 0, "h1", None, None, False, NOW,
               NOW, NOW, None, NOW, ram_gb=ram_gb)


# -- the pure core ------------------------------------------------------------------------------


def test_the_budget_is_what_placement_booked_else_the_weights_own():
    assert budget_bytes(a_job("light", ram_gb=4.0), WEIGHTS) == 4 * GB  # the server's booking
    assert budget_bytes(a_job("heavy"), WEIGHTS) == 8 * GB  # `herder up`: its own table
    assert budget_bytes(a_job("subagent"), WEIGHTS) is None  # books nothing: never stopped
    assert budget_bytes(a_job("unknown"), WEIGHTS) is None
    assert budget_bytes(a_job("light"), None) is None


def test_the_limit_is_the_budget_plus_the_margin():
    assert limit_bytes(100 * MB, 0.10) == 110 * MB
    assert limit_bytes(100 * MB, 0.0) == 100 * MB
    assert limit_bytes(None, 0.10) is None


def test_the_watchdog_keeps_the_peak_and_is_over_only_while_the_last_sample_is():
    watch = Watch(budget=100, limit=110, interval=2.0)
    assert watch.due(0.0) and not watch.over
    watch = watch.observe(50, now=0.0)
    assert (watch.peak, watch.over, watch.due(1.9), watch.due(2.0)) == (50, False, False, True)
    watch = watch.observe(110, now=2.0)
    assert not watch.over  # at the limit is not past it
    watch = watch.observe(111, now=4.0)
    assert (watch.peak, watch.over) == (111, True)
    watch = watch.observe(None, now=6.0)  # nothing readable: the peak stays, no stop
    assert (watch.peak, watch.over) == (111, False)
    assert not Watch(None, None, 2.0).observe(10 * GB, 0.0).over  # no budget: measured only


def test_describe_says_peak_budget_and_enforcement():
    use = MemoryUse(212 * MB, 64 * MB, Enforcement.CGROUP_V1)
    assert use.describe() == "peak RSS 212 MB of budget 64 MB (enforced by cgroup-v1)"
    assert MemoryUse(None, None, Enforcement.OFF).describe() == (
        "peak RSS unknown of budget none (enforced by off)")


# -- reading the kernel's files -----------------------------------------------------------------

V1_CGROUP = "4:memory:/process_api/abc\n3:cpuset:/\n0::/\n"
V1_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
V2_MOUNTS = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_own_cgroups_and_mounts_are_read_per_hierarchy():
    assert own_cgroups(V1_CGROUP) == {"memory": "/process_api/abc", "cpuset": "/", "": "/"}
    assert own_cgroups("0::/user.slice/run.scope\n") == {"": "/user.slice/run.scope"}
    assert mounts(V1_MOUNTS) == {"memory": (Path("/sys/fs/cgroup/memory"), "/"),
                                 "rw": (Path("/sys/fs/cgroup/memory"), "/"),
                                 "cgroup2": (Path("/sys/fs/cgroup/unified"), "/")}
    assert mounts(V2_MOUNTS) == {"cgroup2": (Path("/sys/fs/cgroup"), "/")}
    assert mounts("garbage\n\n1 2 3\n") == {}


def fake_proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc


def test_detection_finds_a_writable_v1_memory_cgroup(tmp_path: Path):
    base = tmp_path / "memory" / "process_api" / "abc"
    base.mkdir(parents=True)
    (base / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    mountinfo = V1_MOUNTS.replace("/sys/fs/cgroup/memory", str(tmp_path / "memory"))
    parent = detect(proc=fake_proc(tmp_path, V1_CGROUP, mountinfo))
    assert parent == CgroupParent(base, Enforcement.CGROUP_V1)


def test_detection_prefers_v2_with_the_memory_controller(tmp_path: Path):
    base = tmp_path / "unified" / "run.scope"
    base.mkdir(parents=True)
    (base / "cgroup.controllers").write_text("cpu memory pids\n")
    (base / "cgroup.subtree_control").write_text("memory\n")
    mountinfo = V2_MOUNTS.replace("/sys/fs/cgroup", str(tmp_path / "unified"))
    parent = detect(proc=fake_proc(tmp_path, "0::/run.scope\n", mountinfo))
    assert parent == CgroupParent(base, Enforcement.CGROUP_V2)
    assert detect(str(base)) == parent  # cgroup_root names it directly


def test_detection_fails_gracefully_to_the_watchdog(tmp_path: Path):
    # v2 mounted without the memory controller (this CI machine's unified hierarchy).
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("hugetlb\n")
    mountinfo = V2_MOUNTS.replace("/sys/fs/cgroup", str(unified))
    assert detect(proc=fake_proc(tmp_path, "0::/\n", mountinfo)) is None
    assert detect(str(tmp_path / "missing")) is None  # a cgroup_root that is not there
    assert detect(str(tmp_path)) is None  # a directory that is no cgroup
    assert detect(proc=tmp_path / "no-proc") is None  # not Linux
    control = MemoryControl(RuntimeSection(memory_enforcement="cgroup"), None, "herder-1-1-")
    assert control.mode is Enforcement.WATCHDOG
    off = MemoryControl(RuntimeSection(memory_enforcement="off"), None, "p")
    assert off.mode is Enforcement.OFF


def test_an_attempt_without_a_cgroup_is_watched_and_one_with_a_cgroup_is_limited(
        tmp_path: Path):
    parent = CgroupParent(tmp_path, Enforcement.CGROUP_V1)
    policy = RuntimeSection(memory_margin=0.5, nice={"light": 10})
    memory = MemoryControl(policy, parent, "herder-1-2-").begin(a_job(), WEIGHTS)
    assert memory.cgroup is not None and memory.cgroup.path == tmp_path / "herder-1-2-7-1"
    assert (memory.cgroup.path / "memory.limit_in_bytes").read_text() == str(int(4.5 * GB))
    assert (memory.enforcement, memory.nice, memory.watch.budget) == (
        Enforcement.CGROUP_V1, 10, 3 * GB)
    watched = MemoryControl(policy, None, "p").begin(a_job("heavy"), WEIGHTS)
    assert (watched.enforcement, watched.cgroup, watched.nice) == (Enforcement.WATCHDOG, None, 0)


def test_a_start_sweeps_the_cgroups_of_runners_that_are_gone_and_only_those(tmp_path: Path):
    own = f"herder-{os.getpid()}-{process_start_time(os.getpid())}-5-1"
    for name in (own, "herder-4194999-12-5-1", "herder-probe-77", "herder-runner"):
        (tmp_path / name).mkdir()
    assert sweep(CgroupParent(tmp_path, Enforcement.CGROUP_V1)) == 1
    assert sorted(entry.name for entry in tmp_path.iterdir()) == sorted(
        [own, "herder-probe-77", "herder-runner"])


def test_the_sweep_spares_a_dead_runners_cgroup_whose_attempt_runs_under_its_supervisor(
        tmp_path: Path):
    """A dead agent's attempt that runs on under its supervisor is the next agent's to adopt
    or kill: another runner starting on the machine meanwhile does not sweep it."""
    supervised = subprocess.Popen(["/bin/sh", "-c", "sleep 60", SUPERVISOR_FILE])
    unsupervised = subprocess.Popen(["sleep", "60"])
    try:
        for name, member in (("herder-4194999-12-5-1", supervised),
                             ("herder-4194999-12-6-1", unsupervised)):
            (tmp_path / name).mkdir()
            (tmp_path / name / "cgroup.procs").write_text(f"{member.pid}\n")
        sweep(CgroupParent(tmp_path, Enforcement.CGROUP_V1))
        assert unsupervised.wait(30) == -signal.SIGKILL
        assert supervised.poll() is None
    finally:
        for process in (supervised, unsupervised):
            process.kill()
            process.wait()


def test_the_cgroup_counters_say_whether_the_kernel_killed_for_memory(tmp_path: Path):
    v1 = CgroupV1(tmp_path / "v1")
    v1.path.mkdir()
    (v1.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    (v1.path / "memory.failcnt").write_text("12\n")
    assert not v1.oom_killed()  # the limit was reached and reclaimed, nobody killed
    (v1.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    (v1.path / "memory.max_usage_in_bytes").write_text("67108864\n")
    assert (v1.oom_killed(), v1.peak()) == (True, 64 * MB)
    (v1.path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")
    assert v1.oom_killed()  # an old kernel: no kill count, the failcnt says so
    v2 = CgroupV2(tmp_path / "v2")
    v2.path.mkdir()
    (v2.path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 0\n")
    assert not v2.oom_killed() and v2.peak() is None  # no memory.peak before Linux 5.19
    (v2.path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert v2.oom_killed()


# -- edges: config and wire ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "where"), [
    ('[runtime]\nmemory_enforcement = "strict"\n', r"runtime\.memory_enforcement"),
    ('[runtime]\nmemory_margin = -0.1\n', r"runtime\.memory_margin"),
    ('[runtime]\nnice = {light = 25}\n', r"runtime\.nice"),
    ('[runtime]\nnice = {tiny = 5}\n', r"runtime\.nice\.tiny.*unknown weight"),
])
def test_memory_keys_are_checked_naming_the_key(tmp_path: Path, text: str, where: str):
    path = tmp_path / "herder.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=where):
        load_config(path)


def test_memory_keys_reach_the_runner(tmp_path: Path):
    path = tmp_path / "herder.toml"
    path.write_text('[runtime]\nmemory_enforcement = "watchdog"\nmemory_margin = 0.25\n'
                    'memory_sample_interval = "500ms"\nnice = {light = 10}\n')
    runtime = RunnerOptions.from_settings(load_config(path).settings, "here", tmp_path).runtime
    assert (runtime.memory_enforcement, runtime.memory_margin, runtime.memory_sample_interval,
            runtime.cgroup_root, runtime.nice) == ("watchdog", 0.25, 0.5, None, {"light": 10})


def test_an_older_agent_s_finish_has_no_memory_and_a_newer_one_s_round_trips():
    old = FinishBody.model_validate({"outcome": "failed", "exit_code": 1})
    assert old.memory() is None
    use = MemoryUse(300 * MB, 64 * MB, Enforcement.WATCHDOG)
    new = FinishBody(outcome=Outcome.OOM, **FinishBody.memory_fields(use))
    assert FinishBody.model_validate_json(new.model_dump_json()).memory() == use
    assert replace(use, peak_rss_bytes=None) == FinishBody(
        outcome=Outcome.OOM, memory_budget_bytes=64 * MB,
        memory_enforcement=Enforcement.WATCHDOG).memory()
