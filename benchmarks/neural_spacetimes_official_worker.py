"""Times the official Neural SpaceTimes training (haitzsaezdeocariz/NeuralSpaceTimesICLR2025).

Started by `neural_spacetimes_speed.py --official DIR` with the Python of an environment that has
the official code's dependencies (`pip install torch==2.13.0 networkx matplotlib pydot`; that torch
is a CPU build) and Graphviz's `dot` on the PATH (its layout draws the graph); not a jaxlab
dependency and never imported by jaxlab. It draws the reference graph with the official
`dag_generation.generate_data_final_dag` (synthetic type 1, 50 nodes, p = 0.9, seed 123) and
times the official `dag_train_functions.train` of `dag_embedding/train_dag.py`: NST with space and
time dimension 2, its default depths, AdamW lr 1e-4, clipping 0.5, batch 2,500 (every node pair of
the 50-node graph in one step: full batch). One timed unit is one call of `train` for 100 epochs
(the model is built afresh in each call, a negligible part of it).

Changes needed to run it, and nothing else: `display_epoch` is set past the last epoch (no
printing), torch uses `--threads` threads (2: this machine's cores), and the official code's
prints go to stderr.

Protocol (one JSON object per line on stdout): prints {"ready": ...} after a warm-up call, then
answers each stdin line `window SECONDS` with {"steps": n, "seconds": t}, n being whole 100-epoch
calls lasting at least SECONDS; `quit` ends it.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import official_protocol  # benchmarks/, the script's own directory

EPOCHS_PER_CALL = 100


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--official", required=True, type=pathlib.Path)
  parser.add_argument("--model", choices=("nst", "min"), default="nst")
  parser.add_argument("--threads", type=int, default=2)
  args = parser.parse_args()
  protocol = official_protocol.take_stdout()   # the official code prints to stdout
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(args.threads)
  sys.path.insert(0, str(args.official / "dag_embedding"))
  import dag_generation  # pylint: disable=g-import-not-at-top
  import dag_train_functions  # pylint: disable=g-import-not-at-top

  data_x, data_y, *_ = dag_generation.generate_data_final_dag(50, distance_type="type1",
                                                               seed=123, p=0.9)
  torch.manual_seed(123)

  def call():
    dag_train_functions.train(data_x, data_y, model_type=args.model, batch_size=2500,
                              num_epochs=EPOCHS_PER_CALL, max_grad_norm=0.5, device="cpu",
                              display_epoch=EPOCHS_PER_CALL + 1, space_dim=2, time_dim=2)
  call()
  official_protocol.serve(call, protocol, torch=torch.__version__, threads=args.threads,
                          pairs=int(data_x.shape[0]))


if __name__ == "__main__":
  main()
