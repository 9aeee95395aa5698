"""Test-only JAX setup. It runs before any test module imports JAX.

8 simulated CPU devices (so data-parallel code is exercised), strict rank promotion (silent
broadcasting bugs fail), fewer XLA optimisations (compiles faster), a persistent compile cache,
and a fresh cache of pretrained priors per test session (never the user's ~/.cache/jaxlab).
Library code never sets these.
"""
import os
import tempfile

os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAXLAB_SMOKE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAXLAB_CACHE", tempfile.mkdtemp(prefix="jaxlab-test-cache-"))

# Set through the environment, not jax.config, so that the notebook kernels nbmake starts inherit
# them too (a kernel is a fresh process that never imports this file).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(os.path.expanduser("~"), ".cache", "jaxlab-jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# glibc reads these at a process's start: the kernels get what `host.tune_allocator` gives pytest.
os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(32 * 1024 * 1024))
os.environ.setdefault("MALLOC_TRIM_THRESHOLD_", str(1 << 30))
os.environ.setdefault("MALLOC_TOP_PAD_", str(64 << 20))

import jax  # pylint: disable=g-import-not-at-top,unused-import

from jaxlab.core import host  # pylint: disable=g-import-not-at-top

host.tune_allocator()

# Through jax.config, not the environment: the notebook kernels run on one CPU device, as a
# laptop user's notebook does (8 simulated devices on 2 cores cost them about 30%); the 8-device
# paths are the unit and smoke tests' job. JAX_NUM_CPU_DEVICES in the environment still wins.
jax.config.update("jax_num_cpu_devices", int(os.environ.get("JAX_NUM_CPU_DEVICES", "8")))
