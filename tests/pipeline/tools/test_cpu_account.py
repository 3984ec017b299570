"""The CPU account: each thread of this process charged to its role, other processes in
total, the process listening on a port found from /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

from pipeline.tools.bench.cpu_account import CpuAccount, listening_pid, process_cpu_s


def _burn(seconds: float) -> None:
    """Spend about ``seconds`` of CPU on this thread."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _burn_then_wait(seconds: float, burned: threading.Event, release: threading.Event) -> None:
    """Spend about ``seconds`` of CPU, set ``burned``, then stay alive (idle) until
    ``release``."""
    _burn(seconds)
    burned.set()
    release.wait(60)


def test_threads_are_charged_to_their_roles_and_other_processes_in_total() -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", "import time\nend = time.process_time() + 0.6\n"
         "while time.process_time() < end: pass\ntime.sleep(30)"]
    )  # fmt: skip
    try:
        burned, release = threading.Event(), threading.Event()
        # forward_0 is still alive at the account's last reading: all its CPU is charged to it
        forward = threading.Thread(
            target=_burn_then_wait, args=(0.3, burned, release), name="forward_0", daemon=True
        )
        with CpuAccount({"child": other.pid}, every_s=0.05) as account:
            helper = threading.Thread(target=_burn, args=(0.2,), name="model-watch")
            forward.start()
            helper.start()
            _burn(0.3)  # the thread that opened the account: the loop
            helper.join()
            deadline = time.monotonic() + 20
            while process_cpu_s(other.pid) < 0.55 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert burned.wait(20)
        result = account.result()
        release.set()
        forward.join()
    finally:
        other.kill()
        other.wait()
    cpu = result["cpu_s"]
    assert cpu["loop"] >= 0.25, cpu
    assert cpu["forward"] >= 0.25, cpu
    # model-watch ended before the last sample: it is still charged (by its last reading) or,
    # ended between samples, its remainder is "exited"
    assert cpu.get("python:model-watch", 0.0) + cpu["exited"] >= 0.15, cpu
    assert cpu["child"] >= 0.5, cpu
    assert result["processes"] == {"child": other.pid}
    assert result["wall_s"] > 0 and set(result["cores"]) == set(cpu)
    assert sum(v for k, v in cpu.items() if k != "child") <= result["process_cpu_s"] + 0.05


def test_the_process_listening_on_a_port_is_found() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert listening_pid(server.getsockname()[1]) == os.getpid()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening
    assert listening_pid(port) is None
