#!/usr/bin/env bash
# The GPU check in one call on a rented NVIDIA machine without internet (docs/performance.md):
# bench/bench_gpu.py on the full config (every stage's step time, measured peak memory beside
# the estimate, stage 1 fed by the DataLoader from a synthetic store) and `vcloud predict` of
# stage 2, as one JSON object in $OUT/bench_gpu.json (or ./bench_gpu.json).
#
#   bash bench/gpu-check.sh wheels   # here, with internet: vcloud's packages the GPU image lacks -> .whl/
#   bash bench/gpu-check.sh          # there, from the repository root (.whl/ carried along)
#
# The machine's image has python3 with torch (and numpy, scipy, pandas, pyyaml, einops, ...);
# what vcloud needs beyond that travels as cp312 manylinux wheels in .whl/ (git-ignored via
# .git/info/exclude), installed into /tmp/site without an index. The wheel list below has not
# yet been tried on such a machine: a missing module shows as an ImportError in the first step.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(zarr numcodecs donfig crc32c google-crc32c indexed_gzip s2cloudless lightgbm rasterio affine cligj
        click-plugins rio-cogeo morecantile pydantic pydantic-core annotated-types typing-inspection pyproj
        jsonschema jsonschema-specifications referencing rpds-py)

if [[ "${1:-}" == wheels ]]; then
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl "${WHEELS[@]}"
    du -sh .whl   # the working tree that travels is limited to 64 MiB
    exit 0
fi

out="${OUT:-.}"
started=$SECONDS
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
fi
export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
python3 -c "import torch, vcloud.train.stages, vcloud.apply.run; print('torch', torch.__version__, torch.cuda.get_device_name())"
# A synthetic store in the raw layout, made and prepared by vcloud's own tools (2 locations, 30 dates, 256 px).
work=/tmp/vcloud-gpu-check
python3 - "$work" <<'EOF'
import sys
from pathlib import Path

sys.path.insert(0, "bench")
from common import ROI, make_raw
from vcloud.data.prepare import prepare_roi

work = Path(sys.argv[1])
store = work / "store.zarr"
if not store.is_dir():
    prepare_roi(raw=make_raw(work, patches=2, times=30, size=256), roi=ROI, out=store, times=30, size=256)
EOF
# Full config: T=16, 256 px, each stage's batch; 5 timed steps after 2 warm-ups a stage.
python3 bench/bench_gpu.py --config config/models/full.yaml --steps 5 --warmup 2 \
    --store "$work/store.zarr" --feed-steps 20 \
    --predict --predict-patches 2 --predict-dates 30 --predict-size 256 --predict-batch 8 --workdir "$work" \
    | tee "$out/bench_gpu.json"
echo "gpu-check: $((SECONDS - started)) s" >&2
