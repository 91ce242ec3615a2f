"""Benchmark (c): the data side's overhead, every contender interleaved in one run.

    .venv/bin/python -m benchmarks.data.data_loading [--samples 1000000] [--rounds 9] [--json out.json]

Samplers: one epoch of rank 0 of 8 over `--samples` indices, batch 64, shuffled, against
`paddle.io.DistributedBatchSampler` (target: fleetlite's ratio <= 1.0); the class-balanced and
P×K (16x4) samplers over 1000 classes are shown beside it. Record shards: read throughput of
one worker's sample shard against the same files read whole through the same index (target:
<= 1.1) and against tarfile streaming them; the files (4 WebDataset tars, `--records` samples
of 2 KiB + a label) are written first, so reads come from the page cache.
"""
import statistics
import tempfile

import numpy as np

from fleetlite.data.write_records import write_shards
from benchmarks.harness.runner import measure, print_table, protocol_parser, publish, summary

SAMPLERS = ["sampler:paddle", "sampler:fleetlite", "sampler:fleetlite_class_balanced", "sampler:fleetlite_pk"]
RECORDS = ["records:whole", "records:sample_shard_2", "records:sample_shard_8", "records:tarfile_stream"]


def synthetic_records(folder, count):
    rng = np.random.default_rng(0)
    samples = ((f"{i:07d}", {"bin": rng.bytes(2048), "cls": str(i % 10).encode()}) for i in range(count))
    return write_shards(samples, folder, 4)


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000, help="sampler dataset size")
    parser.add_argument("--records", type=int, default=40_000, help="samples in the record files")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleetlite-bench-records-") as folder:
        synthetic_records(folder, args.records)
        contenders = [(name, ["benchmarks.data.data_worker", name, str(args.samples)], 1) for name in SAMPLERS]
        contenders += [(name, ["benchmarks.data.data_worker", name, folder], 1) for name in RECORDS]
        medians, foreign = measure(contenders, args)
    rows = [{"contender": name, **summary(medians[name])} for name in SAMPLERS + RECORDS]
    print_table(f"Data side: sampler epoch (ms, {args.samples} samples, rank 0 of 8, batch 64) and record reads "
                f"(ms per 1000 samples, {args.records} x 2 KiB in 4 files); {args.rounds} rounds; "
                f"foreign CPU load {foreign:.0%}", rows,
                [("contender", "contender", "{}"), ("median_ms", "median", "{:.2f}"), ("min_ms", "min", "{:.2f}"),
                 ("max_ms", "max", "{:.2f}")])

    def ratio(name, base):
        return statistics.median(a / b for a, b in zip(medians[name], medians[base]))
    ratios = {"sampler_fleetlite_vs_paddle": ratio("sampler:fleetlite", "sampler:paddle"),
              "sampler_class_balanced_vs_paddle": ratio("sampler:fleetlite_class_balanced", "sampler:paddle"),
              "sampler_pk_vs_paddle": ratio("sampler:fleetlite_pk", "sampler:paddle"),
              "records_shard_of_2_vs_whole": ratio("records:sample_shard_2", "records:whole"),
              "records_shard_of_8_vs_whole": ratio("records:sample_shard_8", "records:whole"),
              "records_whole_vs_tarfile_stream": ratio("records:whole", "records:tarfile_stream")}
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
