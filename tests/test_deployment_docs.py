"""docs/deployment.md's manifests have the fields the page says they must have.

Each manifest is a fenced block after ``<!-- manifest: NAME -->``; the YAML is
parsed with PyYAML and the unit file with configparser, and each is checked
against the worker's real defaults (``shutdown_grace``) and the real CLI (every
``--flag`` a manifest passes to ``venturi worker`` exists).
"""

from __future__ import annotations

import configparser
import inspect
import re
import shlex
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import pytest
import yaml
from typer.testing import CliRunner

import venturi_redis as vr
from venturi_redis._worker import metrics as metrics_module
from venturi_redis.cli.commands import app
from venturi_redis.dashboard import create_app

DOC = Path(__file__).resolve().parent.parent / "docs" / "deployment.md"
_MANIFEST_RE = re.compile(
    r"<!-- manifest: (?P<name>[\w-]+) -->\n```(?P<lang>\w+)\n(?P<body>.*?)^```", re.S | re.M
)


def manifests() -> dict[str, str]:
    return {m["name"]: m["body"] for m in _MANIFEST_RE.finditer(DOC.read_text())}


def default_grace() -> float:
    return float(inspect.signature(vr.Worker).parameters["shutdown_grace"].default)


def worker_flags() -> set[str]:
    res = CliRunner().invoke(app, ["worker", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    return set(re.findall(r"(--[a-z][a-z-]+)", res.output))


def check_flags(argv: list[str]) -> None:
    assert argv[argv.index("worker") - 1].endswith("venturi")
    known = worker_flags()
    used = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    assert used <= known, f"flags the CLI does not have: {sorted(used - known)}"


def test_the_page_has_both_manifests() -> None:
    assert set(manifests()) == {"kubernetes", "systemd", "keda", "keda-many", "hpa"}


def test_kubernetes_deployment() -> None:
    doc: dict[str, Any] = yaml.safe_load(manifests()["kubernetes"])
    assert (doc["apiVersion"], doc["kind"]) == ("apps/v1", "Deployment")
    assert doc["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = doc["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > default_grace()
    (container,) = pod["containers"]
    argv = container["command"]
    check_flags(argv)
    health = next(a.split("=", 1)[1] for a in argv if a.startswith("--health-file="))
    probe = container["livenessProbe"]
    assert health in " ".join(probe["exec"]["command"])
    assert "readinessProbe" not in container  # a worker serves no traffic
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert set(resources["limits"]) == {"memory"}  # no CPU limit: throttling misses renewals
    assert any(e["name"] == "REDIS_URL" for e in container["env"])


def deployment() -> tuple[str, str]:
    """The Deployment's name and the queue its worker consumes (the kubernetes manifest)."""
    doc: dict[str, Any] = yaml.safe_load(manifests()["kubernetes"])
    argv = doc["spec"]["template"]["spec"]["containers"][0]["command"]
    return doc["metadata"]["name"], next(a.split("=", 1)[1] for a in argv if a.startswith("--queue="))


def test_keda_scaled_object_on_the_scale_route() -> None:
    """KEDA's metrics-api scaler: the URL is the dashboard's route for the Deployment's queue,
    and ``valueLocation`` names a number the route really answers (read through the app)."""
    scaled, auth = yaml.safe_load_all(manifests()["keda"])
    name, queue = deployment()
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == name
    assert 0 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "metrics-api"
    meta = trigger["metadata"]
    assert all(isinstance(v, str) for v in meta.values())  # KEDA's metadata is strings only
    url = urlsplit(meta["url"])
    assert url.path == f"/api/queues/{queue}/scale"
    assert float(meta["targetValue"]) > 0
    assert meta["authMode"] == "bearer"
    assert (auth["apiVersion"], auth["kind"]) == ("keda.sh/v1alpha1", "TriggerAuthentication")
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert [p["parameter"] for p in auth["spec"]["secretTargetRef"]] == ["token"]
    # The route, read-only and behind a token as the page says, answers the field as a number.
    body = anyio.run(_scale_route, url.path)
    assert isinstance(body[meta["valueLocation"]], int | float)


async def _scale_route(path: str) -> dict[str, Any]:
    client = vr.Client.from_url(f"memory://deploy-{uuid.uuid4().hex[:8]}")
    try:
        app = create_app(client, read_only=True, token="t0ken")
        transport = httpx.ASGITransport(app=app)
        headers = {"authorization": "Bearer t0ken"}
        async with httpx.AsyncClient(transport=transport, base_url="http://dash", headers=headers) as h:
            r = await h.get(path)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body
    finally:
        await client.aclose()


def test_keda_scaled_object_on_the_aggregate_route() -> None:
    """The many-queues ScaledObject: a metrics-api trigger on ``/api/scale`` with a prefix or
    a list of queues, through the TriggerAuthentication of the first manifest; the route,
    read-only and behind a token, answers ``valueLocation`` as a number."""
    (scaled,) = yaml.safe_load_all(manifests()["keda-many"])
    _, auth = yaml.safe_load_all(manifests()["keda"])
    assert (scaled["apiVersion"], scaled["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"]
    assert 0 <= scaled["spec"]["minReplicaCount"] < scaled["spec"]["maxReplicaCount"]
    assert scaled["spec"]["pollingInterval"] >= 15
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "metrics-api"
    meta = trigger["metadata"]
    assert all(isinstance(v, str) for v in meta.values())
    url = urlsplit(meta["url"])
    assert url.path == "/api/scale"
    asked = parse_qs(url.query, keep_blank_values=True)
    assert set(asked) <= {"queues", "prefix"} and asked
    assert float(meta["targetValue"]) > 0
    assert meta["authMode"] == "bearer"
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    body = anyio.run(_scale_route, f"{url.path}?{url.query}")
    assert isinstance(body[meta["valueLocation"]], int | float)
    assert body["queues"] == 0  # no tenant yet: zeros, not an error


def test_hpa_on_the_prometheus_lag() -> None:
    doc: dict[str, Any] = yaml.safe_load(manifests()["hpa"])
    name, queue = deployment()
    assert (doc["apiVersion"], doc["kind"]) == ("autoscaling/v2", "HorizontalPodAutoscaler")
    target = doc["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", name)
    assert 1 <= doc["spec"]["minReplicas"] <= doc["spec"]["maxReplicas"]  # no worker, no metric
    (metric,) = doc["spec"]["metrics"]
    assert metric["type"] == "External"
    ext = metric["external"]
    # The gauge the workers really export, by the label they really set.
    gauge = ext["metric"]["name"]
    assert f'"{gauge}"' in inspect.getsource(metrics_module)
    assert ext["metric"]["selector"]["matchLabels"] == {"queue": queue}
    assert ext["target"]["type"] in ("Value", "AverageValue")
    assert float(ext["target"][ext["target"]["type"][0].lower() + ext["target"]["type"][1:]]) > 0


def test_systemd_unit() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(manifests()["systemd"])
    service = unit["Service"]
    assert service["KillSignal"] == "SIGTERM"
    assert service["KillMode"] == "mixed"
    assert float(service["TimeoutStopSec"]) > default_grace()
    assert service["Restart"] == "on-failure"
    check_flags(shlex.split(service["ExecStart"]))


@pytest.mark.parametrize("flag", ["--version"])
def test_the_cli_flags_the_page_names_exist(flag: str) -> None:
    res = CliRunner().invoke(app, [flag])
    assert res.exit_code == 0, res.output
    assert res.output.strip() == f"venturi {vr.__version__}"
