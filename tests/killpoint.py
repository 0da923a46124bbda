"""Run `voice` CLI processes that kill -9 themselves at an exact commit point.

A forking server: this script imports the program once, then for each
request on stdin (a JSON line) forks a child that runs `voice.cli.main`
exactly as `python -m voice` would, with its own environment, stdin and
output files. With `"kill_after": N` the child sends itself SIGKILL right
after the N-th event of its first turn is committed to the log (the
`turn/start` is 1); with `"kill_after": "tool/dispatch"`, right after the
first event of that type. So a test can stop a real process at every
commit point of a turn, not just where a sleep happens to land. The parent
answers each request with a JSON line: {"rc", "signal", "commits"}.
Tests use it through `KillPoints`.

Forking after the imports makes each run start in milliseconds instead of
seconds (the openai SDK alone takes over a second to import). Nothing runs
in the parent but this loop: no event loop, no thread, no open log, so
every child starts as clean as a new process, and it is one.

    python tests/killpoint.py   # then write requests to its stdin
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import voice.agent.providers.openai_compat  # noqa: E402,F401  (imported once, before forking)
import voice.service.chat  # noqa: E402,F401
import voice.app  # noqa: E402,F401
from voice import cli  # noqa: E402
from voice.log.feed import EventFeed  # noqa: E402


def _arm(kill_after: int | str | None, report: Path) -> None:
    """Count commits from the turn's start; SIGKILL ourselves at `kill_after`
    (a count, or the first commit of an event type). Every commit, by any
    writer, is handed to the store's feed right after it: that is the hook."""
    seen = {"turn": False, "commits": 0}
    publish = EventFeed.publish

    def counted(self, event):
        publish(self, event)
        seen["turn"] = seen["turn"] or event.type == "turn/start"
        if seen["turn"]:
            seen["commits"] += 1
            report.write_text(str(seen["commits"]))
            if kill_after in (seen["commits"], event.type):
                os.kill(os.getpid(), signal.SIGKILL)

    EventFeed.publish = counted


def _child(request: dict) -> None:
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(ROOT)
    folder = Path(request["out"])
    stdin = os.open(folder / "stdin.txt", os.O_RDONLY)
    os.dup2(stdin, 0)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        out = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(out, fd)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    _arm(request.get("kill_after"), folder / "commits.txt")
    try:
        rc = cli.main(request["argv"])
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # a traceback, as `python -m voice` would print it
        import traceback

        traceback.print_exc()
        rc = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        folder = Path(request["out"])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "stdin.txt").write_text(request.get("stdin", ""))
        (folder / "commits.txt").write_text("0")
        pid = os.fork()
        if pid == 0:
            _child(request)
        _, status = os.waitpid(pid, 0)
        answer = {"rc": os.waitstatus_to_exitcode(status), "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status)
                  else None, "commits": int((folder / "commits.txt").read_text() or 0)}
        print(json.dumps(answer), flush=True)


class KillPoints:
    """The test side: one server process, then `run()` per `voice` run."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True, cwd=ROOT)

    def run(self, argv: list[str], *, env: dict[str, str], out: Path, stdin: str = "",
            kill_after: int | str | None = None) -> dict:
        """Run `voice ARGV`; {"rc", "signal", "commits", "stdout", "stderr"}."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        request = {"argv": argv, "env": env, "out": str(out), "stdin": stdin, "kill_after": kill_after}
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        answer = json.loads(self._proc.stdout.readline())
        return {**answer, "stdout": (out / "stdout.txt").read_text(), "stderr": (out / "stderr.txt").read_text()}

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(10)


def killpoints_fixture():
    """A module-scoped pytest fixture of one KillPoints server (tests/test_chaos.py, tests/test_mcp_restart.py)."""
    import pytest

    @pytest.fixture(scope="module")
    def killpoints():
        k = KillPoints()
        yield k
        k.close()

    return killpoints


if __name__ == "__main__":
    main()
