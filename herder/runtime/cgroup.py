"""The cgroup adapter: an attempt's memory cgroup (v2 or v1), where a runner may make them, and
the sweep of those a dead runner left.

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
from pathlib import Path

import msgspec
import psutil

from herder.core.model import Enforcement
from herder.runtime import supervisor
from herder.runtime.process import is_zombie, process_alive

log = logging.getLogger("herder.memory")


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
        return any(psutil.pid_exists(pid) and not is_zombie(pid) for pid in self.pids())

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
