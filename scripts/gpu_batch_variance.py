"""Does a row's projection result depend on how many rows share the GEMM on this GPU?
SmolLM2-135M's shapes (hidden 576 -> q 576, gate/up 1536, vocab 49152), bf16/f16/f32 weights,
row 0 computed alone (M=1) vs inside batches of M = 2..64, and inside a batch padded to a
fixed width. Prints the max abs difference and whether row 0 is bit-identical. Uses PyTorch
(cuBLAS), which is what the device image carries; MLX's CUDA backend also dispatches to
cuBLAS/cuBLASLt GEMMs."""

import json

import torch

torch.manual_seed(0)
dev = "cuda"
results = []
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for d_in, d_out in ((576, 576), (576, 1536), (1536, 576), (576, 49152)):
        w = torch.randn(d_out, d_in, device=dev, dtype=dtype) / d_in**0.5
        x = torch.randn(64, d_in, device=dev, dtype=dtype)
        alone = x[:1] @ w.T
        row = {"dtype": str(dtype).split(".")[1], "shape": [d_in, d_out], "differs_at_m": [], "max_abs_diff": 0.0}
        for m in (2, 3, 4, 8, 16, 32, 64):
            batched = (x[:m] @ w.T)[:1]
            diff = (batched.float() - alone.float()).abs().max().item()
            if not torch.equal(batched, alone):
                row["differs_at_m"].append(m)
            row["max_abs_diff"] = max(row["max_abs_diff"], diff)
        # Fixed width: always run 64 rows (padding with zeros); row 0 then never changes.
        padded = [(torch.cat([x[:m], torch.zeros(64 - m, d_in, device=dev, dtype=dtype)]) @ w.T)[:1] for m in (1, 3, 8, 64)]
        row["fixed_width_64_identical"] = all(torch.equal(p, padded[0]) for p in padded)
        results.append(row)
print(json.dumps({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
                  "cuda": torch.version.cuda, "results": results}, indent=1))
