"""run.py --storage dram_ssd on a tiny shape (CPU): sok_tier (sok's tables in DRAM_SSDHASH storage,
DRAM a tenth of each table) trains like sok, and the timing table gives both step times and their
ratio, with the tier's files and file traffic. Each run is a subprocess (graph mode switches eager
execution off for the whole process)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(ROOT, "benchmarks", "embedding", "run.py")
TINY = ["--fields", "2", "--vocab", "1000", "--batch", "64", "--ids-per-field", "6",
        "--min-ids-per-field", "1", "--device", "cpu", "--storage", "dram_ssd"]


def run(tmp_path, *args):
    r = subprocess.run([sys.executable, RUN, *TINY, "--storage-path", str(tmp_path), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


def tier_files(line):
    files, size = re.search(r"files: (\d+), (\d+) bytes", line).groups()
    return int(files), int(size)


@pytest.mark.parametrize("strategy", ["lfu", "lru"])
def test_tiered_tables_train_like_dram_ones(tmp_path, strategy):
    out = run(tmp_path, "--check", "6", "--mode", "both", "--impls", "sok",
              "--cache-strategy", strategy)
    checks = [ln for ln in out.splitlines() if ln.startswith("CHECK")]
    assert len(checks) == 2 * 2 * 2, out  # dists x modes x (sok, sok_tier)
    tiered = [ln for ln in checks if "impl=sok_tier " in ln]
    assert len(tiered) == 4 and all(ln.endswith("vs sok: OK") for ln in tiered), out
    assert "check passed" in out
    # Most rows were on file: 2 tables, DRAM for a tenth of each.
    tiers = [ln for ln in out.splitlines() if ln.startswith("TIER")]
    assert len(tiers) == 4, out
    for line in tiers:
        rows, on_file = map(int, re.search(r"(\d+) rows in all tables.*>= (\d+) rows on file",
                                           line).groups())
        assert on_file >= 0.85 * rows, line
        files, size = tier_files(line)
        assert files == 2 and size >= 160 * on_file, line
    assert os.listdir(tmp_path) == []  # removed afterwards


def test_timing_table_has_both_step_times_and_their_ratio(tmp_path):
    out = run(tmp_path, "--rounds", "2", "--steps", "1", "--warmup", "4", "--dists", "powerlaw")
    assert "sok ms" in out and "sok_tier ms" in out and "sok_tier/sok" in out, out
    wall = next(ln for ln in out.splitlines() if ln.startswith("graph     powerlaw  wall"))
    sok, tier, ratio = wall.split()[4:7]
    assert abs(float(tier) / float(sok) - float(ratio.rstrip("x"))) < 0.02 * float(ratio[:-1]), wall
    detail = next(ln for ln in out.splitlines() if "sok_tier tables:" in ln)
    written = re.search(r"\(demotions, compactions\): ([\d.]+) MB", detail).group(1)
    assert float(written) > 0 and tier_files(detail)[1] > 0, detail
