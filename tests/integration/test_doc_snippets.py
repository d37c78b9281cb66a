"""Every shell snippet of docs/*.md runs (or, where it cannot here, is checked), as an operator
would run it, and every service the install snippets enable starts from the installed virtualenv.

Snippets are marked in the Markdown with ``<!-- snippet: KIND -->`` on the line before their
fence; an unmarked shell fence (``sh``, ``bash``, ``console`` or a bare ```` ``` ````) fails
:func:`test_every_shell_snippet_is_marked`: output is tagged ```` ```text ````, unit files
```` ```ini ````.

* ``install``: run in document order with ``bash -e`` in a copy of the checkout, with the system
  paths moved under a temporary root (:func:`sandboxed`). This machine has no systemd as PID 1
  and is shared: ``useradd`` and ``systemctl`` are replaced by commands that record their
  arguments, and each unit the snippets enable is checked by ``systemd-analyze verify`` with its
  ExecStart pointing at the virtualenv the snippets built. Everything else is real: the wheel is
  built, the virtualenv created, each role's extra installed from it.
* ``slurm-hook``, ``slurm-epilog-slurmctld``: installed as Prolog/Epilog/EpilogSlurmctld of the real
  Slurm (``scripts/slurm-up.sh``), a job run, and what they publish read back from the real Kafka
  (run under ``flock /tmp/pw-slurm.lock``).
* ``health-hook``: run as slurmd would (``sh FILE prolog``); its result read back from Kafka.
* ``drain-install``: the drain controller's section, run under the install root (``systemctl``
  recorded, ``drain-controller status`` real).
* ``cli-checked``: not run (fixed ports shared with other tests, the secured broker's admin, or a
  change to the shared Slurm node): each ``peerwatch`` command line is parsed by the CLI's parser
  (:func:`test_cli_checked_snippets_name_commands_the_cli_accepts` says which and why).
* ``make``: README.md's first screen (``make demo``, ``make test``): CI runs the test command
  itself; here each named target must exist in the Makefile (``make -n`` dry run).

README.md's shell blocks are checked as docs/*.md's are.

The services: each long-running unit's ExecStart, with its Environment=/EnvironmentFile=, is
started from the install against the real Kafka (and Slurm for ``slurm watch`` and the drain
controller), must stay up, and must stop with status 0 on SIGTERM, without a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from peerwatch import cli
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import HEALTH, JOB_EVENTS, catalogue
from tests.integration.slurm_fixture import SlurmCluster
from tests.integration.slurm_kafka import TopicReader
from tests.integration.test_alertmanager import Records, finding
from tests.integration.test_slurm_hooks import slurm_up
from tests.integration.test_systemd_units import SERVICES, unit_settings, verify

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
KINDS = ("install", "slurm-hook", "slurm-epilog-slurmctld", "health-hook", "drain-install",
         "cli-checked", "make")  # fmt: skip
#: Fence languages that hold shell commands; a bare fence counts as one (tag output ```text).
SHELL_LANGS = ("sh", "bash", "shell", "console", "")
#: System paths the snippets and units use, moved under the test's root.
SYSTEM_PATHS = ("/opt/peerwatch", "/etc/peerwatch", "/etc/systemd/system", "/etc/slurm",
                "/var/lib/peerwatch", "/var/cache/peerwatch", "/run/peerwatch",
                "/usr/local/sbin")  # fmt: skip
#: Stand-ins for the commands that would change this shared machine: record and succeed.
RECORDER = '#!/bin/sh\necho "$(basename "$0") $*" >> "$PEERWATCH_TEST_CALLS"\n'

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)\s*$")
_MARK = re.compile(r"^[ \t]*<!-- snippet: (?P<kind>[\w-]+) -->\s*$")


@dataclass(frozen=True)
class Snippet:
    kind: str | None
    lang: str
    body: str
    line: int


def snippets(path: Path) -> list[Snippet]:
    """Every fenced block of ``path``, with the kind of the marker line just above it."""
    lines = path.read_text().splitlines()
    out: list[Snippet] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        mark = _MARK.match(lines[i - 1]) if i else None
        body = textwrap.dedent("\n".join(lines[i + 1 : end])) + "\n"
        out.append(Snippet(mark["kind"] if mark else None, fence["lang"], body, i + 1))
        i = end + 1
    return out


#: Every Markdown file whose snippets are checked.
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def of_kind(kind: str) -> list[Snippet]:
    return [s for doc in DOCS for s in snippets(doc) if s.kind == kind]


def sandboxed(text: str, root: Path) -> str:
    """``text`` with every system path moved under ``root``."""
    for path in SYSTEM_PATHS:
        text = text.replace(path, f"{root}{path}")
    return text


def test_every_shell_snippet_is_marked() -> None:
    for doc in DOCS:
        for snippet in snippets(doc):
            if snippet.lang in SHELL_LANGS:
                assert snippet.kind in KINDS, f"{doc.name}:{snippet.line}: unmarked sh snippet"
    assert {s.kind for s in snippets(DOC)} >= set(KINDS) - {"make"}
    assert "make" in {s.kind for s in snippets(ROOT / "README.md")}


@dataclass(frozen=True)
class Installed:
    root: Path
    calls: list[str]

    @property
    def peerwatch(self) -> Path:
        return self.root / "opt/peerwatch/venv/bin/peerwatch"


def _copy_checkout(dest: Path) -> None:
    shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(
        ".venv", ".git", "dist", "build", "*.egg-info", "__pycache__", ".*_cache", "*.so"))  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The ``install`` snippets run in order, under a temporary root."""
    tmp = tmp_path_factory.mktemp("snippets")
    tmp.chmod(0o755)  # slurmd and slurmctld run the hooks from here
    root, src, shims = tmp / "root", tmp / "src", tmp / "bin"
    for path in SYSTEM_PATHS:
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (root / "etc/systemd/system").mkdir(parents=True)
    _copy_checkout(src)
    shims.mkdir()
    for name in ("useradd", "systemctl"):
        (shims / name).write_text(RECORDER)
        (shims / name).chmod(0o755)
    calls = tmp / "calls.log"
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}",
           "PEERWATCH_TEST_CALLS": str(calls)}  # fmt: skip
    for snippet in of_kind("install"):
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", sandboxed(snippet.body, root)],
                              cwd=src, env=env, capture_output=True, text=True, timeout=600,
                              check=False)  # fmt: skip
        assert done.returncode == 0, (snippet.line, done.stderr[-3000:])
    return Installed(root, calls.read_text().splitlines())


def test_install_snippets_create_the_user_and_enable_every_service(installed: Installed) -> None:
    assert any(
        c.startswith("useradd --system") and c.endswith(" peerwatch") for c in installed.calls
    )
    enabled = {unit for call in installed.calls if call.startswith("systemctl enable --now")
               for unit in call.split()[3:]}  # fmt: skip
    for unit in SERVICES:
        assert unit.removesuffix(".service") in enabled, unit
    assert "peerwatch-health.timer" in enabled


def test_installed_units_verify_against_the_installed_binary(
    installed: Installed, tmp_path: Path
) -> None:
    units = installed.root / "etc/systemd/system"
    names = sorted(p.name for p in units.iterdir())
    assert set(SERVICES) <= set(names)
    for name in names:  # ExecStart= is the virtualenv the snippets built: it must exist
        (tmp_path / name).write_text(sandboxed((units / name).read_text(), installed.root))
    done = verify(tmp_path, names)
    assert done.returncode == 0 and done.stderr == "", done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ("agent",),
        ("health",),
        ("slurm", "watch"),
        ("drain-controller", "run"),
        ("stream",),
        ("archive",),
        ("export", "otlp"),
        ("export", "alertmanager"),
        ("job",),
    ],
)
def test_every_role_command_runs_from_the_install(
    installed: Installed, command: tuple[str, ...]
) -> None:
    done = subprocess.run([str(installed.peerwatch), *command, "--help"], capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


def _write_hook(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    path.chmod(0o755)


def _site_env(installed: Installed, kafka: KafkaSettings, prefix: str) -> None:
    """What the operator puts in /etc/peerwatch/env (the snippet's example names other hosts)."""
    (installed.root / "etc/peerwatch/env").write_text(
        f"PEERWATCH_KAFKA_BOOTSTRAP={kafka.bootstrap_servers}\nPEERWATCH_TOPIC_PREFIX={prefix}\n"
    )


def test_health_hook_sources_the_settings_and_publishes(
    installed: Installed, kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    _site_env(installed, kafka_settings, topic_prefix)
    [health] = of_kind("health-hook")
    hook = installed.root / "usr/local/sbin/peerwatch-health"
    _write_hook(hook, sandboxed(health.body, installed.root))
    (installed.root / "run/peerwatch").mkdir(parents=True, exist_ok=True)
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    reader = TopicReader(kafka_settings, topic_prefix + HEALTH.name, "HealthCheckResult")
    # As slurmd runs it: root, no PATH, the phase as argument. This machine has no NVIDIA driver,
    # so the check is CRITICAL (exit 2, which drains a real node): the point here is the wiring.
    done = subprocess.run(["/bin/sh", str(hook), "prolog"], env={}, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stdout.startswith("PEERWATCH PROLOG CRITICAL"), done.stdout
    # Published under the prefix from /etc/peerwatch/env: the settings were exported.
    [record] = reader.read_until(lambda rs: len(rs) >= 1, timeout_s=30)
    assert (record["phase"], record["status"]) == ("PROLOG", "CRITICAL")


def _admin_comment(cluster: SlurmCluster, job_id: str) -> str:
    """The job's AdminComment as ``sacct`` reads it after the job (what the docs promise)."""
    return cluster.cmd("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "AdminComment").strip()


def test_slurm_hooks_from_the_docs_run_on_the_real_slurm(
    installed: Installed,
    slurm_cluster: SlurmCluster,
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    _site_env(installed, kafka_settings, topic_prefix)
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    [hook] = of_kind("slurm-hook")
    [ctld] = of_kind("slurm-epilog-slurmctld")
    slurm_dir = installed.root / "etc/slurm"
    prolog, epilog = slurm_dir / "peerwatch-prolog", slurm_dir / "peerwatch-epilog"
    _write_hook(prolog, sandboxed(hook.body, installed.root))
    # The snippet's own instruction: "and -epilog with "epilog"".
    _write_hook(
        epilog, sandboxed(hook.body.replace("slurm prolog", "slurm epilog"), installed.root)
    )
    _write_hook(slurm_dir / "peerwatch-epilog-slurmctld", sandboxed(ctld.body, installed.root))
    reader = TopicReader(kafka_settings, topic_prefix + JOB_EVENTS.name, "JobEvent")
    slurm_up({"PEERWATCH_SLURM_PROLOG": str(prolog), "PEERWATCH_SLURM_EPILOG": str(epilog),
              "PEERWATCH_SLURM_EPILOG_SLURMCTLD": str(slurm_dir / "peerwatch-epilog-slurmctld")})  # fmt: skip
    try:
        job = slurm_cluster.sbatch(f"--output={tmp_path}/slurm-%j.out", "--gres=gpu:1",
                                   "--wrap", "sleep 1")  # fmt: skip
        slurm_cluster.wait_for_job_state(job, "COMPLETED", timeout_s=60)

        def both(rs: list[dict[str, object]]) -> bool:
            return {r["kind"] for r in rs if r["job_id"] == job} >= {"STARTED", "ENDED"}

        records = [r for r in reader.read_until(both, timeout_s=30) if r["job_id"] == job]
        assert {(r["kind"], r["source"]) for r in records} >= {("STARTED", "PROLOG"),
                                                               ("ENDED", "EPILOG")}  # fmt: skip
        # EpilogSlurmctld: `peerwatch job` read the job's events under the prefix of
        # /etc/peerwatch/env and stored its verdict where `sacct -o AdminComment` reads it.
        deadline = time.monotonic() + 90
        while not _admin_comment(slurm_cluster, job) and time.monotonic() < deadline:
            time.sleep(1)
        assert _admin_comment(slurm_cluster, job).startswith(f"peerwatch: job {job}")
    finally:
        slurm_up({})


#: The environment systemd gives a service before Environment= and EnvironmentFile= (systemd.exec).
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Bound on a service's clean stop after SIGTERM (systemd's TimeoutStopSec default is 90 s).
STOP_TIMEOUT_S = 60.0
#: How long a service must stay up, after it started, to count as running (s).
ALIVE_S = 5.0


def _env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of an EnvironmentFile= (no quoting is used in ours)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def unit_command(unit: Path, root: Path, scratch: Path) -> tuple[list[str], dict[str, str]]:
    """The ExecStart argument vector and the environment systemd would give it: Environment=
    in order, then each EnvironmentFile= (``-`` prefix: optional), over systemd's own PATH;
    the unit's system paths moved under ``root`` (the copy is written to ``scratch``)."""
    copy = scratch / unit.name
    copy.write_text(sandboxed(unit.read_text(), root))
    settings = unit_settings(copy)
    env = {"PATH": SYSTEMD_PATH, "LANG": "C.UTF-8"}
    for assignment in settings.get("Service.Environment", []):
        for word in shlex.split(assignment):
            key, _, value = word.partition("=")
            env[key] = value
    for name in settings.get("Service.EnvironmentFile", []):
        path = Path(name.removeprefix("-"))
        if path.exists() or not name.startswith("-"):
            env.update(_env_file(path))
    [exec_start] = settings["Service.ExecStart"]
    return shlex.split(exec_start), env


def _role_env(installed: Installed, kafka: KafkaSettings, prefix: str) -> None:
    """/etc/peerwatch/env and the optional per-role files the units read, as an operator writes
    them for this machine: the shared Kafka, a prefix of our own, nothing on a fixed port.

    The collector and Alertmanager URLs point at a closed loopback port: a service must keep
    running (and retrying) while its sink is away. The agent runs with
    ``PEERWATCH_AGENT_ALLOW_NO_GPU`` (docs/configuration.md): this machine has no NVML."""
    etc = installed.root / "etc/peerwatch"
    closed = _closed_port()
    (etc / "env").write_text(
        f"PEERWATCH_KAFKA_BOOTSTRAP={kafka.bootstrap_servers}\n"
        f"PEERWATCH_TOPIC_PREFIX={prefix}\n"
        "PEERWATCH_AGENT_ALLOW_NO_GPU=true\n"
    )
    (etc / "export.env").write_text(
        f"PEERWATCH_EXPORT_ENDPOINT=http://127.0.0.1:{closed}\nPEERWATCH_EXPORT_INTERVAL_S=1\n"
    )
    (etc / "alertmanager.env").write_text(f"PEERWATCH_ALERTMANAGER_URL=http://127.0.0.1:{closed}\n")
    (etc / "drain.env").write_text("PEERWATCH_DRAIN_ENFORCE=false\n")  # shadow mode


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: The services that read the real Slurm (run under ``flock /tmp/pw-slurm.lock``).
SLURM_SERVICES = ("peerwatch-slurm-watch.service", "peerwatch-drain-controller.service")


def _start_and_stop(
    installed: Installed,
    names: list[str],
    kafka: KafkaSettings,
    prefix: str,
    logs: Path,
    while_up: Callable[[Callable[[], None]], None] = lambda alive: None,
) -> None:
    """Each unit's ExecStart in ``names``, as systemd would run it (its Environment= and
    EnvironmentFile= settings, state directories created as StateDirectory= would), from the
    virtualenv the install snippets built: all started together, each must stay up
    :data:`ALIVE_S` (and through ``while_up(alive)``, whose ``alive`` asserts it), then SIGTERM
    must stop each with status 0 within :data:`STOP_TIMEOUT_S`
    and no traceback in its output. User=/Group= and the sandboxing are not applied (no systemd
    as PID 1 here): ``systemd-analyze verify`` checks them in the test above."""
    _role_env(installed, kafka, prefix)
    ensure_topics(kafka, catalogue(prefix))
    for state in ("var/lib/peerwatch", "var/lib/peerwatch-archive", "var/cache/peerwatch",
                  "run/peerwatch"):  # fmt: skip
        (installed.root / state).mkdir(parents=True, exist_ok=True)
    units = installed.root / "etc/systemd/system"
    procs: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
    try:
        for name in names:
            argv, env = unit_command(units / name, installed.root, logs)
            assert Path(argv[0]) == installed.peerwatch, argv
            log = logs / f"{name}.log"
            with log.open("wb") as out:
                procs[name] = (subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                                cwd=logs), log)  # fmt: skip
        started = time.monotonic()

        def alive() -> None:
            for name, (proc, log) in procs.items():
                assert proc.poll() is None, (name, proc.returncode, log.read_text()[-3000:])

        # Alive: each still running ALIVE_S after the start (polled, so a crash shows at once).
        while time.monotonic() - started < ALIVE_S:
            alive()
            time.sleep(0.2)
        while_up(alive)
        alive()
        for proc, _ in procs.values():
            proc.send_signal(signal.SIGTERM)
        for name, (proc, log) in procs.items():
            status = proc.wait(timeout=STOP_TIMEOUT_S)
            text = log.read_text()
            assert status == 0, (name, status, text[-3000:])
            assert "Traceback" not in text, (name, text[-3000:])
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def _wait_in_log(log: Path, text: str, alive: Callable[[], None], timeout_s: float = 60) -> None:
    """Poll ``log`` until it holds ``text``, asserting every service is still up meanwhile;
    fails after ``timeout_s`` (a hang guard, not a timing assert)."""
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        alive()
        assert time.monotonic() < deadline, (text, log.read_text()[-3000:])
        time.sleep(0.2)


def test_kafka_services_start_from_the_install_and_stop_on_sigterm(
    installed: Installed, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    """stream, archive, export otlp and alertmanager (their sinks on a closed port: they must
    keep running and retrying: ``sinks_are_retried``) and the agent (no NVML here: ``PEERWATCH_AGENT_ALLOW_NO_GPU``)."""
    names = [n for n in SERVICES if n not in SLURM_SERVICES]

    def sinks_are_retried(alive: Callable[[], None]) -> None:
        """A confirmed finding makes the Alertmanager exporter post an alert, and the OTLP
        exporter exports every second: both sinks are closed ports, so each must log the
        failure and stay up to retry."""
        now = int(time.time() * 1000)
        Records(kafka_settings, topic_prefix).finding(
            finding("CONFIRMED", "77", "gpu00001", 3, now)
        )
        for unit, failure in (("export-alertmanager", "alerts kept, retry in"),
                              ("export-otlp", "StatusCode.UNAVAILABLE")):  # fmt: skip
            _wait_in_log(tmp_path / f"peerwatch-{unit}.service.log", failure, alive)

    _start_and_stop(installed, names, kafka_settings, topic_prefix, tmp_path, sinks_are_retried)


def test_slurm_services_start_from_the_install_and_stop_on_sigterm(
    installed: Installed,
    slurm_cluster: SlurmCluster,
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    tmp_path: Path,
) -> None:
    """``slurm watch`` and ``drain-controller run`` (shadow mode: it changes nothing in Slurm)
    against the real Slurm."""
    assert slurm_cluster.cmd("sinfo", "-h", "-o", "%n").strip()  # Slurm is up

    def slurm_is_read(alive: Callable[[], None]) -> None:
        """The watcher publishes what the real Slurm holds; the controller says it is shadowed."""
        for unit, evidence in (("slurm-watch", "watch: published"),
                               ("drain-controller", "running in SHADOW mode")):  # fmt: skip
            _wait_in_log(tmp_path / f"peerwatch-{unit}.service.log", evidence, alive)

    _start_and_stop(
        installed, list(SLURM_SERVICES), kafka_settings, topic_prefix, tmp_path, slurm_is_read
    )


def _commands(body: str) -> list[list[str]]:
    """The simple commands of a snippet: comments dropped, split at ``;``, ``&&``, ``&`` and
    ``|``, leading ``VAR=value`` assignments removed."""
    out: list[list[str]] = []
    for line in body.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word.strip(";&|"):
                words.append(word)
                continue
            while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                words.pop(0)
            if words:
                out.append(words)
            words = []
    return out


#: How the snippets name the CLI: installed, or the checkout's virtualenv (README.md).
PEERWATCH = ("peerwatch", ".venv/bin/peerwatch")


def test_cli_checked_snippets_name_commands_the_cli_accepts() -> None:
    """``cli-checked`` snippets are not run: they start services on fixed ports other engineers'
    tests use (``prometheus start``: 9090/4317/8889; ``kafka start --secure``: 29092), need the
    secured broker and its admin (``topics create/acls`` as admin) or change the shared Slurm
    node (``drain-controller resume NODE``). Each ``peerwatch`` command line in them is parsed
    by the CLI's own parser (a stale flag or subcommand fails here); the other commands
    (``apt-get``, ``curl``) are standard tools. Those services themselves run in their own
    tests on free ports (tests/integration/test_prometheus.py, test_secure_kafka.py)."""
    checked = of_kind("cli-checked")
    assert checked
    for snippet in checked:
        commands = _commands(snippet.body)
        ours = [c for c in commands if c[0] in PEERWATCH]
        assert ours, snippet.line
        assert {c[0] for c in commands} <= {*PEERWATCH, "apt-get", "curl", "head", "open"}, (
            snippet.line
        )
        for argv in ours:
            words = [w for w in argv[1:] if w != "..."]  # "more of the same" in the prose
            args = cli.build_parser(words[0]).parse_args(words)  # SystemExit on a stale flag
            assert callable(args.func), argv


def test_make_snippets_name_targets_the_makefile_has() -> None:
    """README.md's two commands on a fresh machine: each ``make TARGET`` line names a target the
    Makefile has (a dry run, ``make -n``, resolves it without running anything)."""
    targets = [c for s in of_kind("make") for c in _commands(s.body)]
    assert {tuple(c) for c in targets} >= {("make", "demo"), ("make", "test")}
    for argv in targets:
        assert argv[0] == "make" and len(argv) == 2, argv
        done = subprocess.run(["make", "-n", "-C", str(ROOT), argv[1]], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, (argv, done.stderr[-1000:])


def test_drain_controller_install_snippet_runs(
    installed: Installed, kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    """The drain controller's section, run as written under the install root: the unit copied,
    ``systemctl`` recorded (no systemd as PID 1 here), ``drain-controller status`` run for real
    from the installed virtualenv (it reads the state file only)."""
    _site_env(installed, kafka_settings, topic_prefix)
    [snippet] = of_kind("drain-install")
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "systemctl").write_text(RECORDER)
    (shims / "systemctl").chmod(0o755)
    calls = tmp_path / "calls.log"
    env = {"PATH": f"{shims}:{installed.peerwatch.parent}:{SYSTEMD_PATH}", "HOME": str(tmp_path),
           "PEERWATCH_TEST_CALLS": str(calls),
           **_env_file(installed.root / "etc/peerwatch/env")}  # fmt: skip
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", sandboxed(snippet.body, installed.root)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    unit = installed.root / "etc/systemd/system/peerwatch-drain-controller.service"
    assert unit.read_text() == (ROOT / "docs/systemd" / unit.name).read_text()
    assert calls.read_text().splitlines() == ["systemctl enable --now peerwatch-drain-controller"]
    status = json.loads(done.stdout)
    assert isinstance(status, dict) and status, done.stdout
