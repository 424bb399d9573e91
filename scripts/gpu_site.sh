# Sourced by the scripts that run on the lent GPU machine (no package index
# there): installs the wheels carried in .whl/ (scripts/fetch_gpu_wheels.sh)
# into /tmp/site, puts them on PYTHONPATH, and records the GPU in $OUT/gpu.txt.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt"
