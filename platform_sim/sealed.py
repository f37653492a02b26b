"""Sealed overlays: the overlay runs in its own process and sees only the visible stream.

:class:`SealedOverlay` stands in the engine for the real overlay. It starts a fresh Python
(:mod:`platform_sim.sealed_worker`) with a clean command line (``python -I -c``: no seed, no salt,
no trace path), a scrubbed environment (:func:`child_env`) and an empty working folder, and sends
it, as JSON frames (:mod:`platform_sim.sealed_protocol`), the overlay's spec and then per event only
what a platform knows: each arrival's :class:`~platform_sim.views.JobSnapshot` fields, each eval's
score, loss and proxy reward with the job's progress and GPU-hours. The engine keeps the workload and
its truth; the child answers stop decisions (and, for ``stop_at``, the cut planned at arrival).

Cost: arrivals are batched and sent with the next frame that needs an answer, so a run costs one
round trip per eval (none for an overlay without an eval hook, such as ``stop_at``) plus the child's
start (overlapped with the base run by :mod:`platform_sim.sealed_run`). See BENCHMARKS.md.

Every built-in overlay but Oracle-Stop can run sealed, with exactly the decisions of the same
overlay in-process. Oracle-Stop reads the truth by design: :func:`sealed_spec` refuses it.

Example (a sealed run of the paper's decline rule; the same outcomes as in-process)::

    >>> from platform_sim.config import load_config
    >>> from platform_sim.engine import Simulation
    >>> from platform_sim.overlays import create_overlay
    >>> from platform_sim.schedulers import create_scheduler
    >>> from platform_sim.workload import generate_workload
    >>> cfg = load_config().replace(**{"workload.n_jobs": 30})
    >>> wl = generate_workload(cfg, 0, salt=99)
    >>> with SealedOverlay("evalstop", {"k": 2, "job_types": "rlhf"}) as sealed:
    ...     a = Simulation(wl, cfg, create_scheduler("srtf_est"), sealed).run()
    >>> b = Simulation(wl, cfg, create_scheduler("srtf_est"), create_overlay("evalstop", wl, k=2, job_types="rlhf")).run()
    >>> a.outcomes == b.outcomes, a.overlay
    (True, 'evalstop')
    >>> sealed_spec("oracle", {})
    Traceback (most recent call last):
    ...
    ValueError: overlay 'oracle' reads the ground truth by design (Oracle-Stop): it cannot run sealed; run it in-process (without --sealed)
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .overlays import Overlay, create_overlay
from .sealed_protocol import (
    ARRIVAL,
    ASK,
    EVAL,
    FrameReader,
    SealedOverlayError,
    check_name,
    encode,
    finite_unit,
    send_frame,
)
from .views import JobSnapshot
from .workload import Workload

__all__ = ["SealedOverlay", "SealedOverlayError", "child_command", "child_env", "sealed_spec", "undumpable"]

START_TIMEOUT_S = 60.0  # the child's imports, on a loaded machine
REPLY_TIMEOUT_S = 30.0
TOTAL_TIMEOUT_S = 3600.0  # the child's time in all, over one run: no run waits on it without bound
MAX_REPLY_BYTES = 65536
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
_CLASS_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
_ENV_KEEP = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "LC_ALL": "C.UTF-8"}


def _printable(text: str) -> str:
    """The child's text as it may reach a terminal: no control characters but newlines and tabs."""
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


def child_env() -> dict[str, str]:
    """The child's whole environment: a PATH and thread limits; nothing of the parent's."""
    return {"PATH": os.defpath, **_ENV_KEEP}


def child_command() -> list[str]:
    """The child's command line: ``python -I -c ...`` (isolated: no PYTHON* variables, no user site)."""
    code = f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r}); from platform_sim.sealed_worker import main; main()"
    return [sys.executable, "-I", "-c", code]


def sealed_spec(overlay: str, params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Check an overlay for a sealed run: a registered overlay's name and its flat config block
    (built here once with an empty workload, so a bad parameter fails before any process starts), or
    a user's ``module:Class`` (not imported here: only the child runs a user's code).

    Raises:
        ValueError: Oracle-Stop, an unknown overlay or parameter, a malformed ``module:Class``, or
            parameters that are not JSON.
    """
    params = dict(params)
    if ":" in overlay:
        if not _CLASS_PATH.match(overlay):
            raise ValueError(f"an overlay class must be given as module:Class (e.g. my_pkg.stops:MyOverlay), "
                             f"but got {overlay!r}")
    elif create_overlay(overlay, Workload((), (), n_evals=1, seed=0), **params).is_oracle:
        raise ValueError(f"overlay {overlay!r} reads the ground truth by design (Oracle-Stop): it cannot run "
                         f"sealed; run it in-process (without --sealed)")
    try:
        encode(params)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the parameters of overlay {overlay!r} must be plain JSON values ({exc})") from None
    return overlay, params


class _Dumpable:
    """While a sealed child lives, this process is not dumpable (Linux): a process of the same user
    without ``CAP_SYS_PTRACE`` cannot attach to it or read its ``/proc/<pid>/mem``, ``environ``. The
    flag is inherited by ``fork``: worker processes forked inside :func:`undumpable` keep it."""

    live, saved = 0, None

    @classmethod
    def enter(cls) -> None:
        cls.live += 1
        if cls.live == 1 and sys.platform.startswith("linux"):
            libc = ctypes.CDLL(None)
            cls.saved = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
            libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0

    @classmethod
    def leave(cls) -> None:
        cls.live -= 1
        if cls.live == 0 and cls.saved is not None and cls.saved >= 0:
            ctypes.CDLL(None).prctl(4, cls.saved, 0, 0, 0)
            cls.saved = None


@contextmanager
def undumpable() -> Iterator[None]:
    """This process (and the workers it forks meanwhile) not dumpable for the block: a sealed run
    holds it around every seed, so no overlay's process can read the salt out of the engine's memory."""
    _Dumpable.enter()
    try:
        yield
    finally:
        _Dumpable.leave()


class SealedOverlay(Overlay):
    """An overlay that runs in a separate process; the engine calls this proxy.

    Args:
        overlay: a registered overlay's name (``evalstop``, ``stop_at``, ``loss_plateau``, ``none``)
            or a user's ``module:Class`` (a subclass of :class:`~platform_sim.overlays.Overlay`,
            importable from this process's ``sys.path``).
        params: the overlay's flat config block (a registered overlay) or its constructor's keyword
            arguments (a class); plain JSON values.
        reply_timeout_s: the longest the child may take to answer one frame.
        start_timeout_s: the longest it may take to start and build the overlay.
        total_timeout_s: the longest the engine waits on the child over the whole run (starting included).

    One instance serves one run. Use it as a context manager (or call :meth:`close`): the child,
    and any process it started in its session, ends with it. A child that
    crashes, exceeds a timeout or breaks the protocol raises :class:`SealedOverlayError` (and is
    killed); an exception in the overlay's code raises it with the child's traceback.
    """

    def __init__(self, overlay: str, params: Mapping[str, Any] | None = None, *,
                 reply_timeout_s: float = REPLY_TIMEOUT_S, start_timeout_s: float = START_TIMEOUT_S,
                 total_timeout_s: float = TOTAL_TIMEOUT_S) -> None:
        self.spec, self.params = sealed_spec(overlay, params or {})
        self.name = overlay if ":" not in overlay else overlay.rpartition(":")[2]
        self.reply_timeout_s, self.start_timeout_s = reply_timeout_s, start_timeout_s
        self.total_timeout_s, self._waited = total_timeout_s, 0.0
        self.hardened = False
        self._pending: list[list] = []
        self._cuts: dict[int, float | None] = {}
        self._workdir = tempfile.TemporaryDirectory(prefix="sealed-overlay-")
        self._stderr = tempfile.TemporaryFile()
        _Dumpable.enter()
        try:
            self._proc = subprocess.Popen(child_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr, env=child_env(), cwd=self._workdir.name,
                                          close_fds=True, bufsize=0, start_new_session=True)
        except OSError:
            _Dumpable.leave()
            raise
        self._out = self._proc.stdin.fileno()
        os.set_blocking(self._out, False)
        self._reader = FrameReader(self._proc.stdout.fileno())
        self._ready = False

    # ------------------------------------------------------------------ the engine's hooks
    def attach(self, clock, n_evals):
        if self._ready or self._proc is None:
            raise ValueError("a SealedOverlay serves one run (its process holds that run's overlay); make a new one")
        self.clock = clock
        hello = {"overlay": self.spec, "params": self.params, "n_evals": n_evals,
                 "path": [os.path.abspath(p) for p in sys.path]}
        ready = self._exchange(hello, None, self.start_timeout_s)
        if not (isinstance(ready, dict) and set(ready) == {"name", "eval", "cut", "hardened"}
                and all(type(ready[k]) is bool for k in ("eval", "cut", "hardened"))):
            self._fail(f"the sealed overlay's first message is not a ready message: {str(ready)[:200]!r}")
        if ":" in self.spec:
            self.name = check_name(ready["name"])
        self._wants_evals, self._wants_cuts, self.hardened = ready["eval"], ready["cut"], ready["hardened"]
        self._ready = True

    def on_arrival(self, job: JobSnapshot) -> None:
        self._pending.append([ARRIVAL, self.clock.now, *job])
        if self._wants_cuts:
            (cut,) = self._ask(1, 0)
            self._cuts[job.job_id] = cut
        elif len(self._pending) >= 1024:
            self._flush()

    def cut_progress(self, job_id: int) -> float | None:
        return self._cuts.pop(job_id, None)

    def on_eval(self, job: JobSnapshot, step: int, score: float, loss: float, proxy: float) -> bool:
        if not self._wants_evals:
            return False
        self._pending.append([EVAL, self.clock.now, job.job_id, step, score, loss, proxy, job.progress,
                              job.waiting_since, job.gpu_hours, job.loss_history[-1][0], job.pool, job.speed])
        return self._ask(0, 1)[0]

    # ------------------------------------------------------------------ the wire
    def _flush(self) -> None:
        if self._pending:
            send_frame(self._out, encode(self._pending), self.reply_timeout_s)
            self._pending = []

    def _ask(self, cuts: int, evals: int) -> list:
        """Send the pending events with a request; check the reply: ``cuts`` cuts then ``evals`` bools."""
        self._pending.append(ASK)
        n = cuts + evals
        reply = self._exchange(self._pending, n, self.reply_timeout_s)
        self._pending = []
        if not (type(reply) is list and len(reply) == n
                and all(finite_unit(x) or x is None for x in reply[:cuts])
                and all(type(x) is bool for x in reply[cuts:])):
            self._fail(f"the sealed overlay answered {str(reply)[:200]!r}; expected {cuts} cut(s) (a number "
                       f"in [0, 1] or null) then {evals} stop decision(s) (true/false)")
        return reply

    def _exchange(self, message: Any, n: int | None, timeout_s: float) -> Any:
        """Send ``message``, read one reply frame (at most :data:`MAX_REPLY_BYTES` plus 16 bytes per
        expected answer: room for an error's traceback, none for a flood)."""
        left = self.total_timeout_s - self._waited
        if left <= 0:
            self._fail(f"the sealed overlay took more than {self.total_timeout_s:g} s in all over this run "
                       "(total_timeout_s)")
        t0 = time.monotonic()
        try:
            send_frame(self._out, encode(message), min(timeout_s, left))
            reply = self._reader.read(min(timeout_s, left), MAX_REPLY_BYTES + 16 * (n or 0))
        except SealedOverlayError as exc:
            self._waited += time.monotonic() - t0
            over = self._waited >= self.total_timeout_s
            self._fail(f"the sealed overlay took more than {self.total_timeout_s:g} s in all over this run "
                       f"(total_timeout_s)" if over else str(exc))
        self._waited += time.monotonic() - t0
        if isinstance(reply, dict) and set(reply) == {"error"}:
            self._fail(f"the sealed overlay {self.spec!r} raised an exception:\n{str(reply['error'])[-4000:]}")
        return reply

    def _fail(self, why: str) -> None:
        proc = self._proc
        if proc is not None and why.endswith("(it exited)"):  # say how: a signal names the seal that held
            try:
                code = proc.wait(2.0)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None and code < 0:
                sig = signal.Signals(-code)
                why += f"; killed by {sig.name}" + (" (a forbidden system call)" if sig == signal.SIGSYS else "")
        tail = self._stderr_tail()
        self.close(kill=True)
        text = why + (f"\n(its standard error ends with:)\n{tail}" if tail else "")
        raise SealedOverlayError(_printable(text))

    def _stderr_tail(self) -> str:
        try:
            self._stderr.flush()
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - 2000))
            return self._stderr.read().decode("utf-8", "replace").strip()
        except (OSError, ValueError):
            return ""

    # ------------------------------------------------------------------ lifetime
    def close(self, kill: bool = False) -> None:
        """End the child (it exits when its input closes; killed after 5 s, or at once with ``kill``)."""
        proc = self._proc
        if proc is None:
            return
        self._proc = None
        try:
            if not kill:
                self._flush()
        except SealedOverlayError:
            kill = True
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        if kill:
            proc.kill()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:  # anything the overlay started in its session (its own process group) ends with it
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._stderr.close()
        self._workdir.cleanup()
        _Dumpable.leave()

    def __enter__(self) -> SealedOverlay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(kill=exc[0] is not None)

    def __del__(self) -> None:
        if getattr(self, "_proc", None) is not None:
            self.close(kill=True)
