"""Lab (one H100 call): where an OSCAR prefill with 2048-token chunks spends host time (Qwen3-4B shape,
32K prompt): CPU ops by self time and every synchronizing call, under torch.profiler."""

import sys

from torch.profiler import ProfilerActivity, profile

from oscarkv.bench import e2e
from oscarkv.bench.prefill import ttft


def main(method: str, chunk: int, n: int) -> None:
    model = e2e.random_model("qwen3-4b")
    engine = e2e.build_engine(model, method, 16 << 30, 1, chunk)
    ttft(engine, 2 * chunk + 64, seed=1)
    print(method, chunk, n, "ttft", ttft(engine, n, seed=2))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        print("profiled ttft", ttft(engine, n, seed=3))
    ka = prof.key_averages()
    print(ka.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=60))
    for e in ka:
        if any(s in e.key for s in ("Synchronize", "item", "_local_scalar", "cudaMemcpy ", "cudaMalloc", "cudaFree",
                                    "cudaHostAlloc", "EventSynchronize")):
            print("SYNC?", e.key, e.count, round(e.cpu_time_total / 1e3, 1), "ms")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
