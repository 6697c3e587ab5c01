# Sourced by the GPU scripts of benchmarks/ (gpu_final.sh, variants_gpu.sh, flash_attn_cute/*.sh)
# after they set DEFAULT_STEPS (and DEFAULT_OUT, else gpu_out): the step selection, the output
# folder, the interpreter and the helpers every one of them runs the same way.
STEPS=",${STEPS:-$DEFAULT_STEPS},"
step() { [[ $STEPS == *",$1,"* ]]; }
export PYTHONUNBUFFERED=1
OUT=${OUT:-${DEFAULT_OUT:-gpu_out}}; mkdir -p "$OUT"
PY=${PY:-python3}

# FA4 reads these when it is imported: every process of the script shares one disk cache, so
# kernels compiled by one step are loaded by the later ones. $1: the cache folder unless
# FA4_CACHE_DIR names one.
fa4_disk_cache() {
  export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1
  export FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=${FA4_CACHE_DIR:-$1}
}

# Installs the arguments (-e PATH ...) editable, offline and without dependencies.
install_editable() {
  $PY -m pip install -q --no-index --no-deps --no-build-isolation "$@" 2>&1 | grep -v WARN | tail -3
}

# Sets the array `workers` to pytest-xdist's arguments for $1 workers (WORKERS overrides), or to
# nothing where pytest-xdist is not installed.
xdist_workers() {
  workers=()
  if $PY -c "import xdist" 2>/dev/null; then workers=(-n "${WORKERS:-$1}"); fi
}

# Runs pytest capped at $1 seconds, its output into the file $2; the rest are pytest's arguments.
# SIGINT at the cap: pytest still prints its summary of what ran. Returns pytest's status.
# A parallel run (-n) gets OMP_NUM_THREADS=1 unless it is set: each worker, and each process a
# test starts, would otherwise run PyTorch's CPU operations on one thread per core, many times
# more threads than cores.
capped_pytest() {
  local cap=$1 out=$2; shift 2
  local threads=()
  if [[ -z ${OMP_NUM_THREADS:-} && " $* " == *" -n "* ]]; then threads=(OMP_NUM_THREADS=1); fi
  env "${threads[@]}" timeout -s INT -k 15 "$cap" $PY -m pytest -q -p no:cacheprovider "$@" \
    > "$out" 2>&1
}
