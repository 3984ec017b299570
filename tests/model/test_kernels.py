"""model/kernels.py: two processes compiling new signatures of one cached kernel at the same
time leave a cache that holds both, each under its own entry. Without the lock (numba issue
4807) the same scenario leaves one index entry naming the other process's data file: one
signature is lost (compiled again by the next process), the other may load foreign code."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import REPO_ROOT

KERNEL = """
from model.kernels import kernel


@kernel
def triple(x):
    return x * 3
"""

# Run in each process: wait at a barrier (a file), then compile triple for one type. A save
# reads the index, picks a data file, writes the index, then the data; the sleeps around the
# index write make two saves overlap the way numba's unlocked cache mixes them up: both read
# the empty index, A writes its index first and its data last, so without the lock the index
# left names B's signature (f64) and the data file holds A's code (f32).
COMPILE = """
import sys, time
from pathlib import Path

import numpy as np
from numba.core import caching

import model.kernels  # the lock wraps save and load; the sleeps run inside it

directory, which = Path(sys.argv[1]), sys.argv[2]
first = which == "f32"
cache_file = caching.IndexDataCacheFile
save_index = cache_file._save_index

def slow_save_index(self, overloads):  # called between reading the index and the data
    time.sleep(0.3 if first else 0.6)
    save_index(self, overloads)
    time.sleep(1.0 if first else 0.0)

cache_file._save_index = slow_save_index
sys.path.insert(0, str(directory))
import kernels_under_test

(directory / f"ready-{which}").touch()
while not (directory / "go").exists():
    time.sleep(0.01)
value = np.float32(1.5) if first else np.float64(1.5)
print(kernels_under_test.triple(value))
"""

LOAD = """
import sys

import numpy as np

sys.path.insert(0, sys.argv[1])
import kernels_under_test

f32, f64 = kernels_under_test.triple(np.float32(1.5)), kernels_under_test.triple(np.float64(1.5))
print(f32, f64, sum(kernels_under_test.triple.stats.cache_hits.values()))
"""


def _python(code: str, *args: str, cwd: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "NUMBA_CACHE_DIR": str(cwd / "cache")}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), str(cwd), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_compiling_one_kernel_at_once_leave_each_signature_its_own_code(
    tmp_path: Path,
) -> None:
    (tmp_path / "kernels_under_test.py").write_text(KERNEL)
    processes = [_python(COMPILE, which, cwd=tmp_path) for which in ("f32", "f64")]
    try:
        while not all((tmp_path / f"ready-{w}").exists() for w in ("f32", "f64")):
            assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
            time.sleep(0.02)
        (tmp_path / "go").touch()
        outputs = [p.communicate(timeout=120) for p in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert [p.returncode for p in processes] == [0, 0], outputs
    assert [float(out) for out, _ in outputs] == [4.5, 4.5]

    loaded = _python(LOAD, cwd=tmp_path)
    out, err = loaded.communicate(timeout=120)
    assert loaded.returncode == 0, err
    f32, f64, hits = out.split(maxsplit=2)
    assert (float(f32), float(f64)) == (4.5, 4.5)  # each signature's own machine code
    assert int(hits) == 2, "both signatures come from the cache, not compiled again"
