"""Child processes of the test cluster: start with a log file, watch, stop in order.

Each component runs in its own session, so a Ctrl-C in the terminal reaches only the Python
runner, which then stops the components in reverse start order (kwok before the API server,
the API server before etcd). On Linux the children also get PR_SET_PDEATHSIG, so a runner
killed with SIGKILL does not leave an API server behind.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

LOG_TAIL_BYTES = 4000
STOP_GRACE_S = 10.0
PR_SET_PDEATHSIG = 1


class ClusterError(RuntimeError):
    """A component failed to start or the cluster did not become ready in time."""


def free_port() -> int:
    """A loopback TCP port that was free a moment ago (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Component:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    _log: IO[bytes] = field(repr=False)

    def log_tail(self) -> str:
        self._log.flush()
        data = self.log_path.read_bytes()[-LOG_TAIL_BYTES:]
        return data.decode(errors="replace")

    def check_running(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise ClusterError(
                f"{self.name} exited with code {code} (log {self.log_path}):\n{self.log_tail()}"
            )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def start_component(name: str, argv: list[str], log_dir: Path) -> Component:
    log_path = log_dir / f"{name}.log"
    log = log_path.open("ab")
    log.write(f"# {' '.join(argv)}\n".encode())
    log.flush()
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    return Component(name=name, argv=argv, log_path=log_path, process=process, _log=log)


def stop_all(components: list[Component]) -> None:
    for component in reversed(components):
        component.stop()


def wait_until(
    condition: Callable[[], bool],
    timeout_s: float,
    what: str,
    components: list[Component],
    interval_s: float = 0.1,
) -> None:
    """Poll `condition` until true; fail early if a component died, or at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        for component in components:
            component.check_running()
        if condition():
            return
        if time.monotonic() > deadline:
            logs = ", ".join(str(c.log_path) for c in components)
            raise ClusterError(f"timed out after {timeout_s:.0f}s waiting for {what}; logs: {logs}")
        time.sleep(interval_s)


def _die_with_parent() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
