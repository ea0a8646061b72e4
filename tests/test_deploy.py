"""The deployment files (deploy/, docs/deploy.md): the compose file validates against the
Compose specification's JSON schema (vendored in tests/data, see its README), a broken
one does not, and the worker command it runs is the one run here: two workers started
with exactly that command (only its ``${...}`` variables set, as Compose would: the
Redis and the site of the test) crawl a local site through a real redis-server. The
Kubernetes manifest runs the same command (plus LEASED_KEEP_ALIVE), and its liveness
probe's command tells a live worker of this host from none."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from scrapy_leased.frontier.keys import CrawlKeys
from scrapy_leased.settings.defaults import LEASE_SECONDS
from tests.support.workers import Worker, wait_for

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
KUBERNETES = DEPLOY / "kubernetes.yaml"
SCHEMA = REPO / "tests" / "data" / "compose-spec.json"
IMAGE_ROOT = "/app"  # where deploy/Dockerfile copies the repository
SERVICE_REDIS_URL = "redis://redis:6379/0"  # the redis service, by its name
WAIT = 120


# -- Compose's own rules, as far as these files use them ---------------------------------

_DURATION_RE = re.compile(r"^(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+$")
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60,
                   "h": 3600}
_VAR_RE = re.compile(r"\$(\$|\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*|)")
_EXPR_RE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:(:-|-)(.*))?$", re.S)


def duration_seconds(text: str) -> float:
    """A Compose duration (Go's syntax: ``1m30s``, ``60s``, ``500ms``) in seconds."""
    if not _DURATION_RE.match(text):
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * _DURATION_UNITS[u]
               for n, u in re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text))


FORMATS = jsonschema.FormatChecker(formats=())


@FORMATS.checks("duration", raises=ValueError)
def _is_duration(value: object) -> bool:
    return not isinstance(value, str) or duration_seconds(value) >= 0


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable interpolation of every string in a loaded file: ``$$`` is a
    ``$``; ``${VAR}`` and ``$VAR``; ``${VAR:-default}`` (unset or empty) and
    ``${VAR-default}`` (unset). Anything else after a ``$`` is an error here."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        token = m.group(1)
        if token == "$":
            return "$"
        expr = token[1:-1] if token.startswith("{") else token
        parts = _EXPR_RE.match(expr)
        if not parts:
            raise ValueError(f"interpolation this test does not know: {m.group(0)!r}")
        name, op, default = parts.groups()
        got = env.get(name)
        if op == ":-" and not got or op == "-" and got is None:
            return str(default)
        return got or ""

    return _VAR_RE.sub(one, value)


def load_compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    assert isinstance(doc, dict)
    return doc


def compose_errors(doc: Any) -> list[str]:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    # the draft its $schema names, in a spelling of that URL jsonschema does not know
    assert schema["$schema"] == "http://json-schema.org/draft/2019-09/schema#"
    jsonschema.Draft201909Validator.check_schema(schema)
    validator = jsonschema.Draft201909Validator(schema, format_checker=FORMATS)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


def worker_command(env: dict[str, str] | None = None) -> list[str]:
    """The worker service's command, interpolated with ``env`` (nothing set: defaults)."""
    command = interpolate(load_compose(), env or {})["services"]["worker"]["command"]
    assert isinstance(command, list) and all(isinstance(a, str) for a in command)
    return command


def options(command: list[str], flag: str) -> dict[str, str]:
    """The ``-s`` (or ``-a``) ``NAME=VALUE`` pairs of a ``scrapy crawl`` command."""
    return dict(command[i + 1].split("=", 1) for i, a in enumerate(command[:-1]) if a == flag)


def lease_seconds(command: list[str]) -> float:
    return float(options(command, "-s").get("LEASED_LEASE_SECONDS", LEASE_SECONDS))


def kubernetes() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(KUBERNETES.read_text(encoding="utf-8")) if d]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [d for d in kubernetes() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


def k8s_worker() -> dict[str, Any]:
    spec = k8s_object("Deployment", "scrapy-leased-worker")["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    return {"deployment": spec, "container": container}


# -- the compose file ----------------------------------------------------------------------


def test_the_compose_file_validates_against_the_compose_schema() -> None:
    doc = load_compose()
    assert compose_errors(doc) == []
    assert compose_errors(interpolate(doc, {})) == []  # Compose validates after interpolating


BROKEN: list[tuple[str, Any]] = [
    ("a misspelt service key", lambda d: d["services"]["worker"].update(stop_grace=60)),
    ("replicas not a number", lambda d: d["services"]["worker"]["deploy"].update(
        replicas="three")),
    ("a grace period that is no duration", lambda d: d["services"]["worker"].update(
        stop_grace_period="a minute")),
    ("an unknown depends_on condition", lambda d: d["services"]["worker"]["depends_on"][
        "redis"].update(condition="service_ready")),
    ("a command that is a number", lambda d: d["services"]["redis"].update(command=6379)),
    ("an unknown top-level key", lambda d: d.update(workers={"replicas": 3})),
]


@pytest.mark.parametrize("what,breaks", BROKEN, ids=[b[0] for b in BROKEN])
def test_a_broken_compose_file_does_not_validate(what: str, breaks: Any) -> None:
    doc = copy.deepcopy(load_compose())
    breaks(doc)
    assert compose_errors(doc), f"{what}: validated"


def test_the_compose_file_runs_a_fleet_on_one_redis_with_aof() -> None:
    doc = interpolate(load_compose(), {})
    services = doc["services"]
    redis_service, worker = services["redis"], services["worker"]
    command = redis_service["command"]
    pairs = {command[i]: command[i + 1] for i in range(1, len(command) - 1, 2)}
    assert command[0] == "redis-server"
    assert pairs["--appendonly"] == "yes" and pairs["--appendfsync"] == "everysec"
    assert pairs["--maxmemory-policy"] == "noeviction"
    volume, path = redis_service["volumes"][0].split(":")
    assert path == "/data" and volume in doc["volumes"]  # the redis image's data dir

    assert worker["deploy"]["replicas"] >= 2
    assert worker["stop_signal"] == "SIGTERM"
    cmd = worker["command"]
    assert duration_seconds(worker["stop_grace_period"]) > lease_seconds(cmd)
    assert worker["restart"] == "on-failure"  # a drained worker (exit 0) stays down
    assert options(cmd, "-s")["LEASED_REDIS_URL"] == SERVICE_REDIS_URL
    assert worker["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert cmd[:2] == ["scrapy", "crawl"] and len(cmd) % 2 == 1
    assert all(cmd[i] in ("-s", "-a") and "=" in cmd[i + 1] for i in range(3, len(cmd), 2))
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert f"COPY . {IMAGE_ROOT}\n" in dockerfile
    for name in ("site", "worker"):
        assert services[name]["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}


def test_the_kubernetes_workers_run_the_compose_command() -> None:
    compose = worker_command()
    k8s = k8s_worker()
    assert k8s["container"]["command"] == [*compose, "-s", "LEASED_KEEP_ALIVE=True"]
    assert k8s["container"]["workingDir"] == \
        interpolate(load_compose(), {})["services"]["worker"]["working_dir"]
    assert k8s["deployment"]["replicas"] >= 2
    grace = k8s["deployment"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > lease_seconds(compose)
    assert k8s_object("Service", "redis")["spec"]["ports"] == [{"port": 6379}]
    redis_set = k8s_object("StatefulSet", "scrapy-leased-redis")["spec"]
    args = redis_set["template"]["spec"]["containers"][0]["args"]
    assert args == interpolate(load_compose(), {})["services"]["redis"]["command"][1:]
    assert redis_set["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    site = k8s_object("Deployment", "scrapy-leased-site")["spec"]["template"]["spec"]
    assert site["containers"][0]["command"] == load_compose()["services"]["site"]["command"]


def test_the_guide_includes_the_files_it_explains() -> None:
    guide = (REPO / "docs" / "deploy.md").read_text(encoding="utf-8")
    for name in ("docker-compose.yml", "kubernetes.yaml"):
        assert f'--8<-- "deploy/{name}"' in guide, name


# -- the command, run ----------------------------------------------------------------------


def _scrapy(command: list[str]) -> list[str]:
    """``scrapy ...`` as run in the image: the console script of this Python."""
    assert command[0] == "scrapy"
    script = shutil.which("scrapy", path=str(Path(sys.executable).parent))
    return [script, *command[1:]] if script else [sys.executable, "-m", "scrapy", *command[1:]]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SCRAPY_") and k != "LEASED_REDIS_URL"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _project_dir(working_dir: str) -> Path:
    """The image's working directory, in this checkout."""
    assert working_dir.startswith(IMAGE_ROOT + "/"), working_dir
    return REPO / working_dir[len(IMAGE_ROOT) + 1:]


def _probe(redis_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The Kubernetes liveness probe's command, for the test's Redis."""
    command = k8s_worker()["container"]["livenessProbe"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"] and SERVICE_REDIS_URL in command[2]
    script = command[2].replace(SERVICE_REDIS_URL, redis_url)
    bindir = str(Path(sys.executable).parent)  # its scrapy and python: this one's
    env = {**_env(), "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")])}
    return subprocess.run(["sh", "-c", script], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_compose_worker_command_crawls_with_a_real_redis(
        redis_aof, make_site, start_worker, tmp_path: Path) -> None:
    """Two workers started with the compose file's command (LEASED_REDIS_URL and SITE_URL
    set to the test's Redis and site) crawl the site once between them on that Redis,
    finish, and log no warning that their crawl is local; the liveness probe of the
    Kubernetes manifest passes while they run and fails once they are gone."""
    site = make_site(pages=40)
    command = worker_command({"LEASED_REDIS_URL": redis_aof.url, "SITE_URL": site.url})
    assert options(command, "-s")["LEASED_REDIS_URL"] == redis_aof.url
    assert options(command, "-a")["site"] == site.url
    working_dir = interpolate(load_compose(), {})["services"]["worker"]["working_dir"]
    cwd = _project_dir(working_dir)
    crawl = command[2]  # the spider's name: the crawl id (LEASED_CRAWL_ID unset)
    r = redis_aof.client()
    keys = CrawlKeys(crawl)
    site.hold()  # both workers join one run of the crawl before any page is answered
    try:
        for i in range(2):
            w = Worker(f"c{i + 1}", _scrapy(command), tmp_path / f"c{i + 1}.log", None, _env(),
                       cwd)
            start_worker.workers.append(w)  # killed and reported by the fixture
        wait_for(lambda: r.zcard(keys.workers) == 2 and r.hlen(keys.worker_info) == 2, WAIT,
                 "both workers in the crawl's registry", start_worker.workers)
        alive = _probe(redis_aof.url, cwd)
        assert alive.returncode == 0, (alive.stdout, alive.stderr)
    finally:
        site.release()
    for w in start_worker.workers:
        assert w.wait(WAIT) == 0, w.log_tail()
        assert w.close_reason() == "finished", w.log_tail()
        log = w.log_text()
        assert f"Leased frontier {crawl} on {redis_aof.url}" in log, w.log_tail()
        assert "local to this machine" not in log and "embedded Redis" not in log
        assert "Traceback" not in log, w.log_tail()
    fetched = {p: n for p, n in site.count_by_path().items() if p.startswith("/p/")}
    assert fetched == {f"/p/{i}": 1 for i in range(40)}
    assert int(r.hget(keys.stats, "done")) == 40
    gone = _probe(redis_aof.url, cwd)  # status answered, and no worker of this host
    assert gone.returncode == 1 and "Traceback" not in gone.stderr, (gone.stdout, gone.stderr)


def test_the_site_service_command_serves_the_site(tmp_path: Path) -> None:
    """The site service's command (the test site of scrapy_leased.testing), bound to 127.0.0.1 on a free port
    instead of the container's 0.0.0.0:8000, starts and serves its pages."""
    command = list(load_compose()["services"]["site"]["command"])
    assert command[:3] == ["python", "-m", "scrapy_leased.testing.site"]
    for flag, value in (("--host", "127.0.0.1"), ("--port", "0")):
        command[command.index(flag) + 1] = value
    cwd = _project_dir(load_compose()["services"]["site"]["working_dir"])
    proc = subprocess.Popen([sys.executable, *command[1:]], cwd=cwd, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        urls = json.loads(proc.stdout.readline())["urls"]
        assert urls[0].startswith("http://127.0.0.1:")
        with urllib.request.urlopen(urls[0] + "/p/0", timeout=10) as page:
            assert page.status == 200 and b"<title>page 0</title>" in page.read()
    finally:
        proc.terminate()
        proc.wait(30)
