"""Queries, keys and values captured from a small language model trained here on real text: the
attention benchmark's "captured" setting (benchmarks/attention.py).

The model reads bytes: LAYERS decoder layers of HEADS heads of dim 64 with rotary positions and
learned alpha-entmax in every head (alpha starting at 1.5, in the blocked
scaled_dot_product_attention, which gives the alphas their gradient). It trains for STEPS updates
of BATCH windows of CONTEXT bytes of the text. Then a window of `tokens` bytes from the text's
last tenth, which training never saw, goes through it, and each layer's rotated queries and keys
and its values are kept. The heads of the layers are put side by side, as (1, LAYERS * HEADS,
tokens, 64), with each head's learned alpha.
"""

import hashlib
import math
import time
from pathlib import Path

LAYERS, HEADS, HEAD_DIM = 2, 4, 64
CONTEXT, BATCH, STEPS, LEARNING_RATE = 512, 8, 300, 2e-3
HELD_OUT = 0.1  # the text's last tenth, from which the captured window comes


def _rotate(x):
    """Rotary positions (Su et al. 2021) on (batch, heads, tokens, dim): a score then depends on the distance
    between query and key, so that a model trained on CONTEXT bytes runs on more.
    """
    import torch

    half = x.shape[-1] // 2
    frequencies = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = torch.arange(x.shape[-2], dtype=torch.float32)[:, None] * frequencies
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * angles.cos() - second * angles.sin(), first * angles.sin() + second * angles.cos()), -1)


def _model():
    import torch
    from torch import nn

    from fairseq_entmax.attention import scaled_dot_product_attention
    from fairseq_entmax.normalizers import build_normalizer

    dim = HEADS * HEAD_DIM

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.feedforward_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
            self.qkv, self.out = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
            self.feedforward = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
            self.normalizer = build_normalizer("alpha_entmax", HEADS, alpha_init=1.5)
            self.captured = None

        def forward(self, x):
            batch, tokens, _ = x.shape
            qkv = self.qkv(self.attention_norm(x)).view(batch, tokens, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
            query, key, value = _rotate(qkv[0]), _rotate(qkv[1]), qkv[2]
            if self.captured is not None:
                self.captured.append((query, key, value))
            attended = scaled_dot_product_attention(query, key, value, is_causal=True, normalizer=self.normalizer)
            x = x + self.out(attended.transpose(1, 2).reshape(batch, tokens, dim))
            return x + self.feedforward(self.feedforward_norm(x))

    class ByteModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(256, dim)
            # The output reuses the embedding: at N(0, 1) its logits would start far from uniform.
            nn.init.normal_(self.embed.weight, std=0.02)
            self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
            self.norm = nn.LayerNorm(dim)

        def forward(self, tokens):
            x = self.embed(tokens)
            for layer in self.layers:
                x = layer(x)
            return self.norm(x) @ self.embed.weight.T

    torch.manual_seed(0)
    return ByteModel()


def _train(model, data, log):
    import torch

    optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 30))
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for step in range(1, STEPS + 1):
        first = torch.randint(0, len(data) - CONTEXT - 1, (BATCH,), generator=generator)
        window = torch.stack([data[i : i + CONTEXT + 1] for i in first.tolist()])
        logits = model(window[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), window[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        warmup.step()
        if step % 50 == 0 or step == STEPS:
            bits = loss.item() / math.log(2)
            log(f"  update {step}/{STEPS}: {bits:.2f} bits per byte, {time.perf_counter() - start:.0f} s")


def capture(text, tokens, path, log=print):
    """Train the byte model on `text` and capture its attention inputs on `tokens` held-out bytes, or read them
    from `path` where an earlier call saved them for the same text and length. The trained model is kept
    beside, as <text's stem>.model.pt, for the captures of other lengths.

    Args: text: a UTF-8 text file (at least ten times `tokens` bytes); tokens: the captured window's length;
    path: the capture's file (a torch file, written once); log: progress, a line at a time.
    Returns: {"query", "key", "value": (1, LAYERS * HEADS, tokens, 64) float32 tensors, "alpha_logit" and
    "alpha": the heads' learned alphas, (LAYERS * HEADS,), "source": what was trained on what}.
    Raises ValueError: a text too short for the window, saying how long it must be.
    """
    import torch

    text, path = Path(text), Path(path)
    raw = text.read_bytes()
    digest = hashlib.sha1(raw).hexdigest()[:12]
    source = f"{text.name} ({len(raw):,} bytes, sha1 {digest}), {STEPS} updates of {BATCH} x {CONTEXT} bytes"
    if path.exists():
        saved = torch.load(path, weights_only=True)
        if saved["source"] == source and saved["query"].shape[-2] == tokens:
            return saved
    # The last tenth holds the window; the rest, ten training windows at least.
    needed = max(math.ceil(tokens / HELD_OUT), math.ceil(10 * CONTEXT / (1 - HELD_OUT)))
    if len(raw) < needed:
        raise ValueError(f"{text} has {len(raw):,} bytes; a window of {tokens:,} needs a text of {needed:,} at least")
    data = torch.tensor(list(raw), dtype=torch.long)
    held_out = int(len(data) * (1 - HELD_OUT))
    model, model_path = _model(), path.parent / f"{text.stem}.model.pt"
    trained = torch.load(model_path, weights_only=True) if model_path.exists() else {}
    if trained.get("source") == source:
        model.load_state_dict(trained["state"])
    else:
        log(f"captured: training a byte model with learned alpha-entmax on {source}")
        _train(model, data[:held_out], log)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"source": source, "state": model.state_dict()}, model_path)
    for layer in model.layers:
        layer.captured = []
    with torch.no_grad():
        model(data[held_out : held_out + tokens][None])
    query, key, value = (torch.cat([layer.captured[0][i] for layer in model.layers], dim=1) for i in range(3))
    alpha_logit = torch.cat([layer.normalizer.alpha_logit.detach() for layer in model.layers])
    alpha = torch.cat([layer.normalizer.head_alpha().detach() for layer in model.layers])
    saved = {"query": query, "key": key, "value": value, "alpha_logit": alpha_logit, "alpha": alpha, "source": source}
    torch.save(saved, path)
    return saved
