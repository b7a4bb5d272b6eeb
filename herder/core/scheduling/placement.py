"""Where each queued job runs this cycle, and why every other host said no.

`place` is one pass over the queue in (priority, id) order. Each host is checked by a
pipeline of small filters (in the order `Reason` lists them); the hosts that pass are
scored (best fit or spread, the job's preferred host first, ties by label); RAM and slots
are booked as the pass goes. A job that has waited past the starvation limit and fits
nowhere holds the host it could fit on soonest, so jobs after it stop backfilling that
host's RAM. Reservations only hold back jobs behind the starving one in (priority, id)
order; nothing is carried from one pass to the next.

The pass must stay under a second at 10k hosts × 100k jobs, so it never walks
jobs × hosts:

* hosts that accept work fall into classes: hosts whose caps (allow-lists, priority floor,
  window max weight) give every queued job the same verdict. Each class keeps its open
  hosts sorted by free RAM, so a class's best host is one bisect; a job that fits many
  classes searches one merged list instead (`POOL_AFTER`);
* jobs fall into shapes (weight, job type, affinity, priority band between the floors);
  a shape's verdict per class is computed once, and once a shape finds no host every
  later job of it waits in O(1), because capacity only shrinks during a pass;
* why a job waits is worked out lazily, per shape, from the state at the end of the pass.
  That is still a true refusal for every host (capacity only shrank since the job was
  looked at) and it is the state the operator sees when asking (explanation.py words it).
"""

from __future__ import annotations

import enum
import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from operator import attrgetter

import msgspec

from herder.core.model import RAM_TOLERANCE_GB, HostRecord
from herder.core.scheduling.capacity import (
    DEFAULT_SCHEDULE,
    DEFAULT_WEIGHTS,
    NIGHT,
    SEED_SHEDDING,
    Shedding,
    WeightTable,
    WindowCaps,
    WindowSchedule,
    bookable_gb,
    capacity_ratio,
)
from herder.core.scheduling.health import HostHealth, accepts_work
from herder.core.settings.sections import DEFAULTS

BEST_FIT = "best_fit"
SPREAD = "spread"
STRATEGIES = (BEST_FIT, SPREAD)
ONE_WORKER = WindowCaps(max_workers=1)
BOUND_ELSEWHERE = "job bound to another host"
POOL_AFTER = 8
"""A shape whose jobs fit more host classes than this searches one merged list instead."""


class Reason(enum.StrEnum):
    """Why a host refused a job, in the order the filters run."""

    DRAINED = "drained"
    """The operator drained it (`herder host drain`), or its agent is draining."""
    HEALTH = "health"
    AGENT_DOWN = "agent_down"
    WINDOW_CLOSED = "window_closed"
    JOB_TYPE_NOT_ALLOWED = "job_type_not_allowed"
    JOB_TYPE_PINNED = "job_type_pinned"
    """The job's type runs only on other hosts (`[job_types.NAME] hosts`)."""
    PREFLIGHT_FAILED = "preflight_failed"
    BREAKER_OPEN = "breaker_open"
    NO_HEALTHY_ACCOUNT = "no_healthy_account"
    """Every account of the host that serves the job type is depleted, revoked or dead."""
    WEIGHT_NOT_ALLOWED = "weight_not_allowed"
    PRIORITY_FLOOR = "priority_floor"
    AFFINITY = "affinity"
    UNKNOWN_WEIGHT = "unknown_weight"
    MAX_WEIGHT = "max_weight"
    SHED = "shed"
    SLOTS_FULL = "slots_full"
    RAM = "ram"
    RESERVED = "reserved"
    FLEET_CAP = "fleet_cap"
    """The fleet runs as many jobs as `[fleet] emergency_max_workers` allows."""
    AVOIDED = "avoided"
    """Not a refusal: the job went elsewhere because this host failed to start it."""


class HostSpec(msgspec.Struct, frozen=True):
    """A host as configured: size, caps per window, and the allow-lists it enforces."""

    label: str
    ram_total_gb: float
    ram_reserved_gb: float = 0.0
    cpus: int = 1
    enabled: bool = True
    transport: str = "agent"
    prime: WindowCaps = ONE_WORKER
    night: WindowCaps = ONE_WORKER
    allowed_job_types: frozenset[str] | None = None
    allowed_weights: frozenset[str] | None = None
    priority_floor: int | None = None
    labels: frozenset[str] = frozenset()
    drained: str = "drained"
    """What `herder why` and `herder hosts` call it while it is not enabled: "drained" by
    the operator, or "agent draining"."""

    def caps(self, window: str) -> WindowCaps:
        return self.night if window == NIGHT else self.prime

    @classmethod
    def configured(cls, host: HostRecord) -> HostSpec:
        """The host as its operator configured it (`herder host add/set`, herder.toml),
        with nothing its agent says."""
        return cls(
            label=host.label, ram_total_gb=host.ram_total_gb,
            ram_reserved_gb=host.ram_reserved_gb, cpus=host.cpus, enabled=host.enabled,
            transport=str(host.transport),
            prime=WindowCaps(host.prime_max_workers, host.prime_max_weight),
            night=WindowCaps(host.night_max_workers, host.night_max_weight),
            allowed_job_types=host.allowed_job_types, allowed_weights=host.allowed_weights,
            priority_floor=host.priority_floor, labels=host.labels)


class HostLoad(msgspec.Struct, frozen=True):
    """A host right now: its health, active attempts, and GB booked by them and by
    reservations (subagent and CI slots). `agent_down` says why a host whose agent
    heartbeats is not live (None while it is, and for hosts without an agent)."""

    label: str
    health: HostHealth
    workers: int
    booked_gb: float
    agent_down: str | None = None
    blocked: Mapping[str, tuple[Reason, str]] = msgspec.field(default_factory=dict)
    """Job types this host cannot take for now, with why (its preflight for the type
    failed, its circuit breaker for the type is open)."""


class PendingJob(msgspec.Struct, frozen=True):
    """What placement needs of a queued job. `affinity` binds it to one host;
    `preferred_host` only wins ties among hosts that can take it; `avoid_host` (one that
    failed to start it) is passed over while another host can take it."""

    id: int
    priority: int
    weight: str
    job_type: str
    affinity: str | None = None
    preferred_host: str | None = None
    waiting_since: datetime | None = None
    avoid_host: str | None = None


class PlacementPolicy(msgspec.Struct, frozen=True):
    bookable_fraction: float = DEFAULTS.fleet.bookable_fraction
    strategy: str = DEFAULTS.fleet.strategy
    starvation_wait_seconds: float = DEFAULTS.fleet.starvation_wait
    shedding: Shedding = SEED_SHEDDING
    schedule: WindowSchedule = DEFAULT_SCHEDULE
    pinned: Mapping[str, frozenset[str]] = msgspec.field(default_factory=dict)
    """Job type -> the only hosts that run it (a hard affinity per type)."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")


DEFAULT_POLICY = PlacementPolicy()


class Snapshot(msgspec.Struct, frozen=True):
    """Everything one placement pass looks at. A host without a load entry counts as
    health unknown, no workers, nothing booked. Datetimes must all be aware (or all naive
    UTC)."""

    now: datetime
    jobs: Sequence[PendingJob]
    hosts: Sequence[HostSpec]
    loads: Mapping[str, HostLoad]
    weights: WeightTable = DEFAULT_WEIGHTS
    policy: PlacementPolicy = DEFAULT_POLICY
    max_workers: int | None = None
    """The fleet-wide cap on active jobs (`[fleet] emergency_max_workers`); None: none.
    Jobs already past it keep running; nothing new starts until the fleet is under it."""


class Rejection(msgspec.Struct, frozen=True):
    host: str
    reason: Reason
    detail: str


class Assignment(msgspec.Struct, frozen=True):
    job_id: int
    host: str


class Plan(msgspec.Struct, frozen=True):
    """The outcome of one pass.

    `assignments` are in the order they were decided. `waiting` has, for every job not
    placed, one rejection per host in the snapshot's host order; jobs of one shape share
    one tuple, and the tuples are built on first access. `reservations` maps a host to the
    starving job it is held for. `avoided` names, per placed job, the host it would have
    gone to but for having failed to start it.
    """

    assignments: tuple[Assignment, ...]
    waiting: Mapping[int, tuple[Rejection, ...]]
    reservations: Mapping[str, int]
    avoided: Mapping[int, Rejection] = msgspec.field(default_factory=dict)


# --- the pass -------------------------------------------------------------------------


class _Host:
    """A host's mutable state during one pass (never escapes `place`)."""

    __slots__ = (
        "agent_down",
        "alive",
        "blocked",
        "bookable",
        "free",
        "group",
        "health",
        "index",
        "key",
        "label",
        "max_weight",
        "max_workers",
        "open",
        "rank",
        "reserved_for",
        "slots",
        "spec",
    )

    def __init__(
        self, spec: HostSpec, index: int, rank: int, load: HostLoad | None, cycle: _Cycle
    ) -> None:
        caps = spec.caps(cycle.window)
        self.spec = spec
        self.index = index
        self.label = spec.label
        self.rank = rank
        self.health = load.health if load is not None else HostHealth.UNKNOWN
        self.agent_down = load.agent_down if load is not None else None
        self.blocked = load.blocked if load is not None else {}
        self.max_workers = max(0, caps.max_workers)
        self.max_weight = caps.max_weight
        self.bookable = bookable_gb(spec.ram_total_gb, spec.ram_reserved_gb, cycle.fraction)
        self.free = self.bookable - (load.booked_gb if load is not None else 0.0)
        self.slots = self.max_workers - (load.workers if load is not None else 0)
        self.alive = (spec.enabled and accepts_work(self.health) and self.agent_down is None
                      and self.max_workers > 0)
        self.open = self.alive and self.slots > 0
        self.group = -1
        self.key: tuple[float, int] = (0.0, 0)
        self.reserved_for: int | None = None


class _Shape:
    """Jobs that every filter treats alike; the preferred host is per job, not per shape."""

    __slots__ = (
        "affinity",
        "band",
        "budget",
        "dead",
        "group_set",
        "groups",
        "job_type",
        "known",
        "lists",
        "need",
        "priority",
        "rejections",
        "reserve_dead",
        "shed_ok",
        "target",
        "threshold",
        "weight",
    )

    def __init__(
        self, job: PendingJob, band: int, weights: WeightTable, shed_max: str | None
    ) -> None:
        self.band = band
        self.weight = job.weight
        self.job_type = job.job_type
        self.affinity = job.affinity
        self.priority = job.priority
        self.known = weights.known(job.weight)
        self.budget = weights.budget(job.weight) if self.known else 0.0
        self.need = self.budget - RAM_TOLERANCE_GB
        self.threshold = (self.need,)
        self.shed_ok = weights.allows(shed_max, job.weight)
        self.groups: list[int] = []
        self.lists: list[list[tuple[float, int]]] = []
        self.group_set: frozenset[int] = frozenset()
        self.target: _Host | None = None
        self.dead = False
        self.reserve_dead = False
        self.rejections: tuple[Rejection, ...] | None = None


_ClassKey = tuple[frozenset[str], frozenset[str], int, frozenset[str]]
"""Job types allowed, weights allowed, floor (as a band of queued priorities), weights under
the window's max weight — each as far as the queued jobs can tell them apart."""


class _Cycle:
    """One placement pass. Mutable inside, but nothing mutable leaves `place`."""

    def __init__(self, snapshot: Snapshot) -> None:
        policy = snapshot.policy
        self.snapshot = snapshot
        self.weights = snapshot.weights
        self.window = policy.schedule.window_at(snapshot.now)
        self.fraction = policy.bookable_fraction
        self.best_fit = policy.strategy == BEST_FIT

        labels = sorted(spec.label for spec in snapshot.hosts)
        rank_of = {label: rank for rank, label in enumerate(labels)}
        if len(rank_of) != len(labels):
            raise ValueError("host labels must be unique")
        loads = snapshot.loads
        self.hosts = [_Host(spec, index, rank_of[spec.label], loads.get(spec.label), self)
                      for index, spec in enumerate(snapshot.hosts)]
        self.by_label = {host.label: host for host in self.hosts}
        self.by_rank = sorted(self.hosts, key=attrgetter("rank"))

        self.ratio = fleet_capacity(snapshot.hosts, loads, self.window)
        self.fleet_running = sum(load.workers for load in loads.values())
        self.fleet_room: int | None = (None if snapshot.max_workers is None else
                                       max(0, snapshot.max_workers - self.fleet_running))
        self.shed_max = policy.shedding.max_weight(self.ratio)
        self.shed_detail = f"fleet at {self.ratio:.0%} capacity, max weight {self.shed_max}"

        # Classes of hosts that accept work and give every queued job the same verdict.
        self.queue_types = frozenset(job.job_type for job in snapshot.jobs)
        self.pinned = {job_type: (hosts, f"job type {job_type} runs only on "
                                         f"{', '.join(sorted(hosts))}")
                       for job_type, hosts in policy.pinned.items()
                       if job_type in self.queue_types}
        self.queue_weights = frozenset(job.weight for job in snapshot.jobs)
        self.queue_priorities = sorted({job.priority for job in snapshot.jobs})
        self.capped: dict[str | None, frozenset[str]] = {}
        class_of: dict[_ClassKey, int] = {}
        self.class_keys: list[_ClassKey] = []
        self.members: list[list[_Host]] = []
        self.lists: list[list[tuple[float, int]]] = []
        self.holders: list[list[list[tuple[float, int]]]] = []
        self.pools: dict[tuple[int, ...], list[tuple[float, int]]] = {}
        self.free_slots = 0
        for host in self.by_rank:
            if not host.alive:
                continue
            class_key = self._class_key(host)
            group = class_of.setdefault(class_key, len(class_of))
            if group == len(self.members):
                self.class_keys.append(class_key)
                self.members.append([])
                self.lists.append([])
                self.holders.append([self.lists[group]])
            host.group = group
            self.members[group].append(host)
            if host.open:
                host.key = self._key(host)
                self.lists[group].append(host.key)
                self.free_slots += host.slots
        for keys in self.lists:
            keys.sort()
        self.floors = sorted({spec.priority_floor for spec in snapshot.hosts
                              if spec.priority_floor is not None})
        self.heaps: dict[tuple[tuple[int, ...], float], list[tuple[float, int]]] = {}
        self.reservations: dict[str, int] = {}
        self.early: dict[tuple[str, str, int], list[Rejection | None]] = {}
        self.interned: dict[tuple[int, Reason, str], Rejection] = {}
        self.bound_elsewhere: list[Rejection] | None = None

    def _class_key(self, host: _Host) -> _ClassKey:
        """The host's static caps as far as the queued jobs can tell them apart, so hosts
        configured one by one still fall into few classes."""
        spec = host.spec
        types = self.queue_types if spec.allowed_job_types is None else (
            self.queue_types & spec.allowed_job_types)
        if host.blocked:
            types = types.difference(host.blocked)
        if self.pinned:
            types = types.difference(job_type for job_type, (hosts, _) in self.pinned.items()
                                     if spec.label not in hosts)
        weights = self.queue_weights if spec.allowed_weights is None else (
            self.queue_weights & spec.allowed_weights)
        floor = 0 if spec.priority_floor is None else bisect_left(
            self.queue_priorities, spec.priority_floor)
        capped = self.capped.get(host.max_weight)
        if capped is None:
            capped = self.capped[host.max_weight] = frozenset(
                weight for weight in self.queue_weights
                if self.weights.allows(host.max_weight, weight))
        return (types, weights, floor, capped)

    def _key(self, host: _Host) -> tuple[float, int]:
        """Sort key in a class list: the first key that fits is the best host."""
        return (host.free, host.rank) if self.best_fit else (-host.free, host.rank)

    # filters ------------------------------------------------------------------------

    def early_refusal(self, host: _Host, shape: _Shape) -> tuple[Reason, str] | None:
        """The host-side filters that ignore where the job is bound, in `Reason` order."""
        spec = host.spec
        if not spec.enabled:
            return Reason.DRAINED, spec.drained
        if not accepts_work(host.health):
            return Reason.HEALTH, ("down" if host.health is HostHealth.DOWN
                                   else f"health {host.health}")
        if host.agent_down is not None:
            return Reason.AGENT_DOWN, host.agent_down
        if host.max_workers <= 0:
            return Reason.WINDOW_CLOSED, ("closed at night" if self.window == NIGHT
                                          else "closed in prime time")
        if spec.allowed_job_types is not None and shape.job_type not in spec.allowed_job_types:
            return Reason.JOB_TYPE_NOT_ALLOWED, f"refuses job type {shape.job_type}"
        pinned = self.pinned.get(shape.job_type)
        if pinned is not None and spec.label not in pinned[0]:
            return Reason.JOB_TYPE_PINNED, pinned[1]
        blocked = host.blocked.get(shape.job_type)
        if blocked is not None:
            return blocked
        if spec.allowed_weights is not None and shape.weight not in spec.allowed_weights:
            return Reason.WEIGHT_NOT_ALLOWED, f"refuses weight {shape.weight}"
        if spec.priority_floor is not None and shape.priority < spec.priority_floor:
            return Reason.PRIORITY_FLOOR, f"priority floor {spec.priority_floor}"
        return None

    def static_refusal(self, host: _Host, shape: _Shape) -> tuple[Reason, str] | None:
        """Every filter that does not change during a pass, in `Reason` order."""
        early = self.early_refusal(host, shape)
        if early is not None:
            return early
        if shape.affinity is not None and shape.affinity != host.label:
            return Reason.AFFINITY, BOUND_ELSEWHERE
        if not shape.known:
            return Reason.UNKNOWN_WEIGHT, f"unknown weight {shape.weight}"
        if not self.weights.allows(host.max_weight, shape.weight):
            return Reason.MAX_WEIGHT, f"max weight {host.max_weight}"
        if not shape.shed_ok:
            return Reason.SHED, self.shed_detail
        return None

    def refusal(self, host: _Host, shape: _Shape) -> tuple[Reason, str]:
        """Why `host` refuses the shape at the end of the pass."""
        static = self.static_refusal(host, shape)
        if static is not None:
            return static
        if self.fleet_room == 0:
            return Reason.FLEET_CAP, (f"{self.fleet_running} running, fleet cap "
                                      f"{self.snapshot.max_workers}")
        if host.slots <= 0:
            used = host.max_workers - host.slots
            return Reason.SLOTS_FULL, f"{used}/{host.max_workers} workers"
        if host.free < shape.need:
            return Reason.RAM, ram_detail(host.free, shape.budget)
        if host.reserved_for is not None:
            return Reason.RESERVED, f"held for job {host.reserved_for}"
        raise AssertionError(f"placement invariant broken: {host.label} fits a waiting job")

    def rejections(self, shape: _Shape) -> tuple[Rejection, ...]:
        """One rejection per host, in the snapshot's order.

        Bound jobs are the many small shapes (one per target host), so their tuples reuse
        the interned early refusals and one shared "bound elsewhere" rejection per host.
        """
        early = self._early_rejections(shape)
        if shape.affinity is None:
            return tuple(
                rejection if rejection is not None
                else Rejection(host.label, *self.refusal(host, shape))
                for rejection, host in zip(early, self.hosts, strict=True)
            )
        if self.bound_elsewhere is None:
            self.bound_elsewhere = [Rejection(host.label, Reason.AFFINITY, BOUND_ELSEWHERE)
                                    for host in self.hosts]
        out = [rejection if rejection is not None else bound
               for rejection, bound in zip(early, self.bound_elsewhere, strict=True)]
        target = self.by_label.get(shape.affinity)
        if target is not None and early[target.index] is None:
            out[target.index] = Rejection(target.label, *self.refusal(target, shape))
        return tuple(out)

    def _early_rejections(self, shape: _Shape) -> list[Rejection | None]:
        key = (shape.job_type, shape.weight, shape.band)
        early = self.early.get(key)
        if early is None:
            early = []
            for host in self.hosts:
                refusal = self.early_refusal(host, shape)
                if refusal is None:
                    early.append(None)
                    continue
                interned_key = (host.index, *refusal)
                rejection = self.interned.get(interned_key)
                if rejection is None:
                    rejection = self.interned[interned_key] = Rejection(host.label, *refusal)
                early.append(rejection)
            self.early[key] = early
        return early

    # the pass -----------------------------------------------------------------------

    def shape(self, job: PendingJob, band: int) -> _Shape:
        shape = _Shape(job, band, self.weights, self.shed_max)
        if shape.affinity is None:
            shape.groups = self._feasible_classes(shape)
            if len(shape.groups) > POOL_AFTER:
                shape.lists = [self._pool(tuple(shape.groups))]
            else:
                shape.lists = [self.lists[group] for group in shape.groups]
            shape.group_set = frozenset(shape.groups)
            shape.dead = not shape.groups
        else:
            target = self.by_label.get(shape.affinity)
            if target is not None and self.static_refusal(target, shape) is None:
                shape.target = target
            shape.dead = shape.target is None
        shape.reserve_dead = shape.dead
        return shape

    def _feasible_classes(self, shape: _Shape) -> list[int]:
        """The classes whose hosts pass every static filter for an unbound shape: the same
        verdict as `static_refusal`, read off the class keys (one set lookup per cap)."""
        if not (shape.known and shape.shed_ok):
            return []
        job_type, weight = shape.job_type, shape.weight
        band = bisect_left(self.queue_priorities, shape.priority)
        return [group for group, (types, weights, floor, capped) in enumerate(self.class_keys)
                if job_type in types and weight in weights and floor <= band
                and weight in capped]

    def _pool(self, groups: tuple[int, ...]) -> list[tuple[float, int]]:
        """One sorted list over the open hosts of many classes, kept up to date by `book`."""
        pool = self.pools.get(groups)
        if pool is None:
            pool = self.pools[groups] = sorted(key for group in groups
                                               for key in self.lists[group])
            for group in groups:
                self.holders[group].append(pool)
        return pool

    def choose(self, shape: _Shape, preferred: str | None,
               avoid: str | None = None) -> _Host | None:
        """The host this job goes to, or None when no host can take it now. The host to
        avoid is taken only when no other can."""
        need = shape.need
        if preferred is not None and preferred != avoid:
            host = self.by_label.get(preferred)
            if (host is not None and host.open and host.free >= need
                    and (host is shape.target if shape.affinity is not None
                         else host.group in shape.group_set)):
                return host
        if shape.affinity is not None:
            target = shape.target
            if target is not None and target.open and target.free >= need:
                return target
            return None
        avoided = self.by_label.get(avoid) if avoid is not None else None
        skip = avoided.key if avoided is not None and avoided.open else None
        best = self._best(shape, skip)
        if best is None and skip is not None:
            best = self._best(shape, None)
        return None if best is None else self.by_rank[best[1]]

    def _best(self, shape: _Shape, skip: tuple[float, int] | None) -> tuple[float, int] | None:
        """The best open host's key over the shape's lists, passing over `skip`."""
        best: tuple[float, int] | None = None
        if self.best_fit:
            threshold = shape.threshold
            for keys in shape.lists:
                index = bisect_left(keys, threshold)
                if index < len(keys) and keys[index] == skip:
                    index += 1
                if index < len(keys):
                    key = keys[index]
                    if best is None or key < best:
                        best = key
        else:
            ceiling = -shape.need
            for keys in shape.lists:
                index = 1 if keys and keys[0] == skip else 0
                if index < len(keys):
                    key = keys[index]
                    if key[0] <= ceiling and (best is None or key < best):
                        best = key
        return best

    def book(self, host: _Host, budget: float) -> None:
        old = host.key
        host.free -= budget
        host.slots -= 1
        self.free_slots -= 1
        if host.slots > 0:
            new = host.key = self._key(host)
            for keys in self.holders[host.group]:
                del keys[bisect_left(keys, old)]
                insort(keys, new)
        else:
            host.open = False
            for keys in self.holders[host.group]:
                del keys[bisect_left(keys, old)]

    def reserve(self, shape: _Shape, job_id: int) -> None:
        """Hold the host where a starving job could fit soonest, so smaller jobs stop
        backfilling the RAM it waits for."""
        chosen: _Host | None = None
        if shape.affinity is not None:
            target = shape.target
            if (target is not None and target.reserved_for is None
                    and target.bookable >= shape.need):
                chosen = target
        else:
            best: tuple[float, int] | None = None
            groups = shape.groups
            # Like `choose`: one heap per class when they are few, one merged heap if many.
            for key in ([(group,) for group in groups] if len(groups) <= POOL_AFTER
                        else [tuple(groups)]):
                heap = self._heap(key, shape)
                if heap and (best is None or heap[0] < best):
                    best = heap[0]
            if best is not None:
                chosen = self.by_rank[best[1]]
        if chosen is None:
            shape.reserve_dead = True
            return
        chosen.reserved_for = job_id
        self.reservations[chosen.label] = job_id
        if chosen.open:
            for keys in self.holders[chosen.group]:
                del keys[bisect_left(keys, chosen.key)]
            self.free_slots -= chosen.slots
            chosen.open = False

    def _heap(self, groups: tuple[int, ...], shape: _Shape) -> list[tuple[float, int]]:
        """Unreserved hosts of these classes big enough for the shape, most free RAM on top.

        Entries go stale as RAM is booked; free RAM only falls during a pass, so a stale
        entry is re-pushed with its current value and the top is exact once it is fresh.
        """
        heap = self.heaps.get((groups, shape.budget))
        if heap is None:
            heap = [(-host.free, host.rank) for group in groups for host in self.members[group]
                    if host.reserved_for is None and host.bookable >= shape.need]
            heapq.heapify(heap)
            self.heaps[(groups, shape.budget)] = heap
        while heap:
            negative_free, rank = heap[0]
            host = self.by_rank[rank]
            if host.reserved_for is not None:
                heapq.heappop(heap)
            elif -negative_free != host.free:
                heapq.heapreplace(heap, (-host.free, rank))
            else:
                break
        return heap

    def run(self) -> Plan:
        snapshot = self.snapshot
        # Two stable sorts on plain ints beat one on (priority, id) tuples, and are nearly
        # free when the store already returns the queue in that order.
        jobs = sorted(snapshot.jobs, key=attrgetter("id"))
        jobs.sort(key=attrgetter("priority"))
        cutoff = snapshot.now - timedelta(seconds=snapshot.policy.starvation_wait_seconds)
        shapes: dict[tuple[str, str, str | None, int], _Shape] = {}
        band_of: dict[int, int] = {}
        floors = self.floors
        assignments: list[Assignment] = []
        avoided: dict[int, Rejection] = {}
        waiting: dict[int, _Shape] = {}
        for job in jobs:
            priority = job.priority
            band = band_of.get(priority)
            if band is None:
                band = band_of[priority] = bisect_right(floors, priority)
            key = (job.weight, job.job_type, job.affinity, band)
            shape = shapes.get(key)
            if shape is None:
                shape = shapes[key] = self.shape(job, band)
            if not shape.dead:
                host = (self.choose(shape, job.preferred_host, job.avoid_host)
                        if self.free_slots > 0 and self.fleet_room != 0 else None)
                if host is not None:
                    if job.avoid_host is not None and host.label != job.avoid_host:
                        self._note_avoided(shape, job, avoided)
                    self.book(host, shape.budget)
                    if self.fleet_room is not None:
                        self.fleet_room -= 1
                        self.fleet_running += 1
                    assignments.append(Assignment(job.id, host.label))
                    continue
                shape.dead = True
            waiting[job.id] = shape
            since = job.waiting_since
            if since is not None and since <= cutoff and not shape.reserve_dead:
                self.reserve(shape, job.id)
        placed = {assignment.job_id for assignment in assignments}
        if len(placed) + len(waiting) != len(jobs) or not placed.isdisjoint(waiting):
            raise ValueError("job ids must be unique")
        return Plan(tuple(assignments), _Waiting(self, waiting), dict(self.reservations),
                    avoided)

    def _note_avoided(self, shape: _Shape, job: PendingJob,
                      avoided: dict[int, Rejection]) -> None:
        """Record the host a job was steered away from, if it would have gone there."""
        would = self.choose(shape, job.preferred_host)
        if would is not None and would.label == job.avoid_host:
            avoided[job.id] = Rejection(would.label, Reason.AVOIDED,
                                        "its last attempt there ended for the host's "
                                        "reasons; another host fits")


class _Waiting(Mapping[int, tuple[Rejection, ...]]):
    """Job id → rejections, built per shape on first access and then shared."""

    __slots__ = ("_cycle", "_shapes")

    def __init__(self, cycle: _Cycle, shapes: dict[int, _Shape]) -> None:
        self._cycle = cycle
        self._shapes = shapes

    def __getitem__(self, job_id: int) -> tuple[Rejection, ...]:
        shape = self._shapes[job_id]
        if shape.rejections is None:
            shape.rejections = self._cycle.rejections(shape)
        return shape.rejections

    def __iter__(self) -> Iterator[int]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._shapes

    def __repr__(self) -> str:
        return f"<{len(self._shapes)} waiting jobs>"


HOST_UNABLE = frozenset({Reason.DRAINED, Reason.HEALTH, Reason.AGENT_DOWN,
                         Reason.WINDOW_CLOSED, Reason.PREFLIGHT_FAILED, Reason.BREAKER_OPEN,
                         Reason.NO_HEALTHY_ACCOUNT})
"""Refusals that say the host cannot run work now, not that this job does not suit it or
that the host is busy."""


def stopped(plan: Plan) -> dict[str, str] | None:
    """When work is queued and nothing could be placed because no host is able to run any
    of it (down, closed, drained, failing its preflight, breaker open), each host and why;
    None otherwise (work was placed, or waits only for capacity or a suitable host)."""
    if plan.assignments or not plan.waiting:
        return None
    # Jobs of one shape share their rejections' tuple: weigh each tuple once by its jobs
    # instead of walking jobs x hosts.
    shared: dict[int, tuple[tuple[Rejection, ...], int]] = {}
    for job_id in plan.waiting:
        rejections = plan.waiting[job_id]
        _, jobs = shared.get(id(rejections), (rejections, 0))
        shared[id(rejections)] = (rejections, jobs + 1)
    why: dict[str, dict[str, int]] = {}
    for rejections, jobs in shared.values():
        for rejection in rejections:
            if rejection.reason not in HOST_UNABLE:
                return None
            counts = why.setdefault(rejection.host, {})
            counts[rejection.detail] = counts.get(rejection.detail, 0) + jobs
    return {host: max(sorted(details), key=lambda detail: details[detail])
            for host, details in sorted(why.items())} or None


def fleet_capacity(hosts: Sequence[HostSpec], loads: Mapping[str, HostLoad],
                   window: str) -> float:
    """The capacity ratio: the share of the enabled hosts' slots in this window that
    sit on hosts accepting work (shedding reads it; `/queue` and `/metrics` show it)."""
    enabled_slots = healthy_slots = 0
    for spec in hosts:
        if not spec.enabled:
            continue
        slots = max(0, spec.caps(window).max_workers)
        enabled_slots += slots
        load = loads.get(spec.label)
        if load is not None and accepts_work(load.health) and load.agent_down is None:
            healthy_slots += slots
    return capacity_ratio(healthy_slots, enabled_slots)


def place(snapshot: Snapshot) -> Plan:
    """Decide where each queued job runs this cycle; see the module docstring."""
    return _Cycle(snapshot).run()


def ram_detail(free_gb: float, budget_gb: float) -> str:
    shown = 0.0 if -0.05 < free_gb < 0.05 else free_gb
    return f"{shown:.1f} GB free, needs {budget_gb:g}"
