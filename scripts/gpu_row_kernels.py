"""Seedbar's CUDA row kernels (crates/seedbar-engine/src/step/row_products*.cu) on this
machine's MLX CUDA backend, for one model folder's projection shapes: is a row's result the
same bits alone and among 1-31 companions (zero or random, at any place) and in every tiling
of the kernel, how close is it to MLX's own product, and how fast is it beside MLX's product
and the CUDA-core kernel at 1, 8, 16 and 32 rows (the decode groups Seedbar runs)? The
kernel checked is the one Seedbar runs for the folder: for dense 16-bit weights on a GPU
with tensor cores, row_products_mma.cu (timed in each n-tiling beside the CUDA-core kernel);
for 4/8-bit weights, row_products_quantized.cu.
Usage: gpu_row_kernels.py MODEL_DIR [--repeats N]

Prints one JSON line per projection: identical (bool), worst relative error against MLX,
and microseconds per product for the kernel (per n-tiling), the CUDA-core kernel and MLX at
each row count, with the weight bytes read per microsecond (GB/s) at one row."""
import argparse
import json
import time
from pathlib import Path

import mlx.core as mx

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("--repeats", type=int, default=50)
args = parser.parse_args()
cfg = json.loads((Path(args.model) / "config.json").read_text())
quant = cfg.get("quantization")
d, ffn, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
hd = cfg.get("head_dim") or d // heads
step = Path(__file__).resolve().parent.parent / "crates/seedbar-engine/src/step"
MAX_ROWS = 32
mx.random.seed(3)


def kernel(file, inputs, header=""):
    return mx.fast.cuda_kernel(
        name=f"gpu_row_kernels_{file.replace('.', '_')}",
        input_names=inputs,
        output_names=["y"],
        source=(step / file).read_text(),
        header=header,
    )


if quant:
    CORES = kernel("row_products_quantized.cu", ["x", "w", "scales", "biases"])
else:
    CORES = kernel("row_products.cu", ["x", "w"])
    MMA = kernel("row_products_mma.cu", ["x", "w"], (step / "row_products_mma.cuh").read_text())
# Seedbar's n-tiles per block (row_products.rs: MMA_N_TILES) and the others timed.
N_TILES = 4
TILINGS = () if quant else (1, 2, 4)


def cores_variant(rows):
    """The CUDA-core kernel's variant for `rows` rows (row_products.rs: Tiles::WarpColumns)."""
    if rows <= 2:
        return 2, 1
    return (8, 2) if rows <= 8 else (MAX_ROWS, 2)


def make(k, n, dtype):
    """(tensor-core kernel by n-tiles (dense weights), CUDA-core kernel, MLX product, weight
    bytes) for an [n, k] projection."""
    w = (mx.random.normal((n, k)) * 0.05).astype(dtype)
    if quant:
        g, bits = quant["group_size"], quant["bits"]
        wq, scales, biases = mx.quantize(w, group_size=g, bits=bits)
        mx.eval(wq, scales, biases)
        inputs, extra = [wq, scales, biases], [("BITS", bits), ("GROUP", g)]
        size = wq.nbytes + scales.nbytes + biases.nbytes

        def reference(x):
            return mx.quantized_matmul(x, wq, scales, biases, transpose=True,
                                       group_size=g, bits=bits)
    else:
        mx.eval(w)
        inputs, extra, size = [w], [], w.nbytes

        def reference(x):
            return x @ w.T

    def mma(n_tiles):
        def product(x):
            m_tiles = (x.shape[0] + 15) // 16
            blocks = (n + 8 * n_tiles - 1) // (8 * n_tiles)
            return MMA(inputs=[x, *inputs],
                       template=[("T", dtype), ("MT", m_tiles), ("NT", n_tiles), *extra],
                       grid=(blocks * 128, 1, 1), threadgroup=(128, 1, 1),
                       output_shapes=[(x.shape[0], n)], output_dtypes=[dtype])[0]
        return product

    def cores(x):
        max_rows, cols = cores_variant(x.shape[0])
        return CORES(inputs=[x, *inputs],
                     template=[("T", dtype), ("MAX_ROWS", max_rows), ("COLS", cols), *extra],
                     grid=((n + cols - 1) // cols * 32, 1, 1), threadgroup=(128, 1, 1),
                     output_shapes=[(x.shape[0], n)], output_dtypes=[dtype])[0]

    return {t: mma(t) for t in TILINGS}, cores, reference, size


def timed(f, x, chain=20):
    """Microseconds per product, over `chain` products in one evaluation (one eval's own
    cost would outweigh a product of a few rows)."""
    for _ in range(3):
        mx.eval([f(x) for _ in range(chain)])
    mx.synchronize()
    start = time.perf_counter()
    for _ in range(args.repeats):
        mx.eval([f(x) for _ in range(chain)])
    mx.synchronize()
    return (time.perf_counter() - start) / args.repeats / chain * 1e6


dtype = mx.bfloat16 if cfg.get("torch_dtype", "bfloat16") == "bfloat16" else mx.float16
shapes = {"q/o": (d, heads * hd), "k/v": (d, kv_heads * hd), "gate/up": (d, ffn),
          "down": (ffn, d), "head": (d, vocab)}
for name, (k, n) in shapes.items():
    tilings, cores, reference, size = make(k, n, dtype)
    row = cores if quant else tilings[N_TILES]
    target = mx.random.normal((1, k)).astype(dtype)
    others = mx.random.normal((MAX_ROWS, k)).astype(dtype)
    alone = row(target)[0]
    identical = all(bool(mx.array_equal(f(target)[0], alone).item()) for f in tilings.values())
    for rows in (2, 3, 8, 9, 16, 17, 32):
        for companions in (mx.zeros((MAX_ROWS, k), dtype), others):
            for place in {0, rows // 2, rows - 1}:
                x = mx.concatenate([companions[:place], target, companions[place + 1:rows]])
                identical &= bool(mx.array_equal(row(x)[place], alone).item())
    x = others
    want = reference(x).astype(mx.float32)
    error = (mx.abs(row(x).astype(mx.float32) - want).max() / mx.abs(want).max()).item()
    times = {}
    for rows in (1, 8, 16, 32):
        xs = others[:rows]
        times[rows] = {f"mma{t}_us": round(timed(f, xs), 1) for t, f in tilings.items()}
        times[rows]["cores_us"] = round(timed(cores, xs), 1)
        times[rows]["mlx_us"] = round(timed(reference, xs), 1)
    print(json.dumps({"projection": f"{name} {k}x{n}", "identical": identical,
                      "relative_error": round(error, 5), "times": times,
                      "row_gbps_at_1": round(size / times[1][f"mma{N_TILES}_us" if tilings else "cores_us"] / 1e3, 1),
                      "cores_gbps_at_1": round(size / times[1]["cores_us"] / 1e3, 1),
                      "mlx_gbps_at_1": round(size / times[1]["mlx_us"] / 1e3, 1)}), flush=True)
