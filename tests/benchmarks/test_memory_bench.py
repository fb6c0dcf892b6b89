"""benchmarks/embedding/memory.py on a small table: one MEMORY line per dim, its values and slots
the table's floats per key, its overhead the rest of the measured total. (The total itself is
a measurement, not checked.)"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMORY = os.path.join(ROOT, "benchmarks", "embedding", "memory.py")


def test_memory_bench_reports_values_slots_and_overhead_per_dim():
    out = subprocess.run([sys.executable, MEMORY, "--keys", "50000", "--dims", "8,32",
                          "--chunk", "10000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:]
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("MEMORY")]
    assert len(lines) == 2, out.stdout
    for line, dim in zip(lines, (8, 32)):
        fields = dict(re.findall(r"(\w+)=([-\d.]+)", line))
        assert "device=cpu" in line
        assert int(fields["dim"]) == dim and int(fields["keys"]) == 50000
        assert int(fields["values"]) == 4 * dim and int(fields["slots"]) == 4 * dim
        total = float(fields["bytes_per_key"])
        overhead = total - int(fields["values"]) - int(fields["slots"])
        assert abs(overhead - float(fields["overhead"])) < 0.11, line


def test_gpu_device_without_a_gpu_is_refused_clearly():
    out = subprocess.run([sys.executable, MEMORY, "--keys", "1000", "--dims", "8", "--device",
                          "gpu"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode != 0 and "TensorFlow sees no GPU" in out.stdout, out.stdout[-3000:]
