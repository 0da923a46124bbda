"""`voice replay` run inside the test process, through the command line's own
entry point (`voice.cli.main`), for the tests whose subject is what a replay
does rather than the `voice` process around it (#37).

A replay in a subprocess spent about 4 s of CPU before its first block:
Python's imports (pipecat, onnx, faster-whisper) and loading Whisper and
Piper. In the test process the imports happen once, and the models are
loaded once per worker (`voice.speech.builder.loaded_once`), so a silent
replay takes a fraction of a second and a spoken one about half its time.
What runs is the same code from `main(argv)` on: argument parsing, the
config, the virtual clock, the log, the recorder, the printed summary.
The command line itself (its exit status from a real process, its errors,
its output when piped) keeps its subprocess tests (tests/test_bad_input_voice.py,
tests/test_same_replay_twice.py, tests/test_record_replay.py).

What a process would keep to itself is put back afterwards: the
environment, the working folder, the umask `main` sets, stdout and stderr.
One replay at a time per process: the virtual clock is process-wide.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_one_at_a_time = threading.Lock()


def voice_replay(args: list[str], env: dict[str, str] | None = None,
                 cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`voice replay ARGS` as `subprocess.run(..., capture_output=True,
    text=True)` would report it, run in this process with `env` as the
    whole environment."""
    from voice.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    with _one_at_a_time, _environment(env), contextlib.chdir(cwd), _umask_kept(), \
            contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = main(["replay", *args])
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return subprocess.CompletedProcess(["voice", "replay", *args], code, stdout.getvalue(), stderr.getvalue())


@contextlib.contextmanager
def _environment(env: dict[str, str] | None):
    if env is None:
        yield
        return
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _umask_kept():
    before = os.umask(0o022)
    os.umask(before)
    try:
        yield
    finally:
        os.umask(before)
