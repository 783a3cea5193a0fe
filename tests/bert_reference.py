"""BERT in numpy (float64), one unpadded input at a time: the independent reference that
Seedbar's encoders are checked against — sentence embeddings (mean pooling, L2 normalized)
and cross-encoder relevance scores (pooler, classifier, sigmoid)."""

import math

import numpy as np
from safetensors.numpy import load_file


class ReferenceBert:
    def __init__(self, folder, heads=12):
        weights = load_file(str(folder / "model.safetensors"))
        self.w = {k: v.astype(np.float64) for k, v in weights.items()}
        self.root = "bert." if "bert.embeddings.word_embeddings.weight" in self.w else ""
        self.layers = sum(1 for k in self.w if k.endswith("attention.self.query.weight"))
        self.heads = heads

    @staticmethod
    def norm(x, w, b, eps=1e-12):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w + b

    def dense(self, x, name):
        return x @ self.w[f"{name}.weight"].T + self.w[f"{name}.bias"]

    def hidden(self, ids, types=None):
        """The last hidden states of `ids` (token types `types`, all 0 when None)."""
        w, n, r = self.w, len(ids), self.root
        types = np.zeros(n, dtype=np.int64) if types is None else np.asarray(types)
        x = w[f"{r}embeddings.word_embeddings.weight"][ids] + w[f"{r}embeddings.position_embeddings.weight"][:n]
        x = x + w[f"{r}embeddings.token_type_embeddings.weight"][types]
        x = self.norm(x, w[f"{r}embeddings.LayerNorm.weight"], w[f"{r}embeddings.LayerNorm.bias"])
        erf = np.vectorize(math.erf)
        for i in range(self.layers):
            p = f"{r}encoder.layer.{i}"
            d = x.shape[-1]
            hd = d // self.heads
            q, k, v = (self.dense(x, f"{p}.attention.self.{m}").reshape(n, self.heads, hd).transpose(1, 0, 2)
                       for m in ("query", "key", "value"))
            scores = q @ k.transpose(0, 2, 1) / math.sqrt(hd)
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            probs = scores / scores.sum(-1, keepdims=True)
            attended = (probs @ v).transpose(1, 0, 2).reshape(n, d)
            x = self.norm(x + self.dense(attended, f"{p}.attention.output.dense"),
                          w[f"{p}.attention.output.LayerNorm.weight"], w[f"{p}.attention.output.LayerNorm.bias"])
            h = self.dense(x, f"{p}.intermediate.dense")
            h = 0.5 * h * (1.0 + erf(h / math.sqrt(2.0)))
            x = self.norm(x + self.dense(h, f"{p}.output.dense"),
                          w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"])
        return x

    def __call__(self, ids):
        """The sentence embedding: mean pooling, L2 normalized."""
        pooled = self.hidden(ids).mean(0)
        return pooled / max(np.linalg.norm(pooled), 1e-12)

    def relevance(self, ids, types):
        """A cross-encoder's score: the first token through the pooler and the classifier,
        then the sigmoid."""
        first = self.hidden(ids, types)[0]
        pooled = np.tanh(self.dense(first, f"{self.root}pooler.dense"))
        logit = float(self.dense(pooled, "classifier")[0])
        return 1.0 / (1.0 + math.exp(-logit))
