"""An attempt's memory: measured, and kept within its weight's budget.

Every attempt's process tree is sampled through psutil (RSS of the leader and all its
descendants, plus every member of its cgroup) and its peak recorded. Where the host lets a
runner make cgroups, each attempt runs in one of its own with the limit set, so the kernel
stops it and killing the cgroup catches processes that left the session (`setsid`, double
fork, a cleared environment). Elsewhere a watchdog stops a tree that goes past its limit.
Either way the attempt ends as `oom`. The cgroups themselves are cgroup.py's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import msgspec
import psutil
from msgspec.structs import replace

from herder.core.model import Enforcement, Job, MemoryUse
from herder.core.scheduling.capacity import WeightTable
from herder.core.settings.sections import RuntimeSection
from herder.runtime.cgroup import Cgroup, CgroupParent, cgroup_name, detect, sweep

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


# -- sampling ---------------------------------------------------------------------------------


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
