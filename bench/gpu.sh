#!/usr/bin/env bash
# The GPU checks in one go, on a machine with an NVIDIA GPU and a CUDA build of torch
# (docs/gpu.md): the test suite with every learner on CUDA, `make run`'s job, the speed
# and token-stream benchmarks, and a profile of a next-token step (bench/profile_step.py),
# each under a time limit. Logs and tables land in OUT_DIR; docs/benchmarks.md ("On a
# GPU") holds the last results and the command that made them.
#
#   bash bench/gpu.sh OUT_DIR [DATA_DIR]
#
# DATA_DIR is the benchmarks' --data (default: ../shared/data beside the repository).
# PYTHON picks the interpreter (default python3); JOBS the test processes when pytest-xdist
# is installed (default 12; without it the suite runs in one process). The step limits add up
# to under 10 minutes, so the whole check fits one short lease of a GPU machine. The benchmarks print
# tables only (--dry-run): a GPU's figures go to their own section of docs/benchmarks.md,
# never over the CPU tables.
set -uo pipefail
out=${1:?usage: bash bench/gpu.sh OUT_DIR [DATA_DIR]}
# both made absolute before the cd below, so relative ones mean the caller's directory
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
data=()
if [ -n "${2:-}" ]; then
    data=(--data "$(cd "$2" && pwd)") || exit 1
fi
py=${PYTHON:-python3}
cd "$(dirname "$0")/.."

"$py" -c '
import torch
assert torch.cuda.is_available(), "torch sees no CUDA device: these checks are for a GPU (docs/gpu.md)"
print("torch", torch.__version__, "CUDA", torch.version.cuda, "on", torch.cuda.get_device_name())
' | tee "$out/summary.txt" || exit 1

# step NAME SECONDS COMMAND...: runs COMMAND into OUT_DIR/NAME.log, its exit status and time
# into the summary (124: stopped at its limit).
step() {
    local name=$1 limit=$2 started=$SECONDS rc
    shift 2
    PYTHONUNBUFFERED=1 timeout "$limit" "$@" > "$out/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc in $((SECONDS - started)) s" | tee -a "$out/summary.txt"
}

parallel=()
"$py" -c "import xdist" 2>/dev/null && parallel=(-n "${JOBS:-12}")
step tests "${TESTS_LIMIT:-180}" "$py" -m pytest -q -p no:cacheprovider -rfE --tb=short --durations=10 "${parallel[@]}"
step demo 40 "$py" -m streamlearn.demo
step tokens 150 "$py" bench/tokens.py "${data[@]}" --parts speed --dry-run
step profile 60 "$py" bench/profile_step.py "${data[@]}" --task next-token --warm 60 --steps 40
step speed 130 "$py" bench/speed.py "${data[@]}" --passes 1 --records 2000 --dry-run  # whole streams: over 3 min
grep -h "passed\|failed" "$out/tests.log" | tail -1 | tee -a "$out/summary.txt"
