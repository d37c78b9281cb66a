"""The Grafana dashboards as files: a datasource variable everywhere, counters only through
rate()/increase(), links that lead fleet -> job -> GPU, annotations for findings and drains, and
the provisioning that docker/compose.yaml loads. (Every query runs on a real Prometheus in
tests/integration/test_prometheus.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("fleet", "job", "gpu", "health")


def dashboard(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((ROOT / "dashboards" / f"peerwatch-{name}.json").read_text())
    return doc


def exprs(doc: dict[str, Any]) -> list[str]:
    out = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    return out + [a["expr"] for a in doc.get("annotations", {}).get("list", []) if "expr" in a]


@pytest.mark.parametrize("name", NAMES)
def test_every_query_uses_the_datasource_variable(name: str) -> None:
    doc = dashboard(name)
    assert "__inputs" not in doc
    first = doc["templating"]["list"][0]
    assert (first["name"], first["type"], first["query"]) == (
        "datasource",
        "datasource",
        "prometheus",
    )
    text = json.dumps({k: v for k, v in doc.items() if k != "uid"})
    uids = {m for m in re.findall(r'"uid": "([^"]*)"', text) if m != "-- Grafana --"}
    assert uids == {"${datasource}"}


@pytest.mark.parametrize("name", NAMES)
def test_counters_only_through_rate_or_increase(name: str) -> None:
    """A counter is read through rate()/increase(), or, for a series born inside the range (a
    counter series starts at its first event: increase() misses it), as ``X unless X offset R``
    beside ``increase(X[R]) and X offset R``, never as a raw total."""
    for expr in exprs(dashboard(name)):
        for m in re.finditer(r"\b[a-z_:]+_total\b(\{[^}]*\})?", expr):
            before, after = expr[: m.start()], expr[m.end() :]
            through = re.search(r"(rate|increase)\($", before)
            born = after.startswith(" offset ") or (
                after.startswith(" unless ") and m.group() + " offset " in after
            )
            assert through or born, f"{m.group()} raw in {expr}"
            if born:  # the new-series idiom always sits beside the reset-safe increase()
                assert f"increase({m.group()}[" in expr


def test_fleet_and_job_filter_by_cluster_partition_and_user() -> None:
    for name in ("fleet", "job"):
        doc = dashboard(name)
        scope = [
            v for v in doc["templating"]["list"] if v["name"] in ("cluster", "partition", "user")
        ]
        assert [v["name"] for v in scope] == ["cluster", "partition", "user"]
        assert all(v["includeAll"] and v["allValue"] == ".*" for v in scope)
    [job_var] = [v for v in dashboard("job")["templating"]["list"] if v["name"] == "job_id"]
    assert 'slurm_user=~"$user"' in job_var["definition"]  # the job list follows the scope
    assert all('slurm_partition=~"$partition"' in e for e in exprs(dashboard("fleet"))
               if "peerwatch_gpu_sm_clock_ratio" in e)  # fmt: skip


def test_links_lead_from_fleet_to_job_to_gpu() -> None:
    def urls(doc: dict[str, Any]) -> list[str]:
        return [link["url"] for p in doc["panels"]
                for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])]  # fmt: skip

    uids = {dashboard(n)["uid"] for n in NAMES}
    assert any(u.startswith("/d/peerwatch-job/") for u in urls(dashboard("fleet")))
    assert any(u.startswith("/d/peerwatch-gpu/") for u in urls(dashboard("job")))
    assert any(u.startswith("/d/peerwatch-job/") for u in urls(dashboard("gpu")))
    for name in NAMES:
        for u in urls(dashboard(name)):
            assert u.split("/")[2] in uids


@pytest.mark.parametrize("name", ["fleet", "job", "gpu"])
def test_findings_and_drains_are_annotations(name: str) -> None:
    names = [a["name"] for a in dashboard(name)["annotations"]["list"] if "expr" in a]
    assert names == ["Findings", "Drains"]


def test_compose_provisions_the_datasource_and_the_dashboards() -> None:
    compose = (ROOT / "docker" / "compose.yaml").read_text()
    assert '"./grafana/provisioning:/etc/grafana/provisioning:ro"' in compose
    assert '"../dashboards:/var/lib/grafana/dashboards/peerwatch:ro"' in compose
    prov = ROOT / "docker" / "grafana" / "provisioning"
    datasource = (prov / "datasources" / "peerwatch.yaml").read_text()
    assert "type: prometheus" in datasource and "url: http://prometheus:9090" in datasource
    dashboards = (prov / "dashboards" / "peerwatch.yaml").read_text()
    assert "path: /var/lib/grafana/dashboards/peerwatch" in dashboards
