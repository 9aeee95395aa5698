"""The official-style PyTorch training step of precision_ls, timed on this machine.

  pip install torch==2.13.0   # a CPU build; not a jaxlab dependency
  python benchmarks/precision_ls_torch_reference.py [--steps 20] [--batch 1024]

The issue quotes the official code's speed on another 2-core CPU, whose matmul peak is about twice
this machine's; to compare like with like, this script rebuilds the same step in PyTorch (written
here from the paper's description and the official configuration, not copied): a GPT-2-style
backbone, 3 layers of width 64, no MLP, no LayerNorm, with BaseConv (depthwise Conv1d whose kernel
spans the sequence, causal, with its residual) or softmax attention; Adam (eps 1e-16) with gradient
clipping at 100 and the gradient-EMA filter; d=5, n=20, the explicit-gradient task. It prints
steps/s for float32 and float64; `precision_ls_speed.py` puts them next to jaxlab's.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import pathlib
import platform
import time

import torch
from torch import nn


class BaseConv(nn.Module):

  def __init__(self, width: int, length: int):
    super().__init__()
    self.in_proj, self.gate, self.out_proj = (nn.Linear(width, width) for _ in range(3))
    self.conv = nn.Conv1d(width, width, kernel_size=length, groups=width, padding=length - 1)
    self.branch = nn.Parameter(torch.tensor([1.0, 0.0]))

  def forward(self, u):
    v = self.in_proj(u).transpose(1, 2)
    conv = (self.conv(v)[..., : u.shape[1]] + v).transpose(1, 2)
    y = self.out_proj(conv * self.gate(u))
    return self.branch[0] * y + self.branch[1] * u


class Attention(nn.Module):

  def __init__(self, width: int, heads: int):
    super().__init__()
    self.heads = heads
    self.qkv, self.c_proj = nn.Linear(width, 3 * width), nn.Linear(width, width)

  def forward(self, x):
    b, t, c = x.shape
    q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
               for z in self.qkv(x).split(c, dim=2))
    y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


class Model(nn.Module):

  def __init__(self, mixer: str, d: int, n: int, width: int = 64, depth: int = 3):
    super().__init__()
    length = n + 1
    self.read_in, self.read_out = nn.Linear(d + 1, width), nn.Linear(width, d)
    self.positions = nn.Parameter(0.02 * torch.randn(length, width))
    self.blocks = nn.ModuleList(
        BaseConv(width, length) if mixer == "baseconv" else Attention(width, 4)
        for _ in range(depth))

  def forward(self, tokens):
    h = self.read_in(tokens) + self.positions
    for block in self.blocks:
      h = h + block(h)
    return self.read_out(h)


def batch(bsz: int, d: int, n: int, dtype):
  a = torch.randn(bsz, n, d, dtype=dtype)
  x_star, x = torch.randn(bsz, d, dtype=dtype), torch.randn(bsz, d, dtype=dtype)
  b = torch.einsum("bnd,bd->bn", a, x_star)
  tokens = torch.cat([torch.cat([x, torch.zeros(bsz, 1, dtype=dtype)], -1)[:, None],
                      torch.cat([a, b[..., None]], -1)], 1)
  target = torch.einsum("bnd,bn->bd", a, torch.einsum("bnd,bd->bn", a, x) - b) / n
  return tokens, target


def steps_per_second(mixer: str, dtype, bsz: int, steps: int, d: int = 5, n: int = 20) -> float:
  torch.manual_seed(0)
  model = Model(mixer, d, n).to(dtype)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-16)
  ema = None
  tokens, target = batch(bsz, d, n, dtype)

  def step():
    nonlocal ema
    optimizer.zero_grad()
    loss = ((model(tokens)[:, -1] - target) ** 2).mean()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 100.0)
    if not math.isfinite(norm.item()) or norm.item() > 1e3:
      return
    grads = [p.grad for p in model.parameters()]
    ema = ([g.clone() for g in grads] if ema is None
           else [0.98 * e + 0.02 * g for e, g in zip(ema, grads)])
    for g, e in zip(grads, ema):
      g.add_(2.0 * e)
    optimizer.step()

  step()
  start = time.perf_counter()
  for _ in range(steps):
    step()
  return steps / (time.perf_counter() - start)


def main() -> dict[tuple[str, str], float]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--no-append", action="store_true")
  args = parser.parse_args()
  rates = {}
  for mixer in ("baseconv", "softmax"):
    for name, dtype in (("float32", torch.float32), ("float64", torch.float64)):
      rates[(mixer, name)] = steps_per_second(mixer, dtype, args.batch, args.steps)
  table = (f"\n## Official-style PyTorch step on this machine, {datetime.date.today()} "
           f"({platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
           f"{torch.get_num_threads()} threads, batch {args.batch})\n\n"
           "| model | dtype | steps/s |\n|---|---|---|\n" +
           "".join(f"| {m} | {p} | {r:.1f} |\n" for (m, p), r in rates.items()))
  print(table)
  if not args.no_append:
    with open(pathlib.Path(__file__).resolve().parent / "RESULTS.md", "a",
              encoding="utf-8") as f:
      f.write(table)
  return rates


if __name__ == "__main__":
  main()
