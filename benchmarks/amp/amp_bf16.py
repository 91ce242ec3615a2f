"""Benchmark (c): bfloat16 O1 AMP against float32 on CPU, for a conv net and the MLP (one process).

    .venv/bin/python -m benchmarks.amp.amp_bf16 [--rounds 9] [--json out.json]

Paddle runs bfloat16 on oneDNN kernels, which need AVX512-BF16 (AMX for the speed): on a CPU
without them the driver prints why it measures nothing and exits 0. Elsewhere it times 20
training steps per sample of each model in float32 and in bfloat16 O1, interleaved in one run,
and reports S = t(float32) / t(bfloat16 O1) per model: above 1, bfloat16 is faster.
"""
import statistics

from fleetlite.paddle_compat import quiet_warnings as paddle_noise
from benchmarks.amp.amp_worker import PRECISIONS
from benchmarks.harness.runner import measure, print_table, protocol_parser, publish, publish_skipped

with paddle_noise.importing_paddle():
    import paddle

MODELS = {"convnet": 32, "mlp": 256}       # model: batch
NO_BF16 = ("this CPU has no AVX512-BF16 (paddle.base.core.supports_bfloat16() is False): Paddle's bfloat16 "
           "kernels are oneDNN-only and do not run here, so there is nothing to measure")


def main():
    args = protocol_parser(__doc__.splitlines()[0]).parse_args()
    if not paddle.base.core.supports_bfloat16():
        return publish_skipped(NO_BF16, args.json)
    medians, foreign = measure([(f"{model}:{precision}", ["benchmarks.amp.amp_worker", model, precision, str(batch)], 1)
                                for model, batch in MODELS.items() for precision in PRECISIONS], args)
    rows = []
    for model, batch in MODELS.items():
        fp32, bf16 = medians[f"{model}:fp32"], medians[f"{model}:bf16_o1"]
        paired = [a / b for a, b in zip(fp32, bf16)]
        rows.append({"model": model, "batch": batch, "fp32": statistics.median(fp32), "bf16": statistics.median(bf16),
                     "S": statistics.median(paired), "S_min": min(paired), "S_max": max(paired)})
    print_table(f"bfloat16 O1 vs float32, 1 process, {args.rounds} rounds; foreign CPU load {foreign:.0%}", rows,
                [("model", "model", "{}"), ("batch", "batch", "{}"), ("fp32", "float32 (ms/20 steps)", "{:.1f}"),
                 ("bf16", "bfloat16 O1", "{:.1f}"), ("S", "S = fp32/bf16", "{:.2f}"),
                 ("S_min", "S min", "{:.2f}"), ("S_max", "S max", "{:.2f}")])
    publish(rows, {f"S_{row['model']}": row["S"] for row in rows}, foreign, medians, args.json)


if __name__ == "__main__":
    main()
