"""scripts/demo end to end, shortened: three workers on one SQLite file, each slot once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.slow, pytest.mark.workers]  # three worker processes


def test_demo_three_workers_run_each_slot_once(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DEMO_SECONDS": "12",
        "DEMO_VENV": sys.prefix,  # this interpreter's virtualenv, where the package is installed
        "TMPDIR": str(tmp_path),
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [str(ROOT / "scripts" / "demo")], env=env, cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Every slot ran exactly once." in output
    assert "RAN MORE THAN ONCE" not in output
    runs = re.findall(r"^  \d\d:\d\d:\d\d  (.+)  \[ran once\]$", output, re.MULTILINE)
    assert len(runs) >= 8, output  # 12 s of 5 s, 6 s, 7 s and 10 s schedules
    assert all(re.search(r"worker-[123] \(attempt 1", run) for run in runs), runs
    # the one-off fires 12 s after the start: right at the end, or not within 12 s
    assert "reports.launch_announcement" in output
