"""vLLM's offline generation throughput with its own CPU attention backend and with kpa's, each run
in a fresh process (vllm_generate.py), the two backends alternating which goes first over --rounds
rounds: a 2-layer Llama-style model (hidden 2048, 16 query / 4 KV heads of 128, bfloat16, seeded
random weights, blocks of 128 tokens) in two runs,

    prefill-heavy   4 prompts of 2,000 tokens, 1 generated token each, 2,048-token steps;
    decode-heavy    16 prompts of 1,000 tokens, 64 generated tokens each, 2,048-token steps.

    VLLM_CPU_KVCACHE_SPACE=1 python python/benchmarks/vllm_throughput.py [--rounds 3] [--json FILE]

Prints each round's seconds of the generate call per backend, then per run the ratio of the
median throughputs (kpa / vLLM CPU_ATTN, above 1: kpa is faster). Run it through
scripts/vllm.sh --throughput.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = ["--layers", "2", "--hidden", "2048", "--heads", "16", "--kv-heads", "4", "--head-dim", "128",
         "--vocab", "8192", "--dtype", "bfloat16", "--block-size", "128", "--max-num-batched-tokens", "2048",
         "--shared-prefix", "0"]
RUNS = {
    "prefill-heavy": ["--prompt-lens", "2000", "--repeat-prompts", "4", "--max-tokens", "1"],
    "decode-heavy": ["--prompt-lens", "1000", "--repeat-prompts", "16", "--max-tokens", "64"],
}
BACKENDS = (("auto", "vLLM CPU_ATTN"), ("CUSTOM", "kpa"))


def generate(backend, run, tmp):
    out = os.path.join(tmp, f"{backend}-{run}.json")
    subprocess.run([sys.executable, os.path.join(HERE, "vllm_generate.py"), "--backend", backend, "--out", out,
                    *MODEL, *RUNS[run]], check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        r = json.load(f)
    del r["tokens"], r["logprobs"]
    return r


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated: " + ", ".join(RUNS))
    parser.add_argument("--json")
    args = parser.parse_args()
    results = []
    print("Model: " + " ".join(MODEL[:-2]) + "; " + "; ".join(f"{run}: {' '.join(RUNS[run])}" for run in RUNS) + "\n")
    print("| run | round | vLLM CPU_ATTN s | kpa s | kpa / vLLM throughput |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for run in args.runs.split(","):
            seconds = {name: [] for _, name in BACKENDS}
            for round_ in range(args.rounds):
                order = BACKENDS if round_ % 2 == 0 else BACKENDS[::-1]
                for backend, name in order:
                    r = generate(backend, run, tmp)
                    r.update(run=run, round=round_, name=name)
                    results.append(r)
                    seconds[name].append(r["generate_s"])
                vllm_s, kpa_s = seconds["vLLM CPU_ATTN"][-1], seconds["kpa"][-1]
                print(f"| {run} | {round_ + 1} | {vllm_s:.2f} | {kpa_s:.2f} | {vllm_s / kpa_s:.2f}x |", flush=True)
            vllm_s, kpa_s = statistics.median(seconds["vLLM CPU_ATTN"]), statistics.median(seconds["kpa"])
            print(f"| {run} | median | {vllm_s:.2f} | {kpa_s:.2f} | {vllm_s / kpa_s:.2f}x |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
