"""The short fault run of every backend (about a minute each; docs/faults.md).

Four ``anarchon_worker`` processes on a private store, killed, cut off, restarted and one
clock 5 s ahead, one 5 s behind, for ``FAULTS_SHORT_S`` seconds (35); the verdict comes from
the handlers' own logs (tests/faults/checker.py). ``FAULTS_SEED`` replays a run.
The long run is ``scripts/faults --backend NAME --slots 10000``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT

from .harness import PROFILES, Config, fault_dir, run, write_report

SHORT_S = float(os.environ.get("FAULTS_SHORT_S", "35"))

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.timeout(240)]


REPORTS = ROOT / ".tmp" / "faults" / "short"


@pytest.fixture
def out_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    """The run's logs, kept under .tmp/faults/short/ so that a failure can be read later."""
    with fault_dir(REPORTS, request.node.callspec.params["backend"]) as path:
        yield path


@pytest.mark.parametrize(
    "backend",
    [pytest.param(name, marks=getattr(pytest.mark, p.marker)) for name, p in PROFILES.items()],
)
def test_short_fault_run(backend: str, out_dir: Path) -> None:
    config = Config(backend, duration_s=SHORT_S)
    if os.environ.get("FAULTS_SEED"):
        config.seed = int(os.environ["FAULTS_SEED"])
    report = run(config, out_dir)
    write_report(report, REPORTS)
    print(report.summary())
    assert report.verdict.stats["kills"] >= 3, report.summary()
    assert report.verdict.ok, report.summary()
