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


def test_sequence_lists_host_and_gpu_events_in_time_order_within_the_window():
    step = (1_000_000, 3_000_000)
    host = [("x/SokExchangePlan:SokExchangePlan", 1_100_000, 1_300_000),
            ("void k_plan(int)", 1_150_000, 1_160_000), ("late", 2_900_000, 2_950_000)]
    gpu = [("void sok::k_plan(int)", 1_200_000, 1_250_000)]
    lines = timeline.sequence(host, step, gpu, 0.05, 0.25)
    assert [ln.split()[2:] for ln in lines] == [["host", "x/SokExchangePlan:SokExchangePlan"],
                                                ["host", "k_plan"], ["gpu", "k_plan"]]
    assert lines[0].split()[:2] == ["0.100", "0.200"]
