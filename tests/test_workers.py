"""The suite's two pytest-xdist workers (#37): tests that share a module-
scoped fixture run on one worker, so the fixture (a daemon, a set of
replays, a model server, a private PipeWire) is built once, not once per
worker. Run as pytest runs the suite, with this suite's conftest as a plugin,
over a probe module whose fixture counts how often it is built."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

PROBE = '''
import os
from pathlib import Path

import pytest

RAN = Path(__file__).parent / "ran"


@pytest.fixture(scope="module")
def shared():
    with open(RAN / "built", "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("n", range(8))
def test_shares(shared, n):
    (RAN / f"shares-{n}").write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("n", range(8))
def test_alone(n):
    (RAN / f"alone-{n}").write_text(os.environ["PYTEST_XDIST_WORKER"])
'''


def test_the_tests_of_a_module_fixture_run_on_one_worker_and_build_it_once(tmp_path):
    (tmp_path / "ran").mkdir()
    (tmp_path / "test_probe.py").write_text(PROBE)
    # (before: pytest 9 with pytest-xdist 3.8 dropped every group, the live one too, and built it on each worker)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-n", "2", "--dist", "loadgroup",
                           "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(TESTS)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = tmp_path / "ran"
    assert len((ran / "built").read_text().split()) == 1  # built once
    assert len({(ran / f"shares-{n}").read_text() for n in range(8)}) == 1  # on the worker that built it
    assert {(ran / f"alone-{n}").read_text() for n in range(8)} <= {"gw0", "gw1"}  # the rest anywhere
