"""HashEmbedding init "paper" (P ~ N(0, 0.0005)) against "mean" (P ~ N(1/k, 0.0005)) in
front of the transformer: prequential accuracy over one pass of real streams.

    python bench/init_compare.py [--quick] [--data DIR]

Streams: the SMS Spam Collection and the AG News 5000 sample from the datasets folder
(``--data``, default ../shared/data), each replaced by a labelled synthetic text stream
of its size when absent (bench/data.py). Each mini-batch of 32 is predicted, then
learned; one torch thread. ``--quick``: SMS only, 1 layer. Prints a markdown table.
"""
import sys
import time

import torch

from data import add_data_option, data_dir, text_stream
from options import parser_for, run_main
from streamlearn.config import load_config
from streamlearn.learner import Learner


def prequential(records: list[dict], overrides: list[str]) -> tuple[float, float]:
    learner = Learner(load_config(overrides=overrides, use_env=False))
    hits, started = 0, time.perf_counter()
    for i in range(0, len(records), 32):
        batch = records[i:i + 32]
        hits += sum(p == r["label"] for p, r in zip(learner.predict_many(batch), batch))
        learner.learn_many(batch)
    return hits / len(records), len(records) / (time.perf_counter() - started)


def main() -> None:
    parser = parser_for(__doc__)
    parser.add_argument("--quick", action="store_true", help="SMS only, 1 layer")
    add_data_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = data_dir(args.data)
    streams = [text_stream("sms", data)] + ([] if args.quick else [text_stream("ag-news-5000", data)])
    for stream in streams:
        print(f"{stream.name}: {stream.source}")
    print("| stream | layers | init | prequential accuracy | records/s |\n|---|---:|---|---:|---:|")
    for stream in streams:
        name = stream.name + (" (SYNTHETIC)" if stream.synthetic else "")
        for layers in (1,) if args.quick else (1, 2):
            for init in ("paper", "mean"):
                acc, rate = prequential(stream.records, [f"embedding.init={init}", f"model.layers={layers}"])
                print(f"| {name} | {layers} | {init} | {acc:.4f} | {rate:,.0f} |", flush=True)


if __name__ == "__main__":
    sys.exit(run_main(main))
