"""benchmarks/embedding/checkpoint_memory.py on a small table: a CHECKPOINT line for the dump and
one for the load (whose child fails unless the loaded table holds every key), the added memory
the peak less the memory before, the table's size its rows and slots. (The memory figures
themselves are measurements, not checked.)"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks", "embedding", "checkpoint_memory.py")


def test_dump_and_load_report_their_added_memory(tmp_path):
    keys, dim = 30000, 8
    out = subprocess.run([sys.executable, BENCH, "--keys", str(keys), "--dim", str(dim),
                          "--chunk", "10000", "--dir", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("CHECKPOINT")]
    assert [re.search(r"phase=(\w+)", ln).group(1) for ln in lines] == ["dump", "load"], out.stdout
    for line in lines:
        f = dict(re.findall(r"(\w+)=([-\d.]+)", line))
        assert int(f["keys"]) == keys and int(f["dim"]) == dim
        assert abs(float(f["table_gb"]) - keys * 4 * dim * 2 / 2**30) < 0.006, line
        assert abs(float(f["peak_gb"]) - float(f["before_gb"]) - float(f["added_gb"])) < 0.011
    assert os.listdir(tmp_path) == [], "the dump's temporary directory was left behind"


def test_a_gpu_tier_on_the_cpu_is_refused():
    out = subprocess.run([sys.executable, BENCH, "--keys", "100", "--storage", "hbm_dram"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert out.returncode != 0 and "hbm_dram is a GPU tier" in out.stdout, out.stdout[-2000:]
