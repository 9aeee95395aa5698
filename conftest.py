"""Test-only JAX setup. It runs before any test module imports JAX.

8 simulated CPU devices (so data-parallel code is exercised), strict rank promotion (silent
broadcasting bugs fail), fewer XLA optimisations (compiles faster), a persistent compile cache,
and a fresh cache of pretrained priors per test session (never the user's ~/.cache/jaxlab).
Library code never sets these.
"""
import os
import tempfile

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAXLAB_SMOKE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAXLAB_CACHE", tempfile.mkdtemp(prefix="jaxlab-test-cache-"))

import jax  # pylint: disable=g-import-not-at-top

from jaxlab.core import host  # pylint: disable=g-import-not-at-top

host.tune_allocator()

jax.config.update("jax_disable_most_optimizations", True)
jax.config.update(
    "jax_compilation_cache_dir",
    os.path.join(os.path.expanduser("~"), ".cache", "jaxlab-jax-tests"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
