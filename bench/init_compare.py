"""HashEmbedding init "paper" (P ~ N(0, 0.0005)) against "mean" (P ~ N(1/k, 0.0005)) in
front of the transformer: prequential accuracy over one pass of real streams.

    python bench/init_compare.py

Needs ../shared/data (SMS Spam Collection, AG News samples); prints a table. Each
mini-batch of 32 is predicted, then learned; one torch thread.
"""
import time
from pathlib import Path

import torch

from streamlearn.config import load_config
from streamlearn.datasets import DatasetReader
from streamlearn.learner import Learner

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
STREAMS = {
    "SMS Spam": DATA / "sms-spam-collection" / "SMSSpamCollection",
    "AG News 5000": DATA / "ag-news-train-samples" / "train_random5000_text_label.csv",
}


def prequential(records: list[dict], overrides: list[str]) -> tuple[float, float]:
    learner = Learner(load_config(overrides=overrides, use_env=False))
    hits, started = 0, time.perf_counter()
    for i in range(0, len(records), 32):
        batch = records[i:i + 32]
        hits += sum(p == r["label"] for p, r in zip(learner.predict_many(batch), batch))
        learner.learn_many(batch)
    return hits / len(records), len(records) / (time.perf_counter() - started)


def main() -> None:
    torch.set_num_threads(1)
    print("| stream | layers | init | prequential accuracy | records/s |\n|---|---:|---|---:|---:|")
    for name, path in STREAMS.items():
        if not path.exists():
            print(f"| {name} | - | - | not found: {path} | - |")
            continue
        records = [row.record for row in DatasetReader(path)]
        for layers in (1, 2):
            for init in ("paper", "mean"):
                acc, rate = prequential(records, [f"embedding.init={init}", f"model.layers={layers}"])
                print(f"| {name} | {layers} | {init} | {acc:.4f} | {rate:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
