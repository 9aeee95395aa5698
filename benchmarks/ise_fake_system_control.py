"""ise: is the forged system rule hard because of the attack, or because of its conversations?

  python benchmarks/ise_fake_system_control.py [--preset quick|long] [--workdir DIR]

The `fake_system` set holds only conversations whose answer has a masked digit (the forged
`[SYS] MASK NONE` would otherwise change nothing), a harder subset than the others. This scores
the trained replicas of a finished run (`workdirs/ise-<preset>` by default) on those same
conversations with the injected tokens removed, next to the attacked ones, and writes
`results/ablations/ise_fake_system_control_<preset>.json` (accuracy per variant, mean over
seeds). The difference is what the attack itself costs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.core import results  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ise import evaluation  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ise import tasks  # pylint: disable=g-import-not-at-top

ROOT = pathlib.Path(__file__).resolve().parents[1]


def without_injection(conversation: tasks.Conversation) -> tasks.Conversation:
  """The same conversation with the injected tokens taken out of its last data message."""
  *earlier, last = conversation.messages
  tokens = last["content"].split()
  kept = [t for i, t in enumerate(tokens) if i not in set(conversation.injected)]
  return dataclasses.replace(conversation,
                             messages=(*earlier, {"role": "data", "content": " ".join(kept)}),
                             attack=None, attacker_target=None, injected=())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", default="quick", choices=("smoke", "quick", "long"))
  parser.add_argument("--workdir", default=None)
  args = parser.parse_args()
  config = config_lib.load_config(ROOT / "configs" / "ise.py", args.preset)
  workdir = args.workdir or str(ROOT / "workdirs" / f"ise-{args.preset}" / "train")
  sets = evaluation.suite(config.data.eval_seed, config.data.eval_size, config.data.max_turns)
  attacked = sets["fake_system"]
  stripped = [without_injection(c) for c in attacked]
  if any(c.target != s.target for c, s in zip(attacked, stripped)):
    raise AssertionError("removing the injection changed a target")
  found = {
      "attacked": evaluation.evaluate_examples(workdir, [c.as_example() for c in attacked]),
      "injection_removed": evaluation.evaluate_examples(workdir,
                                                        [c.as_example() for c in stripped]),
  }
  payload = {"preset": args.preset, "commit": results.git_commit(), "workdir": workdir,
             "conversations": len(attacked), "accuracy": found}
  out = ROOT / "results" / "ablations" / f"ise_fake_system_control_{args.preset}.json"
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(payload, indent=1) + "\n")
  for name, by_variant in found.items():
    print(f"{name:18s}", "  ".join(f"{v}: {a['adversarial']:.3f}" for v, a in by_variant.items()))
  print("wrote", out.relative_to(ROOT))


if __name__ == "__main__":
  main()
