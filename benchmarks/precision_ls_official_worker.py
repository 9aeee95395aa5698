"""Times the official precision_ls training step (HazyResearch/precision-ls) in its own process.

Started by `precision_ls_speed.py --official DIR` with the Python of an environment that has the
official code's dependencies (`pip install torch==2.13.0 einops munch numpy pyyaml tqdm`; that torch is a CPU build);
not a jaxlab dependency and never imported by jaxlab. It builds the official model, optimiser,
scheduler and data exactly as `src/train.py` does for `conf/gradient_descent/explicit_gradient.yaml`
(GPT-2 backbone, 3 layers, width 64, no MLP or LayerNorm; BaseConv or 1-head softmax attention;
Adam eps 1e-16; adaptive-threshold LR; EMA gradient filter), samples one batch with the official
least-squares sampler, and then times the official `train_step(...)` on that batch (backward,
clipping at 100, the EMA filter, Adam, the scheduler), as jaxlab's benchmark times its step on a
fixed batch. Not timed, as in ours: data sampling and the per-step logging metrics.

Changes needed to run it, and nothing else: `wandb`, `quinine` and `funcy` (the logger and the
config-schema library `train.py` imports) are replaced by empty modules, the sampler is told
`device="cpu"`, and torch uses `--threads` threads (2: this machine's cores).

Protocol (one JSON object per line on stdout): prints {"ready": ...} after building and warming
up, then answers each stdin line `window SECONDS` with {"steps": n, "seconds": t} for a window of
whole steps lasting at least SECONDS; `quit` ends it.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import types

import official_protocol  # benchmarks/, the script's own directory


def stub_module(name: str) -> None:
  """An importable module whose every attribute is a do-nothing callable."""
  module = types.ModuleType(name)

  def anything(*args, **kwargs):
    return anything

  def attribute_of(attribute: str):
    if attribute.startswith("__"):   # what import machinery and inspect look up
      raise AttributeError(attribute)
    return anything
  module.__getattr__ = attribute_of
  sys.modules[name] = module


def build(official: pathlib.Path, mixer: str, heads: int, dtype_name: str, batch_size: int):
  for name in ("wandb", "quinine", "funcy"):
    stub_module(name)
  sys.path.insert(0, str(official / "src"))
  import torch  # pylint: disable=g-import-not-at-top
  from munch import Munch  # pylint: disable=g-import-not-at-top
  import train as official_train  # pylint: disable=g-import-not-at-top
  from datagen.main import get_data_sampler, get_task_sampler  # pylint: disable=g-import-not-at-top
  from models import build_model  # pylint: disable=g-import-not-at-top
  from schedulers import AdaptiveStepLR  # pylint: disable=g-import-not-at-top

  # conf/standard.yaml < gradient_descent/default_recipe.yaml < explicit_gradient.yaml
  model_conf = Munch(
      family="gpt2", n_embd=64, n_layer=3, n_head=heads, seq_op=mixer, causal=True,
      conv_type="short", use_mlps=False, mlp_upfactor=4, mlp_activ="relu", use_resid=True,
      use_bias=True, use_seqop_ln=False, use_final_ln=False, use_mlp_ln=False, train_proj=True,
      train_pos=True, use_softmax_for_attn=True, n_dims=5, n_positions=21, in_dims=6,
      out_dims=5)
  dtype = {"float32": torch.float32, "float64": torch.float64}[dtype_name]
  model = build_model(model_conf).to(dtype=dtype)
  model.train()
  optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=0, eps=1e-16)
  scheduler = AdaptiveStepLR(optimizer, step_size=3000, gamma=0.9, threshold=1e-10,
                             gradient_variance_metric_lambda=0.9,
                             gradient_variance_threshold=0.9, no_increase_length=1e3)
  data = get_data_sampler(data_name="least_squares", n_dims=5, batch_size=batch_size,
                          device="cpu")
  task = get_task_sampler(task_name="explicit_gradient", n_dims=5, batch_size=batch_size,
                          n_points=20, setting="last")()
  out = task.evaluate(data.sample(n_points=20, batch_size=batch_size))
  xs, ys = out["in"].to(dtype=dtype), out["out"].to(dtype=dtype)
  loss_func = task.get_training_metric()
  ema = {"ema_grads": None, "ema_history": None, "ema_decay": 0.98, "ema_lambda": 2.0}

  def step():
    result = official_train.train_step(model, xs, ys, optimizer, scheduler, loss_func,
                                       ema_args=ema)
    ema["ema_grads"], ema["ema_history"] = result["ema_grads"], result["ema_history"]
  return step


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--official", required=True, type=pathlib.Path)
  parser.add_argument("--mixer", choices=("base_conv", "attn"), default="base_conv")
  parser.add_argument("--heads", type=int, default=1, help="attention heads (official: 1)")
  parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--threads", type=int, default=2)
  args = parser.parse_args()
  protocol = official_protocol.take_stdout()   # the official code prints to stdout
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  step = build(args.official, args.mixer, args.heads, args.dtype, args.batch)
  for _ in range(3):
    step()
  official_protocol.serve(step, protocol, torch=torch.__version__, threads=args.threads)


if __name__ == "__main__":
  main()
