#!/usr/bin/env bash
# The GPU check in one call on a rented NVIDIA machine without internet (docs/performance.md):
# bench/bench_gpu.py on the full config, one phase a JSON file in $OUT (or ./gpu-check/), so that a
# phase cut off at its time limit keeps the others, and their logs in gpu-check.log:
#   env.json      the GPU, torch, and vcloud's own checks there (bf16 allowed, nvidia-smi logged)
#   stages.json   every stage's step time and measured peak memory beside the estimate
#   feed.json     stage 1 trained through the DataLoader from a prepared store (is the GPU kept fed?)
#   prepare.json  the store both of them read, made and prepared by vcloud's own tools
#   predict.json  `vcloud predict` of stage 2 on that store's ROI: km2/s and peak memory
#
#   bash bench/gpu-check.sh site     # here, with internet: vcloud's packages the GPU image lacks
#                                    #   -> .whl/site-cp312.tar.xz (git-ignored via .git/info/exclude)
#   bash bench/gpu-check.sh          # there, from the repository root (.whl/ carried along)
#
# The machine's image has python3 3.12 with torch, numpy, scipy, pandas, pyyaml, tifffile, xarray,
# opencv; the rest travels as one archive: the cp312 manylinux wheels installed here into a target
# folder (pip --target --platform), debug sections stripped from the extension modules (numcodecs
# ships them: 35 MB), xz-compressed (81 MB of wheels -> 47 MB; the tree that travels is limited to
# 64 MiB). The names are pinned to the versions the tests run on and come from an import trace of
# this script's own run on the CPU (sys.modules mapped to distributions, against the image's
# package list): s2cloudless imports sentinelhub, which brings boto3, shapely, utm and the rest.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=(zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 s2cloudless==1.7.3 lightgbm==4.7.0
        rasterio==1.4.4 affine==3.0.1 cligj==0.7.2 click-plugins==1.1.1.2 rio-cogeo==7.0.4 morecantile==7.1.0
        pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 pyproj==3.7.2
        sentinelhub==3.12.0 aenum==3.1.17 blinker==1.9.0 boto3==1.43.11 botocore==1.43.11 s3transfer==0.17.0
        jmespath==1.1.0 dataclasses-json==0.6.7 marshmallow==3.26.2 oauthlib==4.0.1 requests-oauthlib==2.0.0
        pysocks==1.7.1 shapely==2.2.0 tomli==2.5.0 tomli-w==1.2.0 utm==0.9.0 wcwidth==0.7.0)

if [[ "${1:-}" == site ]]; then
    set -e
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
    site=$(mktemp -d)
    python3 -m pip install -q --no-deps --no-compile --only-binary=:all: --target "$site" \
        --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        "${WHEELS[@]}"
    find "$site" -name '*.so*' -type f -exec strip --strip-debug {} +
    mkdir -p .whl
    tar -C "$site" -cf - . | xz -9e -T0 >.whl/site-cp312.tar.xz
    rm -rf "$site"
    du -sh .whl
    exit 0
fi

out="${OUT:-gpu-check}"
mkdir -p "$out"
started=$SECONDS
if [[ -f .whl/site-cp312.tar.xz ]]; then
    mkdir -p /tmp/site && tar -C /tmp/site -xJf .whl/site-cp312.tar.xz
fi
export PYTHONPATH="/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
echo "gpu-check: site ready after $((SECONDS - started)) s" >&2

phase() { # phase NAME LIMIT_S COMMAND...: one JSON file; a failure or a timeout leaves the others
    local name=$1 limit=$2 t=$SECONDS
    shift 2
    timeout "$limit" "$@" >"$out/$name.json" 2>"/tmp/gpu-check-$name.log"
    echo "gpu-check: $name exit $? in $((SECONDS - t)) s" >&2
    tail -n 4 "/tmp/gpu-check-$name.log" >&2
    { echo "== $name"; cat "/tmp/gpu-check-$name.log"; } >>"$out/gpu-check.log" # files back: 8 at most
}

phase env 120 python3 -c '
import json, logging, subprocess, sys
import torch
from vcloud.environment import check_bf16, log_gpu_state
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
check_bf16(True, "cuda", where="gpu-check")  # raises below compute capability 8.0
log_gpu_state(0)  # nvidia-smi through the rank-0 report of every training job
query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
print(json.dumps({
    "gpu": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
    "nvidia_smi": subprocess.run(query, capture_output=True, text=True).stdout.strip(),
    "torch": torch.__version__, "cuda": torch.version.cuda, "bf16_allowed": True,
}, indent=2))
'

# A synthetic ROI in the raw layout, made and prepared by vcloud's own tools (2 locations, 30 dates,
# 256 px), where bench_predict looks for it, so that feed and predict share one store.
work=/tmp/vcloud-gpu-check
store="$work/predict_2x30x256/store.zarr"
phase prepare 180 python3 -c '
import json, sys, time
from pathlib import Path
sys.path.insert(0, "bench")
from common import ROI, make_raw
from vcloud.data.prepare import prepare_roi
work, store = Path(sys.argv[1]), Path(sys.argv[2])
start = time.perf_counter()
store.parent.mkdir(parents=True, exist_ok=True)
prepare_roi(raw=make_raw(work, patches=2, times=30, size=256), roi=ROI, out=store, times=30, size=256)
print(json.dumps({"store": str(store), "prepare_s": round(time.perf_counter() - start, 1)}))
' "$work" "$store"

# Full config: T=16, 256 px, each stage's batch; 5 timed steps after 2 warm-ups a stage.
phase stages 240 python3 bench/bench_gpu.py --config config/models/full.yaml --steps 5 --warmup 2
phase feed 120 python3 bench/bench_gpu.py --config config/models/full.yaml --skip-stages --store "$store" \
    --feed-steps 20
phase predict 180 python3 bench/bench_gpu.py --config config/models/full.yaml --skip-stages --predict \
    --predict-patches 2 --predict-dates 30 --predict-size 256 --predict-batch 8 --workdir "$work"
echo "gpu-check: $((SECONDS - started)) s" >&2
