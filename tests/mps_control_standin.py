"""A stand-in for ``nvidia-cuda-mps-control`` (no GPU here): what the MPS supervisor uses of it.

- ``-d``: start "the server" (a sleeping child in a session of its own) and write its pid to
  ``$CUDA_MPS_PIPE_DIRECTORY/nvidia-cuda-mps-control.pid``, as the real control daemon does; exit 0.
  With ``$MPS_STANDIN_FAIL`` set it prints an error and exits 1 instead.
- no argument: read commands from stdin; ``quit`` ends the server and removes the pid file.

Every call and command is appended to ``$MPS_STANDIN_RECORD`` (one line each, with the pipe and log
directories it saw). Kill the pid in the pid file to make the daemon "die".
"""

import os
import signal
import subprocess
import sys
from pathlib import Path


def record(line: str) -> None:
    path = os.environ.get("MPS_STANDIN_RECORD")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def main() -> int:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    logs = os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
    pid_file = pipe / "nvidia-cuda-mps-control.pid"
    if sys.argv[1:] == ["-d"]:
        record(f"-d pipe={pipe} log={logs}")
        if os.environ.get("MPS_STANDIN_FAIL"):
            print("An instance of this daemon is already running", file=sys.stderr)
            return 1
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pid_file.write_text(f"{child.pid}\n")
        return 0
    for line in sys.stdin:
        command = line.strip()
        record(command)
        if command == "quit" and pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
            except (ValueError, ProcessLookupError):
                pass
            pid_file.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
