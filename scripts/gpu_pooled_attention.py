"""Seedbar's pooled decode attention kernel (crates/seedbar-engine/src/step/pooled_attention.cu)
on this machine's MLX CUDA backend, for one model folder's head shapes: is a query's output
the same bits alone and among 31 other rows, at another capacity and slot, beside queries of
its own row at other lengths (a verify chunk's positions), a block per key-value head, and
through a sliding window's ring; how close is it to MLX's attention; and how fast is it beside the pooled calls it
replaces (two batched matmuls around a masked softmax per call of 32 slots)?
Usage: gpu_pooled_attention.py MODEL_DIR [--repeats N] [--kernel FILE]

Prints one JSON line per check group and per timing."""
import argparse
import json
import math
import time
from pathlib import Path

import mlx.core as mx

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--repeats", type=int, default=20)
parser.add_argument("--kernel", help="another version of pooled_attention.cu to check and time (default: the tree's)")
args = parser.parse_args()
cfg = json.loads((Path(args.model) / "config.json").read_text())
heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
dtype = mx.bfloat16 if cfg.get("torch_dtype", "bfloat16") == "bfloat16" else mx.float16
scale = 1.0 / math.sqrt(hd)
step = Path(__file__).resolve().parent.parent / "crates/seedbar-engine/src/step"
KERNEL = mx.fast.cuda_kernel(
    name="gpu_pooled_attention",
    input_names=["q", "keys", "values", "rows", "factors"],
    output_names=["y"],
    source=Path(args.kernel or step / "pooled_attention.cu").read_text(),
)
mx.random.seed(5)


GROUP = heads // kv_heads


def attend(q, keys, values, rows, softcap=None, group=1):
    """The kernel, as step/pooled_attention.rs launches it: rows are (place, slot, len, first);
    `group` query heads a block (1, or GROUP: all the heads of a key-value head)."""
    table = mx.array(rows, dtype=mx.int32)
    factors = mx.array([scale, softcap or 1.0], dtype=mx.float32)
    return KERNEL(inputs=[q, keys, values, table, factors],
                  template=[("T", dtype), ("HD", hd), ("SOFTCAP", int(softcap is not None)),
                            ("GROUP", group)],
                  grid=(len(rows) * heads // group * 128, 1, 1), threadgroup=(128, 1, 1),
                  output_shapes=[(len(rows), heads, 1, hd)], output_dtypes=[dtype])[0]


def pool(slots, capacity):
    shape = (slots, kv_heads, capacity, hd)
    return mx.random.normal(shape).astype(dtype), mx.random.normal(shape).astype(dtype)


def same(a, b):
    return bool(mx.array_equal(a, b).item())


results = {}
queries = mx.random.normal((32, heads, 1, hd)).astype(dtype)
keys, values = pool(32, 1024)
target = (0, 5, 700, 0)  # place 0, slot 5, 700 positions
alone = attend(queries, keys, values, [target])
# Among 31 other rows of other slots and lengths, at another place in the table.
others = [(p, (p * 7) % 32, 1 + (p * 131) % 1024, 0) for p in range(1, 32)]
crowd = attend(queries, keys, values, others[:13] + [target] + others[13:])
results["among_31"] = same(crowd[13], alone[0])
# A block per key-value head (its query heads together): the same bits as a block per head.
results["grouped_equals_per_head"] = same(attend(queries, keys, values, others[:13] + [target] + others[13:],
                                                 group=GROUP), crowd)
# The same keys at a larger capacity and another slot.
big_k, big_v = pool(8, 2048)
big_k[3, :, :1024] = keys[5]
big_v[3, :, :1024] = values[5]
results["other_capacity_and_slot"] = same(attend(queries, big_k, big_v, [(0, 3, 700, 0)])[0], alone[0])
# Beside the row's own queries at other lengths (drafted positions verified in one step).
verify = attend(queries, keys, values, [(1, 5, 698, 0), (2, 5, 699, 0), target, (3, 5, 701, 0)])
results["beside_its_verify_positions"] = same(verify[2], alone[0])
# A sliding window of 256 over a ring of 512: positions 444..699, at index t % 512.
ring_k, ring_v = pool(32, 512)


def ring_of(buffer, full):
    """`buffer` with slot 5 holding positions 444..699 of `full`'s slot 5 at t % 512 (the
    indices 188..443 keep other values)."""
    held = mx.concatenate([full[5][:, 512:700], buffer[5][:, 188:444], full[5][:, 444:512]], axis=1)
    return mx.concatenate([buffer[:5], held[None], buffer[6:]])


ring_k, ring_v = ring_of(ring_k, keys), ring_of(ring_v, values)
windowed = attend(queries, keys, values, [(0, 5, 700, 444)])
results["window_through_ring"] = same(attend(queries, ring_k, ring_v, [(0, 5, 700, 444)])[0], windowed[0])


def reference(place, slot, length, first, k=keys, v=values):
    q = queries[place:place + 1]
    ks, vs = k[slot:slot + 1, :, first:length], v[slot:slot + 1, :, first:length]
    return mx.fast.scaled_dot_product_attention(q, ks, vs, scale=scale)


def error(got, want):
    got, want = got.astype(mx.float32), want.astype(mx.float32)
    return (mx.abs(got - want).max() / mx.abs(want).max()).item()


results["relative_error"] = round(max(error(alone[0:1], reference(*target)),
                                      error(windowed[0:1], reference(0, 5, 700, 444))), 5)
cap = 50.0
capped = attend(queries, keys, values, [target], softcap=cap)
qs = queries[0:1].reshape(1, kv_heads, heads // kv_heads, 1, hd).astype(mx.float32) * scale
ks = keys[5:6, :, :700].astype(mx.float32)[:, :, None]
s = qs @ ks.swapaxes(-1, -2)
s = cap * mx.tanh(s / cap)
want = (mx.softmax(s, axis=-1) @ values[5:6, :, :700].astype(mx.float32)[:, :, None]).reshape(1, heads, 1, hd)
results["softcap_relative_error"] = round(error(capped, want), 5)
print(json.dumps({"checks": results, "heads": heads, "kv_heads": kv_heads, "head_dim": hd}), flush=True)


def matmul_calls(q, k, v, mask):
    """The pooled call the kernel replaces (attention.rs / decoder.rs attend_by_matmuls)."""
    s = q.shape[0]
    qg = q.reshape(s, kv_heads, heads // kv_heads, hd) * mx.array(scale, dtype)
    w = mx.softmax((qg @ k.swapaxes(-1, -2)) + mask, axis=-1, precise=True)
    return (w @ v).reshape(s, heads, 1, hd)


def timed(f, chain=20):
    for _ in range(3):
        mx.eval([f() for _ in range(chain)])
    mx.synchronize()
    start = time.perf_counter()
    for _ in range(args.repeats):
        mx.eval([f() for _ in range(chain)])
    mx.synchronize()
    return (time.perf_counter() - start) / args.repeats / chain * 1e6


for capacity in (512, 1024, 2048):
    k, v = pool(32, capacity)
    length = capacity - 100
    mask = mx.where(mx.arange(capacity) < length, 0.0, -mx.inf).astype(dtype).reshape(1, 1, 1, capacity)
    mask = mx.broadcast_to(mask, (32, 1, 1, capacity))
    for rows in (1, 8, 32):
        table = [(r, r, length, 0) for r in range(rows)]
        kernel_us = timed(lambda: attend(queries, k, v, table))
        grouped_us = timed(lambda: attend(queries, k, v, table, group=GROUP))
        calls_us = timed(lambda: matmul_calls(queries, k, v, mask))
        print(json.dumps({"capacity": capacity, "rows": rows, "kernel_us": round(kernel_us, 1),
                          "grouped_kernel_us": round(grouped_us, 1), "matmul_call_us": round(calls_us, 1)}),
              flush=True)
