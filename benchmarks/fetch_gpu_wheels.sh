#!/usr/bin/env bash
# Downloads, into .whl/ (ignored by git), the wheels that benchmarks/gpu_check.sh installs on a
# lent GPU machine. That machine has no network and its own Python 3.12 with a CUDA build of JAX,
# flax, optax, orbax-checkpoint, chex, numpy, scipy, scikit-learn, matplotlib, absl-py, etils,
# tqdm, protobuf, pyarrow, psutil, cloudpickle, wrapt and PyYAML (the device tool's KINDS.md
# lists its packages); what else jaxlab imports travels as these wheels.
#
#   bash benchmarks/fetch_gpu_wheels.sh          # then carry .whl to the device machine
#
# The versions are the ones this repository's .venv resolves from setup.cfg (tensorflow-datasets' and
# grain's own needs included, found from their Requires-Dist). About 11 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${WHEEL_DIR:-.whl}
PYTHON=${PYTHON:-python3}

# name==version, one per wheel; everything else jaxlab needs is on the device image.
PACKAGES=(
  tensorflow-datasets==4.9.10 array-record==0.8.6 grain==0.2.18 ml-collections==1.1.0
  importlib_resources==7.1.0
  # tensorflow-datasets' needs
  dm-tree==0.1.10 immutabledict==4.3.1 simple-parsing==0.1.9 docstring_parser==0.18.0
  tensorflow-metadata==1.21.0 googleapis-common-protos==1.76.0 termcolor==3.3.0 toml==0.10.2
  # grain's
  portpicker==1.6.0
)
# Published only as a source distribution: built here into a pure-Python wheel.
SOURCE_ONLY=(promise==2.3)

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d "$DEST" "${PACKAGES[@]}"
"$PYTHON" -m pip wheel --quiet --no-deps -w "$DEST" "${SOURCE_ONLY[@]}"

count=$(ls "$DEST"/*.whl | wc -l)
expected=$(( ${#PACKAGES[@]} + ${#SOURCE_ONLY[@]} ))
if [[ "$count" -ne "$expected" ]]; then
  echo "fetch_gpu_wheels: expected $expected wheels in $DEST, found $count" >&2
  exit 1
fi
echo "fetch_gpu_wheels: $count wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
