"""Generation throughput: StaticDecoder (static KV cache + CUDA graph) vs HF `generate()`, one run.

Workload of issue 8: the 387M Qwen2 shape, batch 256, prompts of 128 random tokens, 256 sampled new
tokens (temperature 1, no top-k/top-p; EOS ignored so every row decodes all 256, as in the HF
baseline). tokens/s = batch x new tokens / wall time of the whole call (prefill included).

    PYTHONPATH=trainer python3 bench/gpu/decode.py --out decode.json       # H200
    PYTHONPATH=trainer python3 bench/gpu/decode.py --tiny                  # CPU smoke run
"""

from __future__ import annotations

import argparse
import time
import traceback
from typing import Any

import _common as c
import torch

from asyncgrpo_trainer.backends.cuda_train import matmul_params
from asyncgrpo_trainer.backends.static_decode import DecodeParams, StaticDecoder
from asyncgrpo_trainer.models.config import ModelConfig
from asyncgrpo_trainer.models.network import CausalLM


def decode_bound(
    cfg: ModelConfig, n_matmul: int, batch: int, *, ctx: float, bw: float, flops: float
) -> float:
    """perf-anchors.md section 4.2: B / [max(2N/BW, 2N*B/F) + B*L*k/BW] tokens/s."""
    head_dim = cfg.head_dim
    k = 2 * cfg.num_layers * cfg.num_kv_heads * head_dim * 2  # K and V bytes per token, bf16
    t_step = max(2 * n_matmul / bw, 2 * n_matmul * batch / flops) + batch * ctx * k / bw
    return batch / t_step


def reference_check(model: CausalLM, prompts: torch.Tensor, steps: int) -> dict[str, Any]:
    """Greedy: StaticDecoder vs the model's own forward with its concat KV cache (generation.py's path)."""
    greedy = StaticDecoder(
        model,
        max_batch=prompts.shape[0],
        max_prompt_len=prompts.shape[1],
        max_new_tokens=steps,
        params=DecodeParams(temperature=0.0),
        eos_ids=(),
    )
    ours = greedy.generate(prompts)
    with torch.no_grad():
        logits, cache = model(prompts, None)
        last = logits[:, -1]
        toks, lps = [], []
        for _ in range(steps):
            logp = torch.log_softmax(last.float(), -1)
            tok = logp.argmax(-1)
            toks.append(tok)
            lps.append(logp.gather(-1, tok[:, None])[:, 0])
            logits, cache = model(tok[:, None], cache)
            last = logits[:, -1]
    ref_t, ref_lp = torch.stack(toks, 1), torch.stack(lps, 1)
    same = ours.tokens == ref_t
    # Compare log-probs only up to each row's first disagreement (after it the prefixes differ).
    agree = same.long().cumprod(1).bool()
    diff = (ours.logprobs - ref_lp).abs()[agree]
    del greedy
    return {
        "steps": steps,
        "rows_identical": int(same.all(1).sum()),
        "rows": int(same.shape[0]),
        "token_agreement": float(same.float().mean()),
        "first_token_agreement": float(same[:, 0].float().mean()),
        "max_abs_logprob_diff_on_agreeing_prefix": float(diff.max()) if diff.numel() else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--prompt", type=int)
    ap.add_argument("--new", type=int)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--extra-batches", type=int, nargs="*", default=[], help="also time these batch sizes")
    args = ap.parse_args()
    dev = c.device()
    cfg = c.config(args.tiny)
    batch = args.batch or (4 if args.tiny else 256)
    plen = args.prompt or (8 if args.tiny else 128)
    new = args.new or (8 if args.tiny else 256)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    res = c.Results(
        args.out, workload={"batch": batch, "prompt": plen, "new_tokens": new, "dtype": str(dtype)}
    )
    ceil = c.device_ceilings(dev)
    res.put("ceilings", ceil)
    model = c.build_model(cfg, dev, dtype).eval()
    n_all = sum(p.numel() for p in model.parameters())
    n_mm = matmul_params(model)
    res.put("model", {"params": n_all, "matmul_params": n_mm, "config": cfg.__dict__})
    if ceil:
        ctx = plen + new / 2
        res.put(
            "decode_bound",
            {
                "formula": "B / [max(2N/BW, 2N*B/F) + B*L*k/BW], N = matmul params, L = prompt + new/2",
                "bw": ceil["copy_bytes_per_s"],
                "flops": ceil["bf16_gemm_flops"],
                "L": ctx,
                "tokens_per_s": decode_bound(
                    cfg, n_mm, batch, ctx=ctx, bw=ceil["copy_bytes_per_s"], flops=ceil["bf16_gemm_flops"]
                ),
                "tokens_per_s_datasheet_4.8TB_990TF": decode_bound(
                    cfg, n_mm, batch, ctx=ctx, bw=4.8e12, flops=990e12
                ),
            },
        )
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(1, cfg.vocab_size, (batch, plen), generator=g).to(dev)

    variants: list[tuple[str, dict[str, Any], DecodeParams]] = []
    if dev.type == "cuda":
        variants += [
            ("graph", {"use_cuda_graph": True}, DecodeParams(1.0)),
            ("graph_compiled", {"use_cuda_graph": True, "compile_layer": True}, DecodeParams(1.0)),
            (
                "graph_compiled_topk50_topp0.9",
                {"use_cuda_graph": True, "compile_layer": True},
                DecodeParams(1.0, top_p=0.9, top_k=50),
            ),
        ]
    variants.append(("eager_no_graph", {"use_cuda_graph": False}, DecodeParams(1.0)))
    ours: dict[str, Any] = {}
    for name, kw, params in variants:
        dec: StaticDecoder | None = None
        try:
            eager_cut = name == "eager_no_graph" and not args.tiny
            n_new = (
                min(new, 32) if eager_cut else new
            )  # the eager loop is slow; per-step time is what matters
            dec = StaticDecoder(
                model,
                max_batch=batch,
                max_prompt_len=plen,
                max_new_tokens=n_new,
                params=params,
                eos_ids=(),
                **kw,
            )
            t0 = time.perf_counter()
            dec.generate(prompts, seed=0)  # capture (and compile) here
            c.sync(dev)
            setup = time.perf_counter() - t0
            ts = c.timed(lambda d=dec: d.generate(prompts, seed=0), dev, args.repeats)
            st = dec._state(batch)
            tp = c.median(c.timed(lambda d=dec, s=st: d._prefill(s, prompts, s.pad.zero_()), dev, 3))
            t = c.median(ts)
            ours[name] = {
                "new_tokens": n_new,
                "seconds": t,
                "tokens_per_s": batch * n_new / t,
                "prefill_s": tp,
                "decode_ms_per_step": 1e3 * (t - tp) / max(n_new - 1, 1),
                "decode_only_tokens_per_s": batch * (n_new - 1) / max(t - tp, 1e-9),
                "setup_s_capture_compile": setup,
                "all_runs_s": ts,
            }
            res.put(f"ours.{name}", ours[name])
        except Exception:  # keep the other numbers if one variant breaks
            res.put(f"ours.{name}", {"error": traceback.format_exc()[-3000:]})
        dec = None
        c.release_memory()

    try:
        res.put("greedy_check_vs_model_forward", reference_check(model, prompts, 16))
        if dev.type == "cuda":
            # bf16 near-ties on a random model flip argmaxes; fp32 shows whether the paths agree.
            res.put(
                "greedy_check_vs_model_forward_fp32",
                reference_check(c.build_model(cfg, dev, torch.float32).eval(), prompts, 16),
            )
    except Exception:
        res.put("greedy_check_vs_model_forward", {"error": traceback.format_exc()[-3000:]})

    if not args.skip_hf:
        res.put("hf_generate", hf_baseline(cfg, dev, dtype, prompts, new=new))
    for small in args.extra_batches:
        if small >= batch:
            continue
        try:
            dec = StaticDecoder(
                model,
                max_batch=small,
                max_prompt_len=plen,
                max_new_tokens=new,
                params=DecodeParams(1.0),
                eos_ids=(),
                compile_layer=dev.type == "cuda",
            )
            dec.generate(prompts[:small], seed=0)
            part = prompts[:small]
            t = c.median(c.timed(lambda d=dec, x=part: d.generate(x, seed=0), dev, args.repeats))
            res.put(f"ours.graph_compiled.batch{small}", {"seconds": t, "tokens_per_s": small * new / t})
            dec = None
        except Exception:
            res.put(f"ours.graph_compiled.batch{small}", {"error": traceback.format_exc()[-3000:]})
        if not args.skip_hf:
            res.put(f"hf_generate.batch{small}", hf_baseline(cfg, dev, dtype, prompts[:small], new=new))
    best = max((v.get("tokens_per_s", 0.0) for v in ours.values()), default=0.0)
    hf = res.data.get("hf_generate", {}).get("tokens_per_s")
    res.put(
        "summary",
        {
            "ours_best_tokens_per_s": best,
            "hf_generate_tokens_per_s": hf,
            "speedup_vs_hf": best / hf if hf else None,
            "fraction_of_decode_bound": best / res.data["decode_bound"]["tokens_per_s"] if ceil else None,
            "target_tokens_per_s": 40000,
        },
    )


def hf_baseline(
    cfg: ModelConfig, dev: torch.device, dtype: torch.dtype, prompts: torch.Tensor, *, new: int
) -> dict[str, Any]:
    """transformers Qwen2ForCausalLM, same shape, random init, sdpa, plain generate() with sampling."""
    try:
        from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: PLC0415 - optional baseline
    except ImportError as exc:
        return {"skipped": f"transformers not importable: {exc}"}
    try:
        hcfg = Qwen2Config(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            max_position_embeddings=cfg.max_positions,
            tie_word_embeddings=False,
            rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        )
        hcfg._attn_implementation = "sdpa"
        torch.manual_seed(0)
        with torch.device(dev):
            hf = Qwen2ForCausalLM(hcfg)
        hf = hf.to(dev, dtype).eval()
        n = sum(p.numel() for p in hf.parameters())
        mask = torch.ones_like(prompts)
        kw = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "pad_token_id": 0}
        with torch.no_grad():
            hf.generate(prompts, attention_mask=mask, max_new_tokens=4, min_new_tokens=4, **kw)
            c.sync(dev)
            t0 = time.perf_counter()
            out = hf.generate(prompts, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **kw)
            c.sync(dev)
            t = time.perf_counter() - t0
        produced = int(out.shape[1] - prompts.shape[1]) * prompts.shape[0]
        attn = getattr(hf.config, "_attn_implementation", None)
        del hf
        return {
            "params": n,
            "attn": attn,
            "seconds": t,
            "tokens_per_s": produced / t,
            "new_tokens_per_row": produced // prompts.shape[0],
            "ms_per_step": 1e3 * t / new,
            "expected_tokens": prompts.shape[0] * new,
        }
    except Exception:
        return {"error": traceback.format_exc()[-3000:]}


if __name__ == "__main__":
    main()
