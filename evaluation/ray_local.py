"""The local Ray instance `--executor ray` starts when no cluster is given: loopback only, token-authenticated, in a
private folder, and ended with the sweep.

- Loopback: Ray's single-machine mode (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, the switch Ray uses on macOS and
  Windows; read by Ray when it is imported, so it is set before `import ray`) with node address 127.0.0.1: the GCS,
  the raylet, the workers and the runtime-env agent listen on 127.0.0.1 only; the dashboard is off. After the start
  the node's address is checked: anything but loopback stops the instance with one clear line.
- Token authentication (Ray ≥ 2.52): unless RAY_AUTH_MODE is set, the instance runs with RAY_AUTH_MODE=token and a
  fresh random token passed in the environment (RAY_AUTH_TOKEN; nothing written to ~/.ray), so another user of
  the machine cannot submit work to it even through loopback.
- Workers at this command's priority: Ray starts its workers 15 steps nicer than the process that started it, so
  on a machine with other work a Ray sweep ran many times slower than the same sweep in-process; the local
  instance's workers keep the command's niceness (RAY_worker_niceness=0, an increment; a value set by the user
  is kept).
- A private folder (`mkdtemp`, mode 0700) holds the session (sockets, logs) instead of the shared /tmp/ray.
- Ended with the sweep: `stop` shuts it down; a small watcher process (evaluation/ray_reaper.py) ends whatever is
  left of it once the CLI process is gone — also after SIGKILL — identifying its processes by a random marker in
  their environment, and removes the folder.
With RAY_ADDRESS set, none of this applies: the sweep joins that cluster as it is configured (see the README).
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from merging.common.errors import RamStudioError

MIN_VERSION = (2, 52)  # the first Ray with token authentication
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
MARK_ENV = "RAM_STUDIO_RAY_SESSION"
NICENESS_ENV = "RAY_worker_niceness"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def import_ray(local: bool = True):
    """Ray, imported for a local loopback instance when `local` (its single-machine switch set first), checked to
    be a version with token authentication; else a clear line saying how to install it."""
    if local and "ray" not in sys.modules:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError:
        raise RamStudioError("--executor ray needs Ray, which is not installed.",
                             "Install it with: pip install 'ram-studio[cluster]' "
                             "(or pip install 'ray>=2.52').") from None
    version = tuple(int(p) if p.isdigit() else 0 for p in ray.__version__.split(".")[:2])
    if version < MIN_VERSION:
        raise RamStudioError(f"Ray {ray.__version__} has no token authentication (it came with Ray 2.52): a Ray "
                             "instance of that version accepts work from anyone who can reach it.",
                             "Upgrade it: pip install 'ray>=2.52'.")
    return ray


def _short_tmp() -> str:
    """A temporary root short enough for Ray's unix sockets (at most 107 bytes of path)."""
    root = tempfile.gettempdir()
    return root if len(root) <= 40 or not os.access("/tmp", os.W_OK) else "/tmp"


class LocalRay:
    """A local Ray instance this process started (see the module docstring); `stop` ends it."""

    def __init__(self, ray, folder: Path, marker: str, reaper: subprocess.Popen | None, env: dict[str, str | None],
                 constant: Any) -> None:
        self.ray, self.folder, self.marker, self.reaper = ray, folder, marker, reaper
        self._env, self._constant = env, constant

    @classmethod
    def start(cls, ray, num_cpus: int | None = None) -> "LocalRay":
        """Start the instance (loopback, token, private folder, watcher); one clear line when it cannot."""
        folder = Path(tempfile.mkdtemp(prefix="ram-studio-ray-", dir=_short_tmp()))
        marker = secrets.token_hex(16)
        changes: dict[str, str] = {LOOPBACK_ENV: "0", MARK_ENV: marker}
        if "RAY_AUTH_MODE" not in os.environ:
            changes["RAY_AUTH_MODE"] = "token"
            if not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
                changes["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        changes.setdefault("RAY_USAGE_STATS_ENABLED", os.environ.get("RAY_USAGE_STATS_ENABLED", "0"))
        # Ray raises its workers' niceness by 15 (an increment over this process's); the workers here are the
        # sweep itself, so they run at this command's own priority unless RAY_worker_niceness says otherwise.
        changes.setdefault(NICENESS_ENV, os.environ.get(NICENESS_ENV, "0"))
        saved = {k: os.environ.get(k) for k in changes}
        constants = sys.modules.get("ray._private.ray_constants")
        constant = getattr(constants, "ENABLE_RAY_CLUSTER", None)
        inst = cls(ray, folder, marker, None, saved, constant)
        os.environ.update(changes)
        if constants is not None:  # Ray imported before the switch was set: the same switch, where Ray keeps it
            constants.ENABLE_RAY_CLUSTER = False
        _reload_auth()
        inst.reaper = _start_reaper(marker, folder)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, _temp_dir=str(folder), _node_ip_address="127.0.0.1",
                     log_to_driver=False)
            address = ray._private.worker._global_node.node_ip_address
        except Exception as exc:  # noqa: BLE001 — Ray's own start-up errors, one line
            inst.stop()
            raise RamStudioError(f"could not start a local Ray instance: {str(exc).strip().splitlines()[0][:300]}.",
                                 "Check that loopback (127.0.0.1) is up, or point RAY_ADDRESS at a cluster.") from None
        finally:
            os.environ.pop(MARK_ENV, None)  # only Ray's processes, started by now, carry the marker
            if saved[MARK_ENV] is not None:
                os.environ[MARK_ENV] = saved[MARK_ENV]
            for s, h in handlers.items():  # ray.init replaces SIGTERM's handler; the CLI's stop flag stays in charge
                if h is not None:
                    signal.signal(s, h)
        if address not in LOOPBACK:
            inst.stop()
            raise RamStudioError(f"the local Ray instance came up on {address}, not on loopback only; it was stopped.",
                                 "Set RAY_ADDRESS to use a cluster you configured yourself.")
        return inst

    def stop(self) -> None:
        """Shut the instance down, let the watcher end anything left and remove the folder, restore the settings."""
        try:
            if self.ray.is_initialized():
                self.ray.shutdown()
        finally:
            if self.reaper is not None and self.reaper.poll() is None:
                self.reaper.send_signal(signal.SIGTERM)
                try:
                    self.reaper.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    pass
            for k, v in self._env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            constants = sys.modules.get("ray._private.ray_constants")
            if constants is not None and self._constant is not None:
                constants.ENABLE_RAY_CLUSTER = self._constant
            _reload_auth()


def _reload_auth() -> None:
    """Make this process's Ray read RAY_AUTH_MODE and RAY_AUTH_TOKEN again (it reads them once, when first used:
    as Ray's own token set-up does, its config is re-initialised and its token cache reset)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config
    except ImportError:
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _start_reaper(marker: str, folder: Path) -> subprocess.Popen | None:
    """The watcher (evaluation/ray_reaper.py) for this process, in its own session, with no marker of its own."""
    try:
        with open(f"/proc/{os.getpid()}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None  # no /proc (not Linux): Ray's own shutdown is all there is
    start = stat[stat.rindex(")") + 2:].split()[19]
    env = {k: v for k, v in os.environ.items() if k != MARK_ENV}
    script = Path(__file__).with_name("ray_reaper.py")
    return subprocess.Popen([sys.executable, "-I", str(script), str(os.getpid()), start, marker, str(folder)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            close_fds=True, start_new_session=True, env=env)


class WorkerLost(RamStudioError):
    """A Ray worker (or its node) died while it held work: killed by the OOM killer, a node lost…"""


def _unwrap(exc: BaseException) -> BaseException:
    """The error a Ray task raised (Ray wraps it); a RamStudioError stays one clear line."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, RamStudioError):
        return RamStudioError(cause.message, cause.hint)
    return exc


def ray_failure(ray, exc: BaseException, what: str) -> BaseException:
    """What to raise for an error out of Ray: a task's own error unwrapped, a lost worker as one clear line."""
    if isinstance(exc, ray.exceptions.RayTaskError):
        return _unwrap(exc)
    if isinstance(exc, ray.exceptions.RayError):
        text = " ".join(str(exc).split())[:200]
        return WorkerLost(f"a Ray worker was lost while {what} ({type(exc).__name__}: {text})",
                          "It may have run out of memory (the OOM killer) or lost its node.")
    return exc
