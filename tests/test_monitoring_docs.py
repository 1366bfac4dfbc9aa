"""docs/monitoring.md and docs/deployment.md: the rules, the dashboard and the probes.

The alert rules (the YAML block of the monitoring page) and the Grafana dashboard
(docs/grafana-dashboard.json) use only metrics the collector exports; the page's table
lists exactly those; the Kubernetes snippet probes the endpoints its worker serves.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import load_command_class

from django_anarchon.contrib.prometheus import METRIC_NAMES

from .support import ROOT

DOCS = ROOT / "docs"
_NAME = re.compile(r"\banarchon_[a-z_]+")
_FENCED_YAML = re.compile(r"^```yaml\n(.*?)^```", re.MULTILINE | re.DOTALL)


def exported() -> set[str]:
    """The series names a scrape shows: histograms add ``_bucket``, ``_count``, ``_sum``."""
    names = set()
    for name, kind in METRIC_NAMES.items():
        names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"} if kind == "histogram" else {name}
    return names


def yaml_blocks(page: str) -> list[Any]:
    return [yaml.safe_load(text) for text in _FENCED_YAML.findall((DOCS / page).read_text())]


def rules() -> dict[str, Any]:
    (document,) = [d for d in yaml_blocks("monitoring.md") if isinstance(d, dict) and "groups" in d]
    return document


def strings(value: Any, key: str) -> Iterator[str]:
    """Every string under ``key`` anywhere in a JSON/YAML document."""
    if isinstance(value, dict):
        for k, v in value.items():
            if k == key and isinstance(v, str):
                yield v
            else:
                yield from strings(v, key)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item, key)


def test_the_alert_rules_use_exported_metrics() -> None:
    document = rules()
    alerts = {rule["alert"]: rule["expr"] for group in document["groups"] for rule in group["rules"]}
    assert {"AnarchonJobWithoutSuccess", "AnarchonTakeoverStorm", "AnarchonStoreUnreachable",
            "AnarchonLatenessHigh"} <= set(alerts)
    for alert, expr in alerts.items():
        used = set(_NAME.findall(expr))
        assert used, alert
        assert used <= exported(), (alert, used - exported())


def test_the_rules_and_the_dashboard_pass_promtool(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); parsed only")
    document = rules()
    # The dashboard's queries too, as recording rules (its variables as "any value").
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = [e.replace("$scheduler", ".*").replace("$job", ".*")
             for e in strings(dashboard["panels"], "expr")]
    document["groups"].append({"name": "dashboard", "rules": [
        {"record": f"anarchon:dashboard_{i}", "expr": expr} for i, expr in enumerate(exprs)
    ]})
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(document))
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dashboard_uses_exported_metrics() -> None:
    dashboard = json.loads((DOCS / "grafana-dashboard.json").read_text())
    exprs = list(strings(dashboard["panels"], "expr"))
    assert len(exprs) >= len(dashboard["panels"])
    used = {name for expr in exprs for name in _NAME.findall(expr)}
    assert used <= exported(), used - exported()
    # Every metric is on the dashboard somewhere.
    assert {n.removesuffix("_bucket") for n in used} >= set(METRIC_NAMES), (
        set(METRIC_NAMES) - {n.removesuffix("_bucket") for n in used}
    )
    variables = [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    assert {name for q in variables for name in _NAME.findall(q)} <= exported()


def test_the_metrics_table_lists_every_metric() -> None:
    text = (DOCS / "monitoring.md").read_text()
    rows = re.findall(r"^\| `(anarchon_[a-z_]+)` \| (\w+) \|", text, re.MULTILINE)
    assert dict(rows) == METRIC_NAMES


def test_the_kubernetes_probes_match_the_worker() -> None:
    (container,) = [
        c for d in yaml_blocks("deployment.md") if isinstance(d, dict)
        for c in d.get("containers", []) if "livenessProbe" in c
    ]
    args = container["args"]
    assert args[:3] == ["python", "manage.py", "anarchon_worker"]
    command = load_command_class("django_anarchon", "anarchon_worker")
    options = command.create_parser("manage.py", "anarchon_worker").parse_args(args[3:])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": int(options.health_port), "metrics": int(options.metrics_port)}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": ports["health"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": ports["health"]}
    # Above the 2 s /readyz gives the store, or a slow store reads as a probe timeout.
    assert container["readinessProbe"]["timeoutSeconds"] > 2
