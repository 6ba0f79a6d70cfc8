"""vLLM's offline generation throughput with its own CPU attention backend and with kpa's, one after
the other in one run (vllm_generate.py in a fresh process for each): a 4-layer Llama-style model
(hidden 1024, 16 query / 4 KV heads of 64, bfloat16, seeded random weights), 32 prompts of 128 to
1024 tokens, 64 greedy tokens each, blocks of 32 tokens, chunked prefill in 512-token steps.

    VLLM_CPU_KVCACHE_SPACE=1 python python/benchmarks/vllm_throughput.py [--json FILE]

Prints, per backend, generated tokens per second of the generate call, and all tokens (prompt and
generated) per second. Run it through scripts/vllm.sh --throughput.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = ["--layers", "4", "--hidden", "1024", "--heads", "16", "--kv-heads", "4", "--head-dim", "64",
         "--vocab", "8192", "--dtype", "bfloat16", "--block-size", "32", "--max-num-batched-tokens", "512",
         "--prompt-lens", "128,256,512,1024", "--repeat-prompts", "8", "--shared-prefix", "0", "--max-tokens", "64"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend, name in (("auto", "vLLM CPU_ATTN"), ("CUSTOM", "kpa")):
            out = os.path.join(tmp, backend + ".json")
            subprocess.run([sys.executable, os.path.join(HERE, "vllm_generate.py"), "--backend", backend, "--out", out,
                            *MODEL], check=True, stdout=subprocess.DEVNULL)
            with open(out) as f:
                r = json.load(f)
            r["name"] = name
            r["generated_tokens_per_s"] = r["generated_tokens"] / r["generate_s"]
            r["all_tokens_per_s"] = (r["generated_tokens"] + r["prompt_tokens"]) / r["generate_s"]
            del r["tokens"], r["logprobs"]
            results.append(r)
            print(f"{name:14s} {r['generated_tokens_per_s']:8.1f} generated tokens/s  {r['all_tokens_per_s']:8.1f} "
                  f"tokens/s in all  ({r['prompt_tokens']} prompt + {r['generated_tokens']} generated tokens in "
                  f"{r['generate_s']:.1f} s; {r['attention_backends'][0][0]})", flush=True)
    print(f"kpa / vLLM CPU_ATTN: {results[1]['all_tokens_per_s'] / results[0]['all_tokens_per_s']:.2f}x tokens/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
