#!/usr/bin/env bash
# The GPU reference run, in parts that each fit a short machine lease:
#   bash tools/reference_run.sh <tag> [tests] [bench | bench=SUITE,...] [nb=00,01,...] [param=NAME=VALUE ...]
# NB_TIMEOUT (seconds per notebook, default 300) raises the runner's limit for a long notebook.
# Runs in the checkout with the Python that has torch and triton (PYTHON, default python3), writes
# records into data/results/<gpu> and figures/<gpu>, and packs them with the run's notebooks, report and
# logs into ${OUT:-.}/<tag>.tgz, so a machine that is given back loses nothing.
set -u
tag=$1; shift
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p logs
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,memory.used --format=csv,noheader
params=()
for part in "$@"; do [[ $part == param=* ]] && params+=(-p "${part#param=}"); done
for part in "$@"; do
  case $part in
    tests) timeout 300 $py -m pytest -m "not notebooks" -q -p no:cacheprovider 2>&1 | tail -15 | tee logs/$tag-pytest.log ;;
    bench) timeout 400 $py -m mahia.bench kernels moe meta hybrid 2>&1 | tee logs/$tag-bench.log | tail -40 ;;
    bench=*) timeout 400 $py -m mahia.bench $(tr , ' ' <<< "${part#bench=}") 2>&1 | tee logs/$tag-bench.log | tail -40 ;;
    nb=*) $py -m mahia run --notebooks "${part#nb=}" --profile full --device cuda --timeout ${NB_TIMEOUT:-300} \
            --out runs/$tag --no-progress "${params[@]}" 2>&1 | tail -14 ;;
    param=*) ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
slug=$($py -c "from mahia.measure.hardware import device_slug; print(device_slug('cuda'))")
tar czf "${OUT:-.}/$tag.tgz" data/results/$slug figures/$slug runs/$tag logs 2>/dev/null
echo "packed ${OUT:-.}/$tag.tgz"
