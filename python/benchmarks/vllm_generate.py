"""Greedy generation with vLLM on a small Llama-style model with seeded random weights, for the
end-to-end backend tests (python/tests/test_vllm_backend.py) and the throughput comparison
(vllm_throughput.py). One engine per process: run it as a script.

    python vllm_generate.py --backend CUSTOM --out result.json [--tp 2] [--kv-cache-dtype fp8] ...

The weights are written once per configuration (safetensors) under --model-root. vLLM's dummy
loader is no use here: its weights lie in [-1e-3, 1e-3], which makes every next-token
distribution uniform and greedy tokens a matter of rounding. Prints nothing but vLLM's logs;
--out gets the token ids and log-probabilities of every prompt, the engine's wall times and the
attention backend class vLLM chose.
"""

import argparse
import json
import os
import time


def model_config(layers, hidden, heads, kv_heads, head_dim, vocab, sliding_window):
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": vocab,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}
    if sliding_window:
        config["sliding_window"] = sliding_window
        config["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    return config


def write_model(path, config, seed=0):
    """config.json and model.safetensors with N(0, sigma) weights scaled so that activations stay
    O(1) and the next-token distributions are far from uniform."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    hidden, inter, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
    kv, d, vocab = config["num_key_value_heads"], config["head_dim"], config["vocab_size"]

    def normal(*shape, fan_in):
        return (torch.randn(*shape, generator=g) / fan_in ** 0.5).contiguous()

    weights = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=g),
               "model.norm.weight": torch.ones(hidden), "lm_head.weight": 4 * normal(vocab, hidden, fan_in=hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update({
            p + "self_attn.q_proj.weight": 2 * normal(heads * d, hidden, fan_in=hidden),
            p + "self_attn.k_proj.weight": 2 * normal(kv * d, hidden, fan_in=hidden),
            p + "self_attn.v_proj.weight": normal(kv * d, hidden, fan_in=hidden),
            p + "self_attn.o_proj.weight": normal(hidden, heads * d, fan_in=heads * d),
            p + "mlp.gate_proj.weight": normal(inter, hidden, fan_in=hidden),
            p + "mlp.up_proj.weight": normal(inter, hidden, fan_in=hidden),
            p + "mlp.down_proj.weight": normal(hidden, inter, fan_in=inter),
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
        })
    os.makedirs(path, exist_ok=True)
    save_file(weights, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)


def prompts(vocab, lengths, shared_prefix, seed=1):
    """Token-id prompts of the given lengths; the first two share their first shared_prefix tokens."""
    import random

    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab) for _ in range(shared_prefix)]
    out = []
    for i, n in enumerate(lengths):
        tokens = [rng.randrange(3, vocab) for _ in range(n)]
        if i < 2 and shared_prefix:
            tokens[:shared_prefix] = prefix[:n]
        out.append(tokens)
    return out


def attention_backends(worker):
    """The attention backend classes a vLLM worker's layers run on."""
    return sorted({f"{g.backend.__module__}.{g.backend.__qualname__}" for groups in worker.model_runner.attn_groups
                   for g in groups})


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="auto", help="vLLM's attention backend: auto (vLLM's own) or CUSTOM (kpa)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--model-root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".models"),
                        help="where the generated models are kept (one folder per configuration)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--sliding-window", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-cache-dtype", default="auto")
    parser.add_argument("--block-size", type=int, default=32)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--prompt-lens", default="5,70,300,33", help="comma-separated prompt lengths")
    parser.add_argument("--repeat-prompts", type=int, default=1, help="the prompt lengths this many times over")
    parser.add_argument("--shared-prefix", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-num-batched-tokens", type=int, default=64,
                        help="tokens per engine step: below the longest prompt, prefills are chunked and "
                             "batched with other sequences' decode steps")
    args = parser.parse_args()

    config = model_config(args.layers, args.hidden, args.heads, args.kv_heads, args.head_dim, args.vocab,
                          args.sliding_window)
    name = "llama-" + "-".join(str(config[k]) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                                        "num_key_value_heads", "head_dim", "vocab_size"))
    path = os.path.join(args.model_root, name + (f"-sw{args.sliding_window}" if args.sliding_window else ""))
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        write_model(path, config)

    # attention_backends travels to the workers as a pickled function.
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    start = time.perf_counter()
    llm = LLM(model=path, skip_tokenizer_init=True, dtype=args.dtype, kv_cache_dtype=args.kv_cache_dtype,
              block_size=args.block_size, tensor_parallel_size=args.tp, distributed_executor_backend="mp",
              max_model_len=2048, max_num_batched_tokens=args.max_num_batched_tokens, enable_chunked_prefill=True,
              enable_prefix_caching=True, enforce_eager=True, seed=0,
              attention_backend=None if args.backend == "auto" else args.backend)
    started = time.perf_counter()
    lengths = [int(n) for n in args.prompt_lens.split(",")] * args.repeat_prompts
    token_prompts = prompts(args.vocab, lengths, args.shared_prefix)
    sampling = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True, logprobs=0,
                              detokenize=False)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in token_prompts], sampling)
    generated = time.perf_counter()
    result = {"backend": args.backend, "init_s": started - start, "generate_s": generated - started,
              "prompt_tokens": sum(len(p) for p in token_prompts),
              "tokens": [list(o.outputs[0].token_ids) for o in outputs],
              "logprobs": [[lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                           for o in outputs]}
    result["generated_tokens"] = sum(len(t) for t in result["tokens"])
    result["attention_backends"] = llm.collective_rpc(attention_backends)
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
