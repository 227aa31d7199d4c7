"""mxserved as a child process, for the Python client's tests and tests/deploy
(which imports this file by path): started with the flags given, its log read
until it says where it listens, stopped with SIGTERM (it exits 0 on that).
Plain Python: no mxserve import, so no generated stubs are needed."""

import re
import signal
import subprocess
import threading
import time
from typing import List, Optional

_LISTENING = re.compile(r"event=listening grpc=(\S+) metrics=(\S+)")


def stop_process(process: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, then the exit status (SIGKILL after `timeout` s, and -9)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


class DaemonProcess:
    def __init__(self, binary: str, *flags: str, start_timeout: float = 30.0):
        self.log_lines: List[str] = []
        self.address: Optional[str] = None
        self.metrics_address: Optional[str] = None
        self.process = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True)
        listening = threading.Event()

        def read_log():
            for line in self.process.stderr:
                self.log_lines.append(line.rstrip("\n"))
                match = _LISTENING.search(line)
                if match:
                    self.address, self.metrics_address = match.groups()
                    listening.set()

        self._reader = threading.Thread(target=read_log, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + start_timeout
        while not listening.wait(0.05):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("mxserved did not start:\n" + self.log())

    def log(self) -> str:
        return "\n".join(self.log_lines)

    def stop(self, timeout: float = 30.0) -> int:
        code = stop_process(self.process, timeout)
        self._reader.join(timeout=5)
        return code

    def __enter__(self) -> "DaemonProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
