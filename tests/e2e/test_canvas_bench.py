"""The canvas benchmarks as smoke tests, so they never rot: each runs
small, on its own redis-server, and prints the figures it documents. No
timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def run(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout


def test_the_chord_benchmark_adds_both_flows_and_prints_the_ratio():
    out = run("bench.canvas_chord", "--members", "300", "--rounds", "2")
    assert re.search(r"^chord of 300: by hand [\d.]+ ms, canvas [\d.]+ ms", out, re.M)
    assert re.search(r"^client CPU \(median\): by hand [\d.]+ ms, canvas [\d.]+ ms", out, re.M)


def test_the_chain_benchmark_gets_every_chains_result():
    out = run("bench.canvas_chain", "--samples", "5")
    assert re.search(r"^chain of 3: p50 [\d.]+ ms", out, re.M)
    assert re.search(r"^chain p50 / three round trips p50: [\d.]+ \(target <= 1.5\)$", out, re.M)
