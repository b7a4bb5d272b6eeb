"""An attempt's memory: measured, and kept within its weight's budget.

Every attempt's process tree is sampled through psutil (RSS of the leader and all its
descendants, plus every member of its cgroup) and its peak recorded. Where the host lets a
runner make cgroups, each attempt runs in one of its own with the limit set, so the kernel
stops it and killing the cgroup catches processes that left the session (`setsid`, double
fork, a cleared environment). Elsewhere a watchdog stops a tree that goes past its limit.
Either way the attempt ends as `oom`.

cgroup v2 needs a writable subtree whose parent offers the memory controller (root, a
delegated subtree, `systemd-run --user --scope -p Delegate=yes`); cgroup v1 needs a writable
directory in the memory hierarchy. Detection never raises: anything missing is the watchdog.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import msgspec
import psutil
from msgspec.structs import replace

from herder.core.model import Enforcement, Job, MemoryUse
from herder.core.scheduling.capacity import WeightTable
from herder.core.settings.sections import RuntimeSection
from herder.runtime import supervisor
from herder.runtime.process import process_alive

log = logging.getLogger("herder.memory")

GB = 1024**3

# -- the pure core ----------------------------------------------------------------------------


def budget_bytes(job: Job, weights: WeightTable | None) -> int | None:
    """The attempt's budget: what its placement booked, else its weight's in this host's
    table; None (measured, never stopped) for a weight that books nothing or is unknown."""
    gigabytes = job.ram_gb
    if gigabytes <= 0 and weights is not None and weights.known(job.weight):
        gigabytes = weights.budget(job.weight)
    return int(gigabytes * GB) if gigabytes > 0 else None


def limit_bytes(budget: int | None, margin: float) -> int | None:
    """Where an attempt is stopped: its budget plus the margin (both paths alike)."""
    return None if budget is None else int(budget * (1.0 + margin))


class Watch(msgspec.Struct, frozen=True):
    """An attempt's samples so far; `observe` returns the next one."""

    budget: int | None
    limit: int | None
    interval: float
    peak: int | None = None
    next_sample: float = 0.0
    last: int | None = None

    def due(self, now: float) -> bool:
        return now >= self.next_sample

    def observe(self, rss: int | None, now: float) -> Watch:
        """One sample (None: nothing could be read) taken at monotonic `now`."""
        peak = self.peak if rss is None else max(rss, self.peak or 0)
        return replace(self, peak=peak, last=rss, next_sample=now + self.interval)

    @property
    def over(self) -> bool:
        """The last sample went past the limit: the watchdog stops the tree."""
        return self.limit is not None and self.last is not None and self.last > self.limit


def nice_for(weight: str, nice: Mapping[str, int]) -> int:
    return nice.get(weight, 0)


# -- cgroups ----------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _write(path: Path, value: str) -> bool:
    try:
        path.write_text(value)
    except OSError:
        return False
    return True


def _counter(text: str | None, key: str) -> int | None:
    """`key N` from a flat-keyed cgroup file (memory.events, memory.oom_control)."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def _number(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None


class Cgroup(abc.ABC):
    """One attempt's cgroup; every method is best effort and never raises."""

    enforcement: Enforcement

    def __init__(self, path: Path) -> None:
        self.path = path

    @abc.abstractmethod
    def limit(self, limit: int) -> bool: ...

    @abc.abstractmethod
    def peak(self) -> int | None:
        """The cgroup's peak charge (RSS and page cache), when the kernel keeps one."""

    @abc.abstractmethod
    def oom_killed(self) -> bool:
        """Whether the kernel killed a member for going past the limit."""

    def pids(self) -> list[int]:
        text = _read(self.path / "cgroup.procs") or ""
        return [int(line) for line in text.split() if line.isdigit()]

    def signal(self, sig: int) -> int:
        hits = 0
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                hits += 1
        return hits

    def kill(self) -> None:
        self.signal(signal.SIGKILL)

    def alive(self) -> bool:
        return any(psutil.pid_exists(pid) and not _zombie(pid) for pid in self.pids())

    def join_fd(self) -> int | None:
        """A descriptor the child writes `0` to, joining before it runs the job's program
        (so nothing it forks escapes)."""
        try:
            return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def remove(self) -> bool:
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


class CgroupV2(Cgroup):
    enforcement = Enforcement.CGROUP_V2

    def limit(self, limit: int) -> bool:
        _write(self.path / "memory.swap.max", "0")  # past the limit is oom, not swapping
        return _write(self.path / "memory.max", str(limit))

    def peak(self) -> int | None:
        return _number(_read(self.path / "memory.peak"))

    def oom_killed(self) -> bool:
        return (_counter(_read(self.path / "memory.events"), "oom_kill") or 0) > 0

    def kill(self) -> None:
        if not _write(self.path / "cgroup.kill", "1"):
            super().kill()


class CgroupV1(Cgroup):
    enforcement = Enforcement.CGROUP_V1

    def limit(self, limit: int) -> bool:
        _write(self.path / "memory.oom_control", "0")  # the kernel kills; nothing hangs
        ok = _write(self.path / "memory.limit_in_bytes", str(limit))
        _write(self.path / "memory.memsw.limit_in_bytes", str(limit))  # swap counts too
        return ok

    def peak(self) -> int | None:
        return _number(_read(self.path / "memory.max_usage_in_bytes"))

    def oom_killed(self) -> bool:
        killed = _counter(_read(self.path / "memory.oom_control"), "oom_kill")
        if killed is None:  # kernels before 4.13 do not count kills: the limit was hit
            killed = _number(_read(self.path / "memory.failcnt"))
        return (killed or 0) > 0


class CgroupParent(msgspec.Struct, frozen=True):
    """The directory where a runner makes its attempts' cgroups."""

    path: Path
    enforcement: Enforcement

    def make(self, name: str) -> Cgroup:
        kind = CgroupV2 if self.enforcement is Enforcement.CGROUP_V2 else CgroupV1
        return kind(self.path / name)

    def create(self, name: str, limit: int | None) -> Cgroup | None:
        """A fresh cgroup with the limit set; None when the kernel refuses."""
        cgroup = self.make(name)
        try:
            cgroup.path.mkdir()
        except FileExistsError:
            pass
        except OSError as exc:
            log.warning("cannot make cgroup %s (%s): the watchdog enforces instead",
                        cgroup.path, exc)
            return None
        if limit is not None and not cgroup.limit(limit):
            log.warning("cannot set the memory limit of cgroup %s: the watchdog enforces "
                        "instead", cgroup.path)
            cgroup.remove()
            return None
        return cgroup

    def leftovers(self, prefix: str) -> list[Cgroup]:
        try:
            names = sorted(entry.name for entry in self.path.iterdir()
                           if entry.is_dir() and entry.name.startswith(prefix))
        except OSError:
            return []
        return [self.make(name) for name in names]


def own_cgroups(text: str) -> dict[str, str]:
    """/proc/self/cgroup → hierarchy → path: `memory` for v1's, `` for v2's unified one."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            found[controller] = path
    return found


def mounts(text: str) -> dict[str, tuple[Path, str]]:
    """/proc/self/mountinfo → `cgroup2` or a v1 controller → (mount point, mount root)."""
    found: dict[str, tuple[Path, str]] = {}
    for line in text.splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point, kind = fields[3], Path(fields[4]), tail[0]
        if kind == "cgroup2":
            found.setdefault("cgroup2", (point, root))
        elif kind == "cgroup":
            for option in tail[2].split(","):
                found.setdefault(option, (point, root))
    return found


def _inside(point: Path, root: str, path: str) -> Path:
    """The directory of cgroup `path` under a mount of the hierarchy's `root`."""
    if root != "/" and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return point / path.lstrip("/")


def _probe(parent: CgroupParent, probe: bool = True) -> CgroupParent | None:
    """The parent once a trial cgroup with a limit could be made in it."""
    if not probe:
        return parent if parent.path.is_dir() else None
    trial = parent.create(f"herder-probe-{os.getpid()}", 64 * 1024**2)
    if trial is None:
        return None
    trial.remove()
    return parent


RUNNER_LEAF = "herder-runner"
"""Where runners in their own delegated v2 cgroup move, so it can hand memory down."""


def _v2_parent(base: Path, own: bool, probe: bool = True) -> CgroupParent | None:
    """`own`: base is this runner's own (delegated, non-root) cgroup. Without `probe`
    nothing is changed: only a parent already set up is found."""
    controllers = (_read(base / "cgroup.controllers") or "").split()
    if "memory" not in controllers:
        return None
    if probe and "memory" not in (_read(base / "cgroup.subtree_control") or "").split():
        if not _write(base / "cgroup.subtree_control", "+memory") and own:
            # No internal processes: a cgroup with members cannot hand controllers down.
            # In its own delegated cgroup the runner (and its guardian) move to a leaf.
            leaf = base / RUNNER_LEAF
            with contextlib.suppress(OSError):
                leaf.mkdir(exist_ok=True)
            for pid in (_read(base / "cgroup.procs") or "").split():
                _write(leaf / "cgroup.procs", pid)
            _write(base / "cgroup.subtree_control", "+memory")
        if "memory" not in (_read(base / "cgroup.subtree_control") or "").split():
            return None
    return _probe(CgroupParent(base, Enforcement.CGROUP_V2), probe)


def detect(root: str | None = None, proc: Path = Path("/proc/self"),
           probe: bool = True) -> CgroupParent | None:
    """Where this runner may make memory cgroups (v2 first, then v1); None when it may
    not (not root, read-only, no memory controller, not Linux). Never raises. Without
    `probe` nothing is tried or changed (a guardian looking for what its runner made)."""
    try:
        if root is not None:
            base = Path(root)
            if (base / "cgroup.controllers").exists():
                return _v2_parent(base, own=False, probe=probe)
            if (base / "memory.limit_in_bytes").exists():
                return _probe(CgroupParent(base, Enforcement.CGROUP_V1), probe)
            return None
        own = own_cgroups(_read(proc / "cgroup") or "")
        mounted = mounts(_read(proc / "mountinfo") or "")
        if "" in own and "cgroup2" in mounted:
            point, mount_root = mounted["cgroup2"]
            base = _inside(point, mount_root, own[""])
            if base.name == RUNNER_LEAF:  # moved there by a runner of this process tree
                base = base.parent
            found = _v2_parent(base, own=base != point, probe=probe)
            if found is not None:
                return found
        if "memory" in own and "memory" in mounted:
            point, mount_root = mounted["memory"]
            return _probe(CgroupParent(_inside(point, mount_root, own["memory"]),
                                       Enforcement.CGROUP_V1), probe)
    except Exception as exc:  # a detection problem is never the runner's failure
        log.warning("cgroup detection failed (%s: %s): the watchdog enforces memory",
                    type(exc).__name__, exc)
    return None


# -- sampling ---------------------------------------------------------------------------------


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def tree_rss(leader: int, members: Iterable[int] = ()) -> int | None:
    """RSS in bytes of the leader, all its descendants and `members`; None when none could
    be read (all gone)."""
    processes: dict[int, psutil.Process] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(leader)
        processes[root.pid] = root
        for child in root.children(recursive=True):
            processes[child.pid] = child
    for pid in members:
        with contextlib.suppress(psutil.Error):
            processes.setdefault(pid, psutil.Process(pid))
    total, read = 0, False
    for process in processes.values():
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
            read = True
    return total if read else None


# -- a runner's memory control ------------------------------------------------------------------


@dataclass
class AttemptMemory:
    """One attempt's memory: its samples and, when it has one, its cgroup."""

    watch: Watch
    enforcement: Enforcement
    cgroup: Cgroup | None = None
    nice: int = 0
    _join: int | None = None
    _ended: tuple[bool, int | None] | None = None
    """The cgroup's oom count and peak, read just before it was removed."""

    def preexec(self) -> Callable[[], None] | None:
        """What the child runs before the job's program: join the cgroup, lower its
        priority. Only os calls on a descriptor opened beforehand (safe after fork)."""
        self._join = self.cgroup.join_fd() if self.cgroup is not None else None
        if self._join is None and not self.nice:
            return None
        join, nice = self._join, self.nice

        def child() -> None:
            if join is not None:
                os.write(join, b"0")
            if nice:
                os.nice(nice)

        return child

    def launched(self) -> None:
        if self._join is not None:
            with contextlib.suppress(OSError):
                os.close(self._join)
            self._join = None

    def members(self) -> list[int]:
        return self.cgroup.pids() if self.cgroup is not None else []

    def sample(self, leader: int, now: float) -> bool:
        """Sample when due; True when the watchdog must stop the tree."""
        if not self.watch.due(now):
            return False
        self.watch = self.watch.observe(tree_rss(leader, self.members()), now)
        return self.enforcement is Enforcement.WATCHDOG and self.watch.over

    def signal(self, sig: int) -> None:
        if self.cgroup is not None:
            if sig == signal.SIGKILL:
                self.cgroup.kill()
            else:
                self.cgroup.signal(sig)

    def alive(self) -> bool:
        return self.cgroup is not None and self.cgroup.alive()

    def _final(self) -> tuple[bool, int | None]:
        if self._ended is not None:
            return self._ended
        if self.cgroup is None:
            return False, None
        return self.cgroup.oom_killed(), self.cgroup.peak()

    def oom_killed(self) -> bool:
        return self._final()[0]

    def use(self) -> MemoryUse:
        peak = self.watch.peak
        killed, charged = self._final()
        if killed and charged is not None:
            # Killed between two samples: the cgroup's own peak says how far it got.
            peak = max(peak or 0, charged)
        return MemoryUse(peak, self.watch.budget, self.enforcement)

    def close(self) -> None:
        """Once the tree is gone: what the cgroup counted is kept, then it is removed."""
        self.launched()
        if self.cgroup is not None and self._ended is None:
            self._ended = self._final()
            if not self.cgroup.remove():
                log.warning("cgroup %s not removed", self.cgroup.path)


ENFORCEMENTS = ("auto", "cgroup", "watchdog", "off")


class MemoryControl:
    """A runner's: decides once, at its start, how its attempts' memory is enforced."""

    def __init__(self, runtime: RuntimeSection, parent: CgroupParent | None,
                 prefix: str) -> None:
        self.runtime = runtime
        """[runtime]: its memory keys say how attempts' memory is enforced."""
        self.parent = parent
        self.prefix = prefix
        self.kept: set[str] = set()
        """Adopted cgroups of a dead runner that could not be renamed into this one's."""

    @classmethod
    def start(cls, runtime: RuntimeSection, prefix: str, sweep_gone: bool = True
              ) -> MemoryControl:
        """`sweep_gone` false leaves dead runners' cgroups until `sweep_gone` is called:
        an agent first adopts what its predecessor left running (`adopt`)."""
        parent = None
        if runtime.memory_enforcement in ("auto", "cgroup"):
            parent = detect(runtime.cgroup_root)
            if parent is None and runtime.memory_enforcement == "cgroup":
                log.warning("memory_enforcement is cgroup but no writable memory cgroup was "
                            "found (see docs/outcomes.md, Memory): the watchdog enforces instead")
        control = cls(runtime, parent, prefix)
        log.info("memory: %s", control.mode)
        if sweep_gone:
            control.sweep_gone()
        return control

    def sweep_gone(self) -> None:
        if self.parent is not None:
            swept = sweep(self.parent, frozenset(self.kept))
            if swept:
                log.warning("memory: removed %d cgroup(s) of runners that are gone", swept)

    def adopt(self, job: Job, weights: WeightTable | None, cgroup: str | None
              ) -> AttemptMemory:
        """The memory of an attempt a dead runner started: its cgroup, renamed into this
        runner's (so neither the sweep nor the old guardian kills it), else the watchdog."""
        budget = budget_bytes(job, weights)
        watch = Watch(budget, limit_bytes(budget, self.runtime.memory_margin),
                      self.runtime.memory_sample_interval)
        if self.parent is not None and cgroup is not None:
            old = self.parent.make(cgroup)
            new = self.parent.make(cgroup_name(self.prefix, job.id, job.attempt))
            try:
                old.path.rename(new.path)
            except OSError as exc:
                if not old.path.is_dir():
                    log.warning("cannot take over cgroup %s (%s)", old.path, exc)
                else:  # kept under its old name, spared by the sweep
                    self.kept.add(cgroup)
                    return AttemptMemory(watch, old.enforcement, old)
            else:
                return AttemptMemory(watch, new.enforcement, new)
        mode = Enforcement.OFF if self.mode is Enforcement.OFF else Enforcement.WATCHDOG
        return AttemptMemory(watch, mode, None)

    @property
    def mode(self) -> Enforcement:
        if self.runtime.memory_enforcement == "off":
            return Enforcement.OFF
        return Enforcement.WATCHDOG if self.parent is None else self.parent.enforcement

    def begin(self, job: Job, weights: WeightTable | None) -> AttemptMemory:
        budget = budget_bytes(job, weights)
        limit = limit_bytes(budget, self.runtime.memory_margin)
        watch = Watch(budget, limit, self.runtime.memory_sample_interval)
        nice = nice_for(job.weight, self.runtime.nice)
        if self.parent is not None:
            cgroup = self.parent.create(cgroup_name(self.prefix, job.id, job.attempt), limit)
            if cgroup is not None:
                return AttemptMemory(watch, cgroup.enforcement, cgroup, nice)
        mode = Enforcement.OFF if self.mode is Enforcement.OFF else Enforcement.WATCHDOG
        return AttemptMemory(watch, mode, None, nice)


def runner_prefix(pid: int, start_time: int) -> str:
    """Names a runner's attempt cgroups, so its guardian finds them after it died."""
    return f"herder-{pid}-{start_time}-"


def sweep(parent: CgroupParent, keep: frozenset[str] = frozenset()) -> int:
    """Kill and remove the attempt cgroups of runners that are gone (a runner and its
    guardian both killed): nothing of theirs may run on unsupervised or pile up. One whose
    attempt still runs under its supervisor is spared: it is a dead agent's, which the next
    agent of its host adopts or kills (herder.runtime.supervisor), whatever runner starts
    on this machine meanwhile."""
    swept = 0
    for cgroup in parent.leftovers("herder-"):
        fields = cgroup.path.name.split("-")
        if len(fields) != 5 or not all(field.isdigit() for field in fields[1:]):
            continue  # not an attempt's (a probe, a runner leaf)
        if cgroup.path.name in keep or any(map(supervises, cgroup.pids())):
            continue
        if process_alive(int(fields[1]), int(fields[2])):
            continue
        cgroup.kill()
        _wait_empty(cgroup)
        swept += cgroup.remove()
    return swept


SUPERVISOR_FILE = str(Path(supervisor.__file__).resolve())


def supervises(pid: int) -> bool:
    """Whether the process is an attempt's supervisor (its argv names the file)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
    except OSError:
        return False
    return SUPERVISOR_FILE.encode() in argv


def _wait_empty(cgroup: Cgroup) -> None:
    for _ in range(250):
        if not cgroup.alive():
            return
        time.sleep(0.02)


def cgroup_name(prefix: str, job_id: int, attempt: int) -> str:
    return f"{prefix}{job_id}-{attempt}"


def kill_leftovers(prefix: str, only: str | None = None) -> int:
    """Kill and remove the cgroups a dead (or frozen) runner left, or only the one named
    `only`: its guardian calls this after the marker scan, for escapes that scan misses."""
    parent = detect(probe=False)
    if parent is None:
        return 0
    cgroups = [cgroup for cgroup in parent.leftovers(prefix)
               if only is None or cgroup.path.name == only]
    for cgroup in cgroups:
        cgroup.kill()
    for cgroup in cgroups:
        _wait_empty(cgroup)
        cgroup.remove()
    return len(cgroups)
