# Sourced by the device scripts in bench/ (not run alone): what each one needs on the lent GPU machine.
#   out     the folder the device tool brings back ($OUT there), created
#   gpu     the GPU's short name for file names (h200, h100), from nvidia-smi
#   day     today, YYYY-MM-DD, for file names
#   clocks  prints the SM clock, active throttle reasons, temperature and power: on 2026-11-23 an H200
#           ran the tree 6x slower for ~40 s after a long benchmark (46.6 ms instead of 7.9 ms per step at
#           1M), then recovered; a number taken in such a state must be recognisable
# and puts the checkout on PYTHONPATH, headless (EGL) for any window.
out=${OUT:-/tmp/out}
mkdir -p "$out"
export PYTHONPATH=$PWD:${PYTHONPATH:-}
export NBODY_HEADLESS=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($2)}')
day=$(date +%F)
clocks() { nvidia-smi --query-gpu=clocks.sm,clocks_event_reasons.active,temperature.gpu,power.draw \
    --format=csv,noheader 2>/dev/null | tr -d '\n'; }
