"""#38.4: the model server the tests and benchmarks start runs below the
voice's priority (docs/llm-servers.md, "Run a local server below the voice's
priority"): on a shared CPU the voice comes first. Read from outside, as
`ps` does: /proc/PID/stat's niceness, for every thread of the process.
The real server's own test is in tests/test_llm_server.py (it needs the
server installed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from llm_server import SERVER_NICE, below_here, niceness, start_below, threads_niceness


def test_a_process_started_below_runs_below_the_test_and_so_do_its_threads():
    """The launch the server fixture uses, with a stand-in that starts a
    thread after it began (as llama.cpp makes its workers): both run below."""
    script = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); print('up', flush=True)"
    process = start_below([sys.executable, "-c", script], SERVER_NICE, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "up"
        time.sleep(0.05)
        assert niceness(process.pid) == below_here() > niceness(os.getpid())
        assert threads_niceness(process.pid) == {below_here()}
    finally:
        process.kill()
        process.wait(5)
