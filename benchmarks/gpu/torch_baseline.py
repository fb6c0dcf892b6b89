"""PyTorch baseline for benchmark (c), on the same GPU and the same ids as bench_gpu.

torch.nn.EmbeddingBag(10M, dim, mode="sum", sparse=True) + torch.optim.Adagrad, batch 16,384 x 64,
one training step = forward, backward(grad_out), optimizer step, zero_grad. Also times the forward
alone (reference for benchmark (a)). CUDA events, warm-up, medians.

Usage: python3 torch_baseline.py IDS_DIR SOK_RESULTS_LOG
Reads IDS_DIR/ids_uniform.bin and ids_powerlaw.bin (int64, written by bench_gpu) and the TRAIN /
STATIC_POOLED lines of bench_gpu's log, and prints the comparison with the targets.
"""
import re
import sys

import numpy as np
import torch

ROWS, BATCH, HOT = 10_000_000, 16384, 64


def median_ms(fn, warm, iters):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def main():
    ids_dir, sok_log = sys.argv[1], sys.argv[2]
    dev = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    ids = {}
    for dist in ("uniform", "powerlaw"):
        a = np.fromfile(f"{ids_dir}/ids_{dist}.bin", dtype=np.int64)
        assert a.size == BATCH * HOT, a.size
        ids[dist] = torch.from_numpy(a).to(dev).view(BATCH, HOT)
    sok = {}
    text = open(sok_log).read()
    for m in re.finditer(r"TRAIN dim=(\d+) dist=(\w+) step_ms=([0-9.]+)", text):
        sok[("train", int(m.group(1)), m.group(2))] = float(m.group(3))
    for m in re.finditer(r"STATIC_POOLED dist=(\w+) dim=(\d+): ([0-9.]+) ms", text):
        sok[("fwd", int(m.group(2)), m.group(1))] = float(m.group(3))
    results = []
    for dim in (32, 64, 128):
        torch.manual_seed(0)
        emb = torch.nn.EmbeddingBag(ROWS, dim, mode="sum", sparse=True, device=dev)
        opt = torch.optim.Adagrad(emb.parameters(), lr=0.01)
        grad = torch.randn(BATCH, dim, device=dev)
        for dist in ("uniform", "powerlaw"):
            x = ids[dist]

            def step(emb=emb, x=x, grad=grad, opt=opt):
                out = emb(x)
                out.backward(grad)
                opt.step()
                opt.zero_grad(set_to_none=True)

            def fwd(emb=emb, x=x):
                with torch.no_grad():
                    emb(x)

            f_ms = median_ms(fwd, 5, 50)
            iters = 20 if dist == "uniform" else 5
            s_ms = median_ms(step, 2, iters)
            print(
                f"TORCH dim={dim} dist={dist} fwd_ms={f_ms:.4f} step_ms={s_ms:.4f} (median of "
                f"{iters} steps)"
            )
            results.append((dim, dist, f_ms, s_ms))
        del emb, opt
        torch.cuda.empty_cache()
    print()
    print("COMPARISON (same GPU, same ids, this run)")
    for dim, dist, f_ms, s_ms in results:
        target = 2.0 if dist == "uniform" else 20.0
        ours = sok.get(("train", dim, dist))
        if ours:
            sp = s_ms / ours
            print(
                f"TRAIN_VS_TORCH dim={dim} dist={dist}: SOK {ours:.4f} ms vs torch {s_ms:.4f} ms "
                f"= {sp:.1f}x "
                f"(target >= {target:.0f}x: {'MET' if sp >= target else 'MISSED'})"
            )
        fo = sok.get(("fwd", dim, dist))
        if fo:
            print(
                f"FWD_VS_TORCH dim={dim} dist={dist}: SOK static pooled {fo:.4f} ms vs torch "
                "EmbeddingBag fwd "
                f"{f_ms:.4f} ms = {f_ms / fo:.2f}x"
            )


if __name__ == "__main__":
    main()
