"""House rules that a grep can check: no pmap-era APIs, no backend calls at import time."""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
BANNED = re.compile(r"jax\.pmap|jax_utils\.replicate|device_put_replicated|"
                    r"experimental\.shard_map|experimental import shard_map")


def python_files():
  for folder in ("jaxlab", "experiments", "configs", "benchmarks"):
    yield from (ROOT / folder).rglob("*.py")


def test_no_pmap_era_apis():
  offenders = [f"{path.relative_to(ROOT)}:{i}" for path in python_files()
               for i, line in enumerate(path.read_text().splitlines(), 1)
               if BANNED.search(line)]
  assert not offenders, offenders


def test_importing_jaxlab_does_not_start_a_backend():
  code = ("import jaxlab.core.train_loop, jaxlab.core.cli, jaxlab.methods.precision_ls, "
          "jaxlab.zoo.sequence, jaxlab.data.least_squares\n"
          "from jax._src import xla_bridge\n"
          "assert not xla_bridge.backends_are_initialized(), 'a backend started at import'\n")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_configs_import_no_jax():
  code = ("import sys; from jaxlab.core import config\n"
          "config.load_config('configs/precision_ls.py', 'smoke')\n"
          "assert 'jax' not in sys.modules, 'loading a config imported jax'\n")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_every_folder_of_package_data_is_a_package():
  """setuptools warns ("Package ... is absent from the `packages` configuration") for each data
  folder its package finder does not list: every folder under jaxlab/ that ships files must be a
  package that setup.cfg's finder finds (checked by hand too: a fresh `pip install -e .` with
  setuptools 84 prints no such warning)."""
  import configparser
  import setuptools

  setup = configparser.ConfigParser()
  setup.read(ROOT / "setup.cfg")
  finder = setup["options"]["packages"].strip()
  include = setup["options.packages.find"]["include"].split()
  find = {"find_namespace:": setuptools.find_namespace_packages,
          "find:": setuptools.find_packages}[finder]
  packages = set(find(where=str(ROOT), include=include))
  shipped = {path.parent.relative_to(ROOT).as_posix().replace("/", ".")
             for path in (ROOT / "jaxlab").rglob("*")
             if path.is_file() and path.suffix not in (".py", ".pyc")
             and "__pycache__" not in path.parts}
  assert shipped, "no package data found"
  assert shipped <= packages, sorted(shipped - packages)
