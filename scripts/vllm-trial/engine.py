"""One vLLM engine for scripts/vllm-trial.sh: loads the model in DIR (a
config.json of scripts/vllm-trial/), sends each long token-id prompt RUNS
times, one request at a time, and appends one JSON line per request to OUT:
time to first token, num_cached_tokens, the output token ids and their
top-k logprobs.

    python3 engine.py --phase NAME --runs N --model DIR --out FILE
        [--kv-config FILE] [--weights random|dummy] [--context-check]
        [--prompt-tokens N[,N...]] [--max-tokens N] [--logprobs K]
        [--max-model-len N] [--gpu-memory-utilization X]
    python3 engine.py --make-weights DIR [--weights-seed S]

Without --kv-config the engine runs with no KV connector (LMCache off). Each
prompt is drawn from a fixed seed of its own (the first prompt's seed, then
one more for each next prompt), so every engine sends the same tokens and
no prompt is a prefix of another. A run sends every prompt in turn.
--weights random loads DIR/model.safetensors, which --make-weights writes:
seeded normal weights (std 0.02, norms 1), the same bytes on every run of
one --weights-seed (default 1000; another seed gives other weights of the
same shapes and file size: "other weights under the same path").
vLLM's own dummy weights (--weights dummy: uniform in +-1e-3, the norms
too) leave the context's share of the residual stream below bf16's
resolution, so a wrong KV cache would not move the logprobs; the random
weights make the output depend on the context. --context-check sends, after
the runs, the prompt with its first 1024 tokens changed (run "context"):
how far the logprobs move when the context differs. Before the runs, one
warm-up request (--warmup-tokens of another seed, fewer than one LMCache
chunk, so nothing of it is stored) takes the engine's first-request costs,
so that the runs' times to first token compare.
"""

import argparse
import json
import random
import sys
import time


def arguments():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--make-weights", metavar="DIR")
    p.add_argument("--weights-seed", type=int, default=1000)
    p.add_argument("--phase")
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--model")
    p.add_argument("--out")
    p.add_argument("--kv-config")
    p.add_argument("--weights", choices=("random", "dummy"), default="random")
    p.add_argument("--context-check", action="store_true")
    p.add_argument("--prompt-tokens", type=lambda text: [int(n) for n in text.split(",")], default=[8200])
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--logprobs", type=int, default=5)
    p.add_argument("--warmup-tokens", type=int, default=1000)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    args = p.parse_args()
    if not args.make_weights and not (args.phase and args.model and args.out):
        p.error("--phase, --model and --out are needed (or --make-weights DIR)")
    return args


def prompt_tokens(n, vocab, seed=20261201):
    rng = random.Random(seed)
    return [rng.randrange(100, vocab - 100) for _ in range(n)]


def make_weights(model_dir, seed):
    """Writes DIR/model.safetensors for the Qwen2 config in DIR/config.json,
    drawn on the GPU where there is one (a 7B shape draws 7.6G numbers)."""
    import torch
    from safetensors.torch import save_file

    with open(f"{model_dir}/config.json") as f:
        c = json.load(f)
    hidden, inter, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    head_dim = c.get("head_dim", hidden // c["num_attention_heads"])
    q_out = c["num_attention_heads"] * head_dim
    kv_out = c["num_key_value_heads"] * head_dim
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for i in range(c["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        shapes.update({
            f"{layer}.input_layernorm.weight": (hidden,),
            f"{layer}.post_attention_layernorm.weight": (hidden,),
            f"{layer}.self_attn.q_proj.weight": (q_out, hidden),
            f"{layer}.self_attn.q_proj.bias": (q_out,),
            f"{layer}.self_attn.k_proj.weight": (kv_out, hidden),
            f"{layer}.self_attn.k_proj.bias": (kv_out,),
            f"{layer}.self_attn.v_proj.weight": (kv_out, hidden),
            f"{layer}.self_attn.v_proj.bias": (kv_out,),
            f"{layer}.self_attn.o_proj.weight": (hidden, q_out),
            f"{layer}.mlp.gate_proj.weight": (inter, hidden),
            f"{layer}.mlp.up_proj.weight": (inter, hidden),
            f"{layer}.mlp.down_proj.weight": (hidden, inter),
        })
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tensors = {}
    for n, (name, shape) in enumerate(sorted(shapes.items())):
        if name.endswith("norm.weight"):
            t = torch.ones(shape)
        else:
            g = torch.Generator(device=device).manual_seed(seed + n)
            t = torch.randn(shape, generator=g, device=device) * 0.02
        tensors[name] = t.to(torch.bfloat16).cpu().contiguous()
    save_file(tensors, f"{model_dir}/model.safetensors", metadata={"format": "pt"})
    count = sum(t.numel() for t in tensors.values())
    print(f"WEIGHTS {len(tensors)} tensors, {count / 1e6:.1f}M parameters drawn on {device} (seed {seed}) in {model_dir}/model.safetensors")


def record_of(args, kv, ready_s, run, prompt, result, wall_s):
    completion = result.outputs[0]
    metrics = result.metrics
    ttft = getattr(metrics, "first_token_latency", None) if metrics else None
    return {
        "phase": args.phase,
        "run": run,
        "lmcache": kv is not None,
        "weights": args.weights,
        "engine_ready_s": round(ready_s, 2),
        "ttft_s": round(ttft, 4) if ttft else None,
        "generate_s": round(wall_s, 4),
        "prompt_tokens": len(prompt),
        "num_cached_tokens": result.num_cached_tokens,
        "output_token_ids": list(completion.token_ids),
        "logprobs": [
            {str(token): entry.logprob for token, entry in position.items()}
            for position in (completion.logprobs or [])
        ],
    }


def main():
    args = arguments()
    if args.make_weights:
        make_weights(args.make_weights, args.weights_seed)
        return 0
    kv = None
    if args.kv_config:
        with open(args.kv_config) as f:
            kv = json.load(f)
    with open(f"{args.model}/config.json") as f:
        vocab = json.load(f)["vocab_size"]

    from vllm import LLM, SamplingParams

    started = time.monotonic()
    options = dict(
        model=args.model,
        load_format="dummy" if args.weights == "dummy" else "safetensors",
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="bfloat16",
        seed=0,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=False,
        # Keeps the per-request timings (RequestOutput.metrics).
        disable_log_stats=False,
    )
    if kv is not None:
        options["kv_transfer_config"] = kv
    llm = LLM(**options)
    ready_s = time.monotonic() - started
    print(f"ENGINE {args.phase} ready in {ready_s:.1f}s", flush=True)

    prompts = [prompt_tokens(n, vocab, seed=20261201 + i) for i, n in enumerate(args.prompt_tokens)]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=0.0,
        logprobs=args.logprobs,
        detokenize=False,
        ignore_eos=True,
    )
    # The first prompt with its first 1024 tokens drawn from another seed.
    changed = prompt_tokens(1024, vocab, seed=7) + prompts[0][1024:]
    requests = [(run, prompt) for run in range(args.runs) for prompt in prompts]
    if args.warmup_tokens > 0:
        requests.insert(0, ("warmup", prompt_tokens(args.warmup_tokens, vocab, seed=11)))
    if args.context_check:
        requests.append(("context", changed))
    with open(args.out, "a") as out:
        for run, tokens in requests:
            sent = time.monotonic()
            result = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)[0]
            wall_s = time.monotonic() - sent
            record = record_of(args, kv, ready_s, run, tokens, result, wall_s)
            out.write(json.dumps(record) + "\n")
            out.flush()
            print(
                f"RUN {args.phase}/{run}: ttft {record['ttft_s']} s, generate {record['generate_s']} s, "
                f"num_cached_tokens {record['num_cached_tokens']}, tokens {record['output_token_ids']}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
