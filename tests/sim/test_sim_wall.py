"""The information wall: nothing a scheduler or an overlay receives leads to the ground truth.

Every object a policy is handed in a real run (job snapshots, the lists of them, the overlay's clock,
the overlay's own state after the run) is attacked with the bypasses an audit used on the old
read-only views, and the test fails if any reaches a ``JobTruth``, the ``Workload``, the ``JobTable``, the
``Simulation`` or one of its parts:

* attribute names: the old name-mangled slots (``_JobView__job``, ``_JobView__sim``), ``job``,
  ``truth``, ``spec``, ``sim``, ``__dict__``, read both normally and with ``object.__getattribute__``
  (which skips a class's ``__getattr__`` guard);
* slot descriptors: every ``__slots__`` entry of the object's classes, read through the descriptor;
* ``gc.get_referents`` walked breadth-first until nothing new is reached (a snapshot reaches about
  8,000 objects: its class, the class's functions, their module's globals, ...; module objects are not
  entered: they are code, shared by every run, not this run's state);
* ``gc.get_referrers`` of a snapshot and of the list a scheduler is given, from inside the call;
* closures and globals: ``__closure__`` cells and the ``__globals__`` values of every function
  reachable from the clock (the old clock was ``lambda: queue.now``, a closure over the engine);
* an ``order()`` scheduler (LossAware) attacks the lists of snapshots it is given, inside the call;
* a cheating SRTF-Est and a cheating overlay run end to end trying all of the above to read true
  durations and hacking labels; they find nothing, so their runs equal the honest ones.

Not defended in-process, by design (documented in :mod:`platform_sim.views`): code in the same
interpreter can walk the call stack (``sys._getframe().f_back.f_locals``), scan every object
(``gc.get_objects``), ask who refers to the policy object itself (``gc.get_referrers(self)`` finds
the engine, which must hold the policy to call it), or rebuild the workload with the public
``generate_workload``. Those need the process boundary and the secret salt of the sealed mode
(``platform-sim run --sealed``), which costs a child process per run and a round trip per eval:
``tests/sim/test_sim_sealed.py`` runs each of them as a real overlay, in-process (it reaches the truth)
and sealed (it does not).
"""

from __future__ import annotations

import gc
import types
from collections.abc import Iterator
from typing import Any

import pytest

from platform_sim.cluster import Cluster
from platform_sim.config import load_config
from platform_sim.dispatch import Dispatcher
from platform_sim.engine import Simulation
from platform_sim.events import EventQueue
from platform_sim.jobs import JobTable, Timing
from platform_sim.overlays import DetectorOverlay, Overlay, create_overlay
from platform_sim.schedulers import LossAware, SRTFEst, create_scheduler
from platform_sim.views import JobSnapshot, VirtualClock
from platform_sim.workload import JobSpec, JobTruth, Workload, generate_workload

FORBIDDEN = (JobTruth, Workload, JobTable, Simulation, Dispatcher, JobSpec, EventQueue, Cluster, Timing)
NAMES = ("_JobView__job", "_JobView__sim", "_JobSnapshot__job", "_VirtualClock__sim", "job", "_job", "truth",
         "spec", "sim", "simulation", "queue", "workload", "__dict__", "__closure__", "__wrapped__")


def walk(root: Any, depth: int = 40, limit: int = 500_000) -> list[str]:
    """Forbidden objects reachable from ``root`` by ``gc.get_referents``, breadth-first.

    Near objects come first; past ``limit`` objects the walk is into the rest of the process's heap
    (through class and function globals), whose size depends on what else the test session loaded
    (torch, transformers, ...): it stops there, with what it found."""
    seen, frontier, found = {id(root)}, [root], []
    for level in range(1, depth + 1):
        if not frontier:
            break
        nxt = []
        for obj in frontier:
            for ref in gc.get_referents(obj):
                if id(ref) in seen:
                    continue
                seen.add(id(ref))
                if isinstance(ref, FORBIDDEN):
                    found.append(f"{type(ref).__name__} at depth {level}")
                if not isinstance(ref, types.ModuleType):
                    nxt.append(ref)
        frontier = nxt
        if len(seen) > limit:
            break
    return found


def named(obj: Any) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` for every name in NAMES that ``getattr`` or ``object.__getattribute__`` answers."""
    for name in NAMES:
        for get in (getattr, object.__getattribute__):
            try:
                yield name, get(obj, name)
            except (AttributeError, TypeError):
                continue


def by_name(obj: Any) -> list[str]:
    """Forbidden objects got through attribute names and slot descriptors."""
    found = []
    for name, value in named(obj):
        found += [f"{name}: {x}" for x in walk(value, depth=2)]
        if isinstance(value, FORBIDDEN):
            found.append(f"{name} -> {type(value).__name__}")
    for cls in type(obj).__mro__:
        for slot in cls.__dict__.get("__slots__", ()):
            descriptor = cls.__dict__.get(slot)
            if hasattr(descriptor, "__get__"):
                try:
                    value = descriptor.__get__(obj, cls)
                except AttributeError:
                    continue
                if isinstance(value, FORBIDDEN):
                    found.append(f"slot {cls.__name__}.{slot} -> {type(value).__name__}")
    return found


def functions_of(obj: Any) -> list[types.FunctionType]:
    """Every Python function reachable from ``obj``'s class (methods, bound or not)."""
    out = []
    for cls in type(obj).__mro__:
        for value in vars(cls).values():
            fn = getattr(value, "__func__", value)
            if isinstance(fn, types.FunctionType):
                out.append(fn)
    return out


def closures_and_globals(obj: Any) -> list[str]:
    found = []
    for fn in functions_of(obj) + ([obj] if isinstance(obj, types.FunctionType) else []):
        for cell in fn.__closure__ or ():
            found += [f"{fn.__qualname__} closure: {x}" for x in walk(cell, depth=4)]
        for name, value in fn.__globals__.items():
            if isinstance(value, FORBIDDEN):
                found.append(f"{fn.__qualname__} global {name} -> {type(value).__name__}")
            elif isinstance(value, (list, dict, tuple, set)):
                found += [f"{fn.__qualname__} global {name}: {x}" for x in walk(value, depth=3)]
    return found


def referrers(obj: Any, depth: int = 2) -> list[str]:
    """Forbidden objects among the referrers of ``obj`` (and of their referrers), frames excepted."""
    found, frontier = [], [obj]
    for _ in range(depth):
        nxt = []
        for o in frontier:
            for ref in gc.get_referrers(o):
                if isinstance(ref, types.FrameType) or ref is frontier or ref is nxt:
                    continue  # the call stack is not defended (see the module docstring)
                if isinstance(ref, FORBIDDEN):
                    found.append(f"referrer {type(ref).__name__}")
                nxt.append(ref)
        frontier = nxt
    return found


def attack(obj: Any) -> list[str]:
    return by_name(obj) + walk(obj) + closures_and_globals(obj)


# ----------------------------------------------------------------------------- what policies receive
class Recorder(SRTFEst):
    """SRTF-Est that keeps every snapshot it is given (and the referrers of a few, seen in the call)."""

    def __init__(self) -> None:
        self.seen: list[JobSnapshot] = []
        self.leaks: list[str] = []

    def priority(self, job):
        self.seen.append(job)
        if len(self.seen) <= 5:
            self.leaks += referrers(job)
        return super().priority(job)


class OrderRecorder(LossAware):
    """LossAware (an ``order()`` scheduler) that attacks the list of snapshots it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.leaks: list[str] = []

    def order(self, jobs, now):
        self.calls += 1
        if self.calls <= 5:
            self.leaks += walk(jobs) + referrers(jobs) + [x for j in jobs for x in by_name(j)]
        return super().order(jobs, now)


class OverlayRecorder(DetectorOverlay):
    """The EvalStop overlay, keeping what the engine hands it."""

    def __init__(self) -> None:
        super().__init__("decline", {"k": 2}, "all", name="evalstop")
        self.received: list[Any] = []

    def attach(self, clock, n_evals):
        self.received.append(clock)
        super().attach(clock, n_evals)

    def on_arrival(self, job):
        self.received.append(job)
        super().on_arrival(job)

    def on_eval(self, job, step, score, loss, proxy):  # snapshots at eval time too (reaches on_eval_id)
        self.received += [job, step, score, loss, proxy]
        return super().on_eval(job, step, score, loss, proxy)


@pytest.fixture(scope="module")
def recorded():
    cfg = load_config().replace(**{"workload.n_jobs": 60})
    wl = generate_workload(cfg, 0)
    sched, overlay = Recorder(), OverlayRecorder()
    Simulation(wl, cfg, sched, overlay).run()
    order_sched = OrderRecorder()
    Simulation(wl, cfg, order_sched, create_overlay("none", wl)).run()
    return sched, overlay, order_sched


def test_the_walk_finds_what_the_old_views_leaked():
    """Positive controls: the attacks detect a leak when there is one."""
    cfg = load_config().replace(**{"workload.n_jobs": 3})
    wl = generate_workload(cfg, 0)
    sim = Simulation(wl, cfg, create_scheduler("fifo"), create_overlay("none", wl))
    queue = sim.queue

    class OldView:  # the shape of the old JobView: slots holding the job and the simulation's clock
        __slots__ = ("_JobView__job", "_JobView__sim")

    old = OldView()
    object.__setattr__(old, "_JobView__job", sim.table)
    object.__setattr__(old, "_JobView__sim", queue)
    assert by_name(old) and walk(old)
    assert closures_and_globals(lambda: queue.now)  # the old coordinator clock
    assert referrers(sim.table.scores)  # the observed scores' referrers include the job table


def test_snapshots_reach_nothing(recorded):
    sched, overlay, _ = recorded
    snapshots = sched.seen + [x for x in overlay.received if isinstance(x, JobSnapshot)]
    assert len(snapshots) > 100
    running = [s for s in snapshots if s.running and s.evals_done]
    waiting = [s for s in snapshots if not s.running and s.evals_done]
    assert running and waiting  # a snapshot of a running job and of a preempted one are among them
    for snap in [snapshots[0], running[0], waiting[0]]:  # the full walk reaches the same class objects
        assert attack(snap) == []
    for snap in snapshots[:: max(1, len(snapshots) // 40)]:
        assert type(snap) is JobSnapshot
        assert by_name(snap) == []
    # plain values only: no field holds anything but numbers, strings, bools and tuples of numbers
    for snap in snapshots:
        for value in snap:
            assert type(value) in (int, float, str, bool, tuple), type(value)
            if type(value) is tuple:
                assert all(type(x) in (float, tuple) for x in value)
    assert not hasattr(snapshots[0], "__dict__")


def test_referrers_inside_the_calls_reach_nothing(recorded):
    sched, _, order_sched = recorded
    assert sched.leaks == []
    assert order_sched.calls > 0 and order_sched.leaks == []


def test_the_clock_is_one_float(recorded):
    _, overlay, _ = recorded
    clock = overlay.received[0]
    assert type(clock) is VirtualClock and overlay.coordinator.clock is clock
    assert VirtualClock.__slots__ == ("now",) and type(clock.now) is float
    assert [r for r in gc.get_referents(clock) if r is not VirtualClock and not isinstance(r, float)] == []
    assert attack(clock) == []
    assert closures_and_globals(type(clock).__call__) == []


def test_what_the_overlay_holds_reaches_nothing(recorded):
    _, overlay, _ = recorded
    assert overlay.coordinator is not None
    assert walk(overlay) == []
    assert [x for x in overlay.received if not isinstance(x, (JobSnapshot, VirtualClock, int, float))] == []


# ----------------------------------------------------------------------------- cheaters
def steal(obj: Any) -> JobTruth | None:
    """Every bypass above, turned into a way to read the true duration."""
    for _, value in named(obj):
        if isinstance(value, JobTruth):
            return value
    seen, frontier = {id(obj)}, [obj]
    for _ in range(8):
        nxt = []
        for o in frontier:
            for ref in gc.get_referents(o):
                if id(ref) in seen or isinstance(ref, types.ModuleType):
                    continue
                seen.add(id(ref))
                if isinstance(ref, Simulation):
                    return ref.workload.truths[obj.job_id]
                if isinstance(ref, Workload):
                    return ref.truths[obj.job_id]
                if isinstance(ref, JobTruth):
                    return ref
                nxt.append(ref)
        frontier = nxt
    return None


class CheatingSRTF(SRTFEst):
    """SRTF with true durations, if it can get them."""

    name = "srtf_est"

    def __init__(self) -> None:
        self.stolen = 0

    def priority(self, job):
        truth = steal(job)
        if truth is None:
            return super().priority(job)
        self.stolen += 1
        return truth.duration_s * (1.0 - job.progress)


class CheatingOverlay(Overlay):
    """Stops every job it can prove hacked from the truth; reads the clock's closure and globals."""

    name = "none"

    def __init__(self) -> None:
        self.stolen = 0

    def attach(self, clock, n_evals):
        fn = clock if isinstance(clock, types.FunctionType) else vars(type(clock)).get("__call__")
        for cell in getattr(fn, "__closure__", None) or ():
            if steal(cell.cell_contents) is not None:
                self.stolen += 1
        for value in getattr(fn, "__globals__", {}).values():
            if isinstance(value, (Simulation, Workload, EventQueue)):
                self.stolen += 1

    def on_eval(self, job, step, score, loss, proxy):
        truth = steal(job)
        if truth is not None and truth.hacked:
            self.stolen += 1
            return True
        return False


@pytest.mark.parametrize("pack", [False, True])
def test_cheaters_find_nothing_and_run_like_honest_policies(pack):
    cfg = load_config().replace(**{"workload.n_jobs": 40, "cluster.pack_small_jobs": pack})
    wl = generate_workload(cfg, 3)
    cheater, cheating_overlay = CheatingSRTF(), CheatingOverlay()
    cheated = Simulation(wl, cfg, cheater, cheating_overlay).run()
    honest = Simulation(wl, cfg, create_scheduler("srtf_est"), create_overlay("none", wl)).run()
    assert cheater.stolen == 0 and cheating_overlay.stolen == 0
    assert cheated.outcomes == honest.outcomes
