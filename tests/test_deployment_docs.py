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
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

import venturi_redis as vr
from venturi_redis.cli.commands import app

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
    assert set(manifests()) == {"kubernetes", "systemd"}


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
