"""Virtual sound devices for the live tests: a private PipeWire (with
pipewire-pulse and wireplumber on a private session bus) with a virtual
speaker and a virtual microphone, so the real sounddevice path can run on a
machine with no sound card.

The recipe (what PipeWire needs to run headless):

- the default sink is `speaker` (mono); what the assistant plays is recorded
  from `speaker.monitor`;
- the default source is `mic`, a remap of `micfeed.monitor`: a WAV played into
  the sink `micfeed` is what the microphone hears.

Everything lives under a fresh temporary directory (XDG_RUNTIME_DIR, the
session bus, the PulseAudio socket), so an instance started here never meets
another one on the same machine, and `stop()` ends only the processes it
started. `ensure_packages()` installs the Debian packages when they are
missing and it can (root and apt-get); otherwise it says why not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PACKAGES = ("pipewire", "pipewire-pulse", "pipewire-alsa", "wireplumber", "dbus", "pulseaudio-utils", "libportaudio2")
COMMANDS = ("dbus-daemon", "pipewire", "wireplumber", "pipewire-pulse", "pactl", "paplay", "parecord")
# Variables that would point a client at some other audio server or bus.
_FOREIGN = ("PULSE_SERVER", "PULSE_RUNTIME_PATH", "PIPEWIRE_RUNTIME_DIR", "PIPEWIRE_REMOTE", "PULSE_SINK",
            "PULSE_SOURCE", "DISPLAY", "WAYLAND_DISPLAY")


class AudioServerError(RuntimeError):
    pass


def _missing_packages() -> list[str]:
    if shutil.which("dpkg") is None:
        return [] if all(shutil.which(c) for c in COMMANDS) else list(PACKAGES)
    return [p for p in PACKAGES
            if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0]


def ensure_packages(timeout: float = 600) -> str | None:
    """Install the PipeWire packages if missing. Returns None when they are
    there, else the reason they are not (for a skip message)."""
    missing = _missing_packages()
    if not missing:
        return None
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return (f"the audio packages {' '.join(missing)} are missing and cannot be installed here "
                "(needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for cmd in (["apt-get", "update", "-qq"],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing]):
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            if proc.returncode != 0:
                return f"`{' '.join(cmd)}` failed: {proc.stderr.strip()[-500:]}"
    except subprocess.TimeoutExpired:
        return f"installing {' '.join(missing)} took over {timeout:.0f} s"
    still = _missing_packages()
    return f"still missing after apt-get: {' '.join(still)}" if still else None


@dataclass
class AudioServer:
    """One private PipeWire with the virtual speaker and microphone."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="voice-audio-")))
    procs: list[subprocess.Popen] = field(default_factory=list)
    mic_module: str = ""  # the module of `mic`: unloading it unplugs the microphone
    socket_at: float | None = None  # monotonic: when the last (re)started pipewire's socket was seen

    @property
    def run_dir(self) -> Path:
        return self.root / "run"

    @property
    def env(self) -> dict[str, str]:
        """The environment a client needs to use these devices (and only these)."""
        env = {k: v for k, v in os.environ.items() if k not in _FOREIGN}
        env.update(XDG_RUNTIME_DIR=str(self.run_dir), DBUS_SESSION_BUS_ADDRESS=f"unix:path={self.run_dir}/bus",
                   # WirePlumber keeps the default devices and each stream's target in XDG_STATE_HOME: shared
                   # (~/.local/state), another test's server running beside this one moved its streams
                   XDG_STATE_HOME=str(self.root / "state"))
        return env

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return (self.root / "log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def start(self) -> AudioServer:
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            self._spawn("dbus-daemon", "--session", "--nofork", "--nopidfile",
                        f"--address=unix:path={self.run_dir}/bus")
            self._wait(lambda: (self.run_dir / "bus").is_socket(), "the session bus")
            self._start_server()
        except BaseException:
            self.stop()
            raise
        return self

    def kill_server(self) -> None:
        """The audio server dies (a crash; a package upgrade restarts it):
        pipewire, wireplumber and pipewire-pulse are killed; the session bus
        stays, as a login's does. Their sockets are taken away, so that
        `restart_server` waits for the new ones."""
        servers, self.procs = self.procs[1:], self.procs[:1]
        for proc in servers:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in servers:
            proc.wait(5)
        for stale in self.run_dir.glob("pipewire-0*"):
            stale.unlink(missing_ok=True)
        shutil.rmtree(self.run_dir / "pulse", ignore_errors=True)

    def freeze_server(self, frozen: bool) -> None:
        """SIGSTOP (or SIGCONT) pipewire, wireplumber and pipewire-pulse: an
        audio server that hangs, then goes on."""
        for proc in self.procs[1:]:
            try:
                os.killpg(proc.pid, signal.SIGSTOP if frozen else signal.SIGCONT)
            except ProcessLookupError:
                pass

    def restart_server(self) -> None:
        """The audio server again, on the same runtime directory, with the
        same virtual devices as the defaults. A start that fails (seen once:
        pipewire-pulse exiting with "mkdir() …/pulse failed: File exists" when
        the restart came right after the kill) is cleaned up and tried once more."""
        try:
            self._start_server()
        except AudioServerError:
            self.kill_server()
            self._start_server()

    def _start_server(self) -> None:
        self._spawn("pipewire")
        self._wait(lambda: (self.run_dir / "pipewire-0").is_socket(), "pipewire", poll_s=0.005)
        self.socket_at = time.monotonic()
        self._spawn("wireplumber")  # it exits without a session bus, hence the bus first
        self._spawn("pipewire-pulse")
        self._wait(lambda: self.pactl("info", check=False).returncode == 0, "pipewire-pulse")
        self.pactl("load-module", "module-null-sink", "sink_name=speaker", "channel_map=mono")
        self.pactl("load-module", "module-null-sink", "sink_name=micfeed", "channel_map=mono")
        self.mic_module = self.add_mic()
        # wireplumber may not have picked the nodes up yet: retry until the defaults stick
        self._wait(lambda: self.pactl("set-default-sink", "speaker", check=False).returncode == 0, "the speaker")
        self._wait(lambda: self.pactl("set-default-source", "mic", check=False).returncode == 0, "the mic")
        self._wait(lambda: "Default Source: mic" in self.pactl("info").stdout
                   and "Default Sink: speaker" in self.pactl("info").stdout, "the default devices")

    def add_pair(self, suffix: str) -> list[str]:
        """A second speaker and microphone, as a headset plugged in:
        `speaker{suffix}` and `mic{suffix}`, fed through `micfeed{suffix}`.
        Returns the modules' ids (`remove_modules` unplugs it)."""
        modules = [self.pactl("load-module", "module-null-sink", f"sink_name=speaker{suffix}",
                              "channel_map=mono").stdout.strip(),
                   self.pactl("load-module", "module-null-sink", f"sink_name=micfeed{suffix}",
                              "channel_map=mono").stdout.strip()]
        modules.append(self.add_mic(suffix))
        return modules

    def add_mic(self, suffix: str = "") -> str:
        """The microphone `mic{suffix}` (a remap of `micfeed{suffix}.monitor`);
        its module's id."""
        module = self.pactl("load-module", "module-remap-source", f"source_name=mic{suffix}",
                            f"master=micfeed{suffix}.monitor", "channel_map=mono").stdout.strip()
        self._wait(lambda: f"mic{suffix}\t" in self.pactl("list", "short", "sources").stdout, f"mic{suffix}")
        return module

    def remove_modules(self, modules: list[str]) -> None:
        for module in reversed(modules):
            self.pactl("unload-module", module)

    def set_defaults(self, sink: str, source: str) -> None:
        self.pactl("set-default-sink", sink)
        self.pactl("set-default-source", source)
        self._wait(lambda: f"Default Source: {source}\n" in self.pactl("info").stdout
                   and f"Default Sink: {sink}\n" in self.pactl("info").stdout, "the default devices")

    def connections(self) -> tuple[list[str], list[str]]:
        """The sinks our clients play to and the sources they record from,
        by name, as the server has them now (the test's own parecord included)."""
        def names(kind: str) -> dict[str, str]:
            return {f[0]: f[1] for f in (line.split("\t") for line in self.pactl("list", "short", kind).stdout
                                         .splitlines())}
        sinks, sources = names("sinks"), names("sources")
        played = [sinks.get(line.split("\t")[1], "?")
                  for line in self.pactl("list", "short", "sink-inputs").stdout.splitlines()]
        recorded = [sources.get(line.split("\t")[1], "?")
                    for line in self.pactl("list", "short", "source-outputs").stdout.splitlines()]
        return played, recorded

    def links(self, objects: list[dict] | None = None) -> list[tuple[str, str, str, str, str]]:
        """Every link of the audio server's graph as the server itself has it
        (pactl's stream-to-device view is what the session manager asked
        for, not proof of a running link): (output node, input node, the
        link's state, the output node's state, the input node's state), by
        node name ("ALSA Capture"/"ALSA Playback": the service's streams)."""
        objects = self._dump() if objects is None else objects
        nodes = {o.get("id"): (((o.get("info") or {}).get("props") or {}).get("node.name", "?"),
                               str((o.get("info") or {}).get("state")))
                 for o in objects if o.get("type") == "PipeWire:Interface:Node"}
        found = []
        for obj in objects:
            if obj.get("type") == "PipeWire:Interface:Link":
                info = obj.get("info") or {}
                (out, out_state), (into, in_state) = (nodes.get(info.get(end), ("?", "None"))
                                                      for end in ("output-node-id", "input-node-id"))
                found.append((out, into, str(info.get("state")), out_state, in_state))
        return found

    def running_links(self) -> set[tuple[str, str]]:
        """(output node, input node) of each link the server runs: active, both nodes running."""
        return {(out, into) for out, into, state, out_state, in_state in self.links()
                if state == "active" and out_state == in_state == "running"}

    def service_linked(self) -> bool:
        """The service's capture and playback streams (PipeWire's ALSA plugin:
        "ALSA Capture", "ALSA Playback") each run a link: sound flows both ways."""
        running = self.running_links()
        return (any(into == "ALSA Capture" for _, into in running)
                and any(out == "ALSA Playback" for out, _ in running))

    def graph(self) -> str:
        """What the audio server's graph is now, for a failure's message: the
        links port to port (`pw-link -l`), node to node with their states,
        and each node. With VOICE_LIVE_DUMP set, the whole `pw-dump` is
        written into that folder too."""
        ports = subprocess.run(["pw-link", "-l"], env=self.env, capture_output=True, text=True, timeout=10).stdout
        objects = self._dump(keep=True)
        nodes = []
        for obj in objects:
            info = obj.get("info") or {}
            props = info.get("props") or {}
            if obj.get("type") == "PipeWire:Interface:Node":
                nodes.append(f"  {obj.get('id')} {props.get('node.name', '?')} [{props.get('media.class', '')}] "
                             f"{info.get('state')}{' ' + str(info['error']) if info.get('error') else ''}"
                             f" driver={props.get('node.driver', '-')}")
        node_links = [f"  {out} ({out_state}) -> {into} ({in_state}): {state}"
                      for out, into, state, out_state, in_state in self.links(objects)]
        return ("ports:\n" + ports.rstrip() + "\nnode links:\n" + "\n".join(node_links) + "\nnodes:\n"
                + "\n".join(nodes))

    def _dump(self, keep: bool = False) -> list[dict]:
        import json

        dump = subprocess.run(["pw-dump"], env=self.env, capture_output=True, text=True, timeout=10).stdout
        if keep and (dump_dir := os.environ.get("VOICE_LIVE_DUMP")):  # for a person chasing a failure
            Path(dump_dir).mkdir(parents=True, exist_ok=True)
            (Path(dump_dir) / f"pw-dump-{time.time():.0f}.json").write_text(dump)
        try:
            return json.loads(dump or "[]")
        except ValueError:
            return []

    def stop(self) -> None:
        """End the processes this instance started (each in its own session)."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 3
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.05, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(3)
        self.procs.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> AudioServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- clients ---------------------------------------------------------------

    def pactl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run(["pactl", *args], env=self.env, capture_output=True, text=True, timeout=10)
        if check and proc.returncode != 0:
            raise AudioServerError(f"pactl {' '.join(args)}: {proc.stderr.strip()}\n{self.log_tail()}")
        return proc

    def play(self, wav: Path, device: str = "micfeed") -> subprocess.Popen:
        """Play a WAV into a sink (`micfeed`: the microphone hears it)."""
        return subprocess.Popen(["paplay", "-d", device, str(wav)], env=self.env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def record(self, source: str = "speaker.monitor", rate: int = 16000) -> Recorder:
        return Recorder(self, source, rate).start()

    # -- internals -------------------------------------------------------------

    def _spawn(self, *argv: str) -> None:
        with open(self.root / "log", "ab") as log:
            self.procs.append(subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def _wait(self, ready, what: str, timeout: float = 10.0, poll_s: float = 0.05) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{', '.join(dead)} exited" if dead else f"no answer in {timeout:.0f} s"
                raise AudioServerError(f"waiting for {what}: {why}\n{self.log_tail()}")
            time.sleep(poll_s)


@dataclass
class Recorder:
    """`parecord --raw` from a source into memory, each chunk stamped with
    `time.monotonic()` on arrival, so recorded samples can be put on the same
    clock as the daemon's log (`at_mono`) and the test's own actions."""

    server: AudioServer
    source: str
    rate: int = 16000
    latency_ms: int = 10
    _proc: subprocess.Popen | None = None
    _data: bytearray = field(default_factory=bytearray)
    _stamps: list[tuple[float, int]] = field(default_factory=list)  # (arrival, samples received so far)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> Recorder:
        self._proc = subprocess.Popen(
            # dont-reconnect: WirePlumber would move it after the default devices (tests that switch them)
            ["parecord", "-d", self.source, "--property=node.dont-reconnect=true", "--raw", f"--rate={self.rate}",
             "--channels=1", "--format=s16le",
             f"--latency-msec={self.latency_ms}"],
            env=self.server.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        while chunk := self._proc.stdout.read1(65536):
            now = time.monotonic()
            with self._lock:
                self._data += chunk
                self._stamps.append((now, len(self._data) // 2))

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(5)
        if self._thread is not None:
            self._thread.join(5)

    def samples(self) -> np.ndarray:
        with self._lock:
            return np.frombuffer(bytes(self._data[: len(self._data) // 2 * 2]), np.int16).copy()

    def __len__(self) -> int:
        with self._lock:
            return len(self._data) // 2

    def time_of(self, index: float) -> float:
        """The monotonic time at which sample `index` reached the source: the
        lower envelope of (arrival - samples still to come) over the chunks
        that arrived soon after it (local, so a dropped fragment elsewhere in
        the recording does not shift it)."""
        with self._lock:
            stamps = [(t, n) for t, n in self._stamps if n >= index][:50]
        if not stamps:
            raise ValueError(f"sample {index} has not been recorded yet")
        return min(t - (n - index) / self.rate for t, n in stamps)

    def index_at(self, t: float) -> int:
        """The sample that reached the source at monotonic time `t`."""
        with self._lock:
            stamps = list(self._stamps)
        after = [(a, n) for a, n in stamps if a >= t][:50]
        if not after:
            return len(self)
        guess = max(n - (a - t) * self.rate for a, n in after)  # the same envelope, read backwards
        return max(0, round(guess))


def main() -> int:
    """`python tests/live/audio_server.py`: start the devices for a shell, as
    the recipe does: prints the exports (eval them) and how to stop."""
    import sys

    reason = ensure_packages()
    if reason is not None:
        print(f"virtual audio: {reason}", file=sys.stderr)
        return 1
    server = AudioServer().start()
    (server.root / "pids").write_text("".join(f"{p.pid}\n" for p in server.procs))
    print(f"export XDG_RUNTIME_DIR={server.run_dir} DBUS_SESSION_BUS_ADDRESS=unix:path={server.run_dir}/bus")
    print("# play into the mic: paplay -d micfeed FILE.wav; record the speaker: parecord -d speaker.monitor OUT.wav")
    print(f"# stop: kill $(cat {server.root}/pids); rm -rf {server.root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
