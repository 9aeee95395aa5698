"""precision_ls: learning high-precision least-squares algorithms with polynomial sequence models.

Liu, Grogan, Dugan, Rao, Arora, Rudra, Ré. ICLR 2025. arXiv 2503.12295.

  tasks       in-context tasks (gradient, k-step GD, end-to-end LS, primitives)
  recipe      Adam eps 1e-16, gradient-EMA filter, step / adaptive LR, skip and clip
  handset     BaseConv weights that compute one exact GD step
  training    model + loss + update as an `Experiment` for the shared train loop
  evaluation  one-step gradient error; iterating a gradient module as an optimiser
  reproduction  the quick reproduction: every variant, the hand-set model, claims, plots
"""
from jaxlab.methods.precision_ls import evaluation
from jaxlab.methods.precision_ls import handset
from jaxlab.methods.precision_ls import recipe
from jaxlab.methods.precision_ls import tasks
from jaxlab.methods.precision_ls import training
from jaxlab.methods.precision_ls.training import make_experiment

__all__ = ["evaluation", "handset", "recipe", "tasks", "training", "make_experiment"]
