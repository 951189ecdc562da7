"""A Ctrl-C or SIGTERM in the first second of a command, during its heavy imports, before the command's own
handling (stop_on_signals) is installed: it was a KeyboardInterrupt traceback, a NameError from a module half
imported, click's "Aborted!" (exit 1), or for SIGTERM an exit 143 with nothing logged. Now one line (JSON under
--log-json) and 130 or 143. The signal is sent as soon as the process catches SIGTERM (/proc's SigCgt), which
the command line's first handler does and Python's default does not."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent


def catches(pid: int, signum: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


@pytest.mark.parametrize("command", [["gcis-etl", "harvest", "--log-json", "--quiet"],
                                     ["gcis-migrate", "initial_load", "--pipeline", "museum", "--log-json"]])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_command_starts_is_one_json_line_and_128_plus_its_number(tmp_path, command, signum):
    (tmp_path / "masters" / "a").mkdir(parents=True)
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"state_dir": "state", "pipelines": {"museum": {
        "source": {"kind": "filesystem", "root": "masters"}, "store": {"kind": "local", "root": "store"}}}}))
    proc = subprocess.Popen([str(BIN / command[0]), *command[1:]], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "GCIS_CONFIG": str(tmp_path / "config.yaml")})
    try:
        deadline = time.monotonic() + 60
        while not catches(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.001)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, out + err
    [line] = [json.loads(line) for line in err.splitlines()]  # one line, JSON
    assert line["level"] == "warning" and line["message"] == f"stopped by {signal.Signals(signum).name}", line
    assert out == ""
