"""Kernel-level batch invariance on this machine's MLX GPU backend, for one model folder's
shapes (gpu-invariance.md's T1/T2): does a row's result depend on its companions, its place
in the call, or the run? Usage: gpu_kernel_invariance.py MODEL_DIR [DECODE_WIDTH]

For every projection of the model (q, k, v, o, gate, up, down, output head; quantized as the
checkpoint is) a decode group of DECODE_WIDTH rows (default 16, CUDA's quantized width) with
the target row at several places among zero and random companions; a prefill chunk run
twice; the pooled decode attention as Seedbar runs it on CUDA (two batched matmuls per call
of 32 slots) with the target slot among zero and random slots; and causal attention of a
prefill chunk over a cache buffer's slice, run twice; and (`branches`) the target's MLP
evaluated together with companions' MLPs as independent branches of one graph, many times.
Prints one JSON line per check with whether every variant gave the target's bits."""
import argparse
import json
from pathlib import Path

import mlx.core as mx

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--width", type=int, default=16)
parser.add_argument("--repeats", type=int, default=200)
parser.add_argument("--checks", default="shapes,branches")
args = parser.parse_args()
cfg = json.loads((Path(args.model) / "config.json").read_text())
width = args.width
checks = args.checks.split(",")
d, ffn, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = cfg.get("head_dim") or d // heads
quant = cfg.get("quantization")
mx.random.seed(7)


def report(check, ok, **extra):
    print(json.dumps({"check": check, "identical": bool(ok), **extra}), flush=True)


def same(a, b):
    return bool(mx.array_equal(a, b).item())


def projection(k, n, dtype):
    w = (mx.random.normal((n, k)) * 0.05).astype(dtype)
    if not quant:
        return lambda x: x @ w.T
    wq, scales, biases = mx.quantize(w, group_size=quant["group_size"], bits=quant["bits"])
    return lambda x: mx.quantized_matmul(
        x, wq, scales, biases, transpose=True, group_size=quant["group_size"], bits=quant["bits"]
    )


for dtype in (mx.float16, mx.bfloat16) if "shapes" in checks else ():
    name = str(dtype).split(".")[-1]
    shapes = {"q/o": (d, heads * hd), "k/v": (d, kv_heads * hd), "gate/up": (d, ffn),
              "gate+up": (d, 2 * ffn), "down": (ffn, d), "head": (d, vocab)}
    for proj, (k, n) in shapes.items():
        f = projection(k, n, dtype)
        target = mx.random.normal((1, k)).astype(dtype)
        others = mx.random.normal((width, k)).astype(dtype)
        reference = None
        ok = True
        for place in (0, width // 2, width - 1):
            for companions in ("zeros", "random"):
                rows = mx.zeros((width, k), dtype) if companions == "zeros" else others
                x = mx.concatenate([rows[:place], target, rows[place + 1:]])[None]
                out = f(x)[0, place]
                mx.eval(out)
                reference = out if reference is None else reference
                ok &= same(out, reference)
        # The same group at an offset inside a larger buffer (a slice, not a fresh array).
        big = mx.concatenate([others, target, others])[None]
        sliced = big[:, width:2 * width]
        out = f(sliced)[0, 0]
        ok_offset = same(out, reference)
        alone = f(target[None])[0, 0]
        report(f"{proj} {k}x{n} {name} W={width}", ok, offset_slice=ok_offset,
               equals_one_row=same(alone, reference))
        chunk = mx.random.normal((1, 188, k)).astype(dtype)
        a, b = f(chunk), f(chunk)
        report(f"{proj} {k}x{n} {name} chunk 188 twice", same(a, b))

    # Pooled decode attention on CUDA: per call of 32 slots, q·Kᵀ and softmax·V as batched
    # matmuls of each KV head's query heads.
    rep, slots = heads // kv_heads, 32
    for capacity in (256, 512):
        q_t = mx.random.normal((1, kv_heads, rep, hd)).astype(dtype)
        k_t = mx.random.normal((1, kv_heads, capacity, hd)).astype(dtype)
        v_t = mx.random.normal((1, kv_heads, capacity, hd)).astype(dtype)
        length = capacity - 37
        mask_t = mx.where(mx.arange(capacity) < length, 0.0, -mx.inf).astype(dtype)
        outs = []
        for place in (0, 17, 31):
            for companions in ("zeros", "random"):
                def filled(t, shape):
                    base = (mx.zeros(shape, dtype) if companions == "zeros"
                            else mx.random.normal(shape).astype(dtype))
                    return mx.concatenate([base[:place], t, base[place + 1:]])
                q = filled(q_t, (slots, kv_heads, rep, hd))
                k_ = filled(k_t, (slots, kv_heads, capacity, hd))
                v_ = filled(v_t, (slots, kv_heads, capacity, hd))
                mask = mx.broadcast_to(mask_t, (slots, 1, 1, capacity))
                scores = (q * (hd ** -0.5)) @ k_.swapaxes(-1, -2) + mask
                out = mx.softmax(scores, axis=-1, precise=True) @ v_
                mx.eval(out)
                outs.append(out[place])
        report(f"pooled attention hd {hd} capacity {capacity} {name}",
               all(same(o, outs[0]) for o in outs))

    # A prefill chunk's causal attention over its cache buffer's first positions.
    for length in (100, 188, 300):
        buf_k = mx.random.normal((1, kv_heads, 512, hd)).astype(dtype)
        buf_v = mx.random.normal((1, kv_heads, 512, hd)).astype(dtype)
        q = mx.random.normal((1, heads, length, hd)).astype(dtype)
        runs = [mx.fast.scaled_dot_product_attention(
            q, buf_k[:, :, :length], buf_v[:, :, :length], scale=hd ** -0.5, mask="causal")
            for _ in range(3)]
        mx.eval(runs)
        report(f"prefill attention hd {hd} length {length} {name} thrice",
               all(same(r, runs[0]) for r in runs))

# Concurrent branches: a step runs each matmul group's layers as independent branches of
# one graph (MLX's CUDA graphs run independent nodes at once). The target's MLP beside
# companions' MLPs, evaluated together many times, against the target's MLP alone.
branches = args.repeats if "branches" in checks else 0
dtype = mx.float16
norm_w = mx.ones((d,), dtype)
gate, up, down = projection(d, ffn, dtype), projection(d, ffn, dtype), projection(ffn, d, dtype)
fused = mx.compile(lambda g, u: g * mx.sigmoid(g) * u, shapeless=True)
variants = {
    "mlp compiled": lambda x: x + down(fused(gate(mx.fast.rms_norm(x, norm_w, 1e-5)),
                                            up(mx.fast.rms_norm(x, norm_w, 1e-5)))),
    "mlp plain": lambda x: x + down(mx.sigmoid(g := gate(x)) * g * up(x)),
    "gate then down": lambda x: down(gate(x)),
    "gate": lambda x: gate(x),
}
for name, f in variants.items() if branches else ():
    for rows, companions in ((16, (16,)), (181, (40, 16)), (16, (16, 16, 16))):
        target = mx.random.normal((1, rows, d)).astype(dtype)
        others = [mx.random.normal((1, r, d)).astype(dtype) for r in companions]
        mx.eval(target, others)
        alone = f(target)
        mx.eval(alone)
        differ = 0
        for _ in range(branches):
            outs = [f(target)] + [f(o) for o in others]
            mx.eval(outs)
            differ += not same(outs[0], alone)
        report(f"concurrent {name} rows {rows} beside {list(companions)}", differ == 0,
               differing=differ, of=branches)
