"""peerwatch's Prometheus rules, checked and unit-tested by Debian's promtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

from peerwatch.local.prometheus import RULES_FILE, binary


def test_promtool_checks_the_rules() -> None:
    proc = subprocess.run([binary("promtool"), "check", "rules", str(RULES_FILE)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 9 rules found" in proc.stdout


def test_promtool_unit_tests_pass_and_catch_a_wrong_expectation(tmp_path: Path) -> None:
    tests = RULES_FILE.with_name("peerwatch.rules.test.yml")
    proc = subprocess.run([binary("promtool"), "test", "rules", str(tests)],
                          capture_output=True, text=True, timeout=60, cwd=tests.parent)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The same tests with one wrong expectation fail: promtool really compares.
    wrong = tests.read_text().replace("is 60000 samples behind", "is 6 samples behind")
    assert wrong != tests.read_text()
    (tmp_path / "peerwatch.rules.yml").write_text(RULES_FILE.read_text())
    (tmp_path / "wrong.test.yml").write_text(wrong)
    proc = subprocess.run([binary("promtool"), "test", "rules", "wrong.test.yml"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert proc.returncode != 0 and "PeerwatchStreamWorkerLagging" in proc.stdout + proc.stderr
