"""benchmarks/common/timeline.py on hand-made records (ns): gaps, busy time, kernel sums."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "common"))
import timeline  # noqa: E402


def test_short_kernel_names():
    assert timeline._short("void tensorflow::GatherOpKernel<tensorflow::AlignedVector<float, 1>, "
                           "long, true>(float const*, long)") == "GatherOpKernel"
    assert timeline._short("void sok::gpu::(anonymous namespace)::k_multi_insert<long>("
                           "sok::gpu::(anonymous namespace)::Group)") == "k_multi_insert"
    assert timeline._short("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)") == \
        "ncclDevKernel_SendRecv"


def test_step_gaps_and_kernel_time():
    step = (0, 1_000_000)  # 1 ms
    gpu = [("void a<int>(int)", 0, 200_000), ("void b(int)", 150_000, 300_000),
           ("void a<long>(long)", 700_000, 900_000)]
    host = [("x/SokAllToAll:SokAllToAll", 300_000, 690_000)]
    s = timeline.step_summary(step, host, gpu, gap_us=30)
    assert abs(s["gpu_busy"] - 0.5) < 1e-9
    assert [(round(at), round(n)) for at, n, _ in s["gaps"]] == [(300_000, 400_000),
                                                                (900_000, 100_000)]
    assert s["gaps"][0][2] == ["x/SokAllToAll:SokAllToAll"]
    by = timeline.gpu_by_kernel(step, gpu)
    assert by["a"] == [0.4, 2] and by["b"] == [0.15, 1]
