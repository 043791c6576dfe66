#!/usr/bin/env bash
# The GPU reference run, in parts that each fit a short machine lease:
#   bash tools/reference_run.sh <tag> [tests] [bench | bench=SUITE,...] [nb=00,01,...] [param=NAME=VALUE ...]
# Each bench/nb part is one `python -m mahia reference` call: the only writer of data/results/<gpu> and
# figures/<gpu> (full profile; refused on a CPU and on a tree with uncommitted changes under mahia/ or
# notebooks/). A notebook or suite already recorded for this commit (data/results/<gpu>/parts/) is skipped,
# so the same command on the next lease goes on where the last one stopped.
#   MAHIA_COMMIT  the commit the tree is a copy of: `python -m mahia commit` prints it in the checkout. Set it
#                 on a lent machine: it gets a copy of the working tree whose .git may be another commit's
#                 (or none); it says -dirty when mahia/ or notebooks/ had uncommitted changes
#   FORCE=1       run parts already recorded for this commit again (--force)
#   ALLOW_DIRTY=1 run from a tree with uncommitted changes; the records say <sha>-dirty (--allow-dirty)
#   NB_TIMEOUT    seconds per notebook (default 300); BENCH_TIMEOUT seconds per suite (default 400)
#   DEADLINE      seconds for the whole call (default none): a part still running then is stopped (TERM) and
#                 what finished is packed all the same (not the stopped part's records); set it below the
#                 lease's per-command limit, since a command killed from outside packs nothing
#   FIT=1         with DEADLINE: one part at a time, each started only if 1.1 x its last recorded time on this
#                 GPU (parts/<name>.json, any commit; else NB_TIMEOUT or BENCH_TIMEOUT) + 10 s fits in the time left,
#                 else left for the next call; parts recorded for this commit are passed over without a
#                 `mahia reference` call. Give the parts longest first; the same command on each lease then packs it
# Runs in the checkout with the Python that has torch and triton (PYTHON, default python3) and packs what this
# call wrote (records, parts, figures; executed notebooks, reports and logs) into ${OUT:-.}/<tag>.tgz, so a
# machine that is given back loses nothing; unpacking several parts' archives in the checkout merges them.
set -u -o pipefail
tag=$1; shift
args=("$@")  # the parts, for pack (a trap has no arguments)
py=${PYTHON:-python3}
# One spelling of the commit in every part: git's 12 characters, as `python -m mahia commit` prints them (the kernel
# sweep resumes by comparing the commit as a string, so a full sha in one command and a short one in the next would
# measure everything again).
if [[ ${MAHIA_COMMIT:-} =~ ^[0-9a-f]{40}(-dirty)?$ ]]; then export MAHIA_COMMIT=${MAHIA_COMMIT:0:12}${BASH_REMATCH[1]}; fi
export PYTHONUNBUFFERED=1
# Each part is a new Python process. Container images often set PYTHONDONTWRITEBYTECODE=1 and ship torch without
# .pyc files (the lent H200's did, 2026-12-04): every process then compiles torch's sources again, seconds a
# notebook. Here the bytecode is written once, outside the tree, and reused.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-${TMPDIR:-/tmp}/mahia-pycache}
logs=runs/$tag/logs  # runs/ is git-ignored, here and where the archive is unpacked
mkdir -p $logs
stamp=$(mktemp)
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,memory.used --format=csv,noheader
commit=$($py -m mahia commit); echo "commit: $commit"
slug=$($py -c "from mahia.measure.hardware import device_slug; print(device_slug('cuda'))")  # the folders' name
NB_TIMEOUT=${NB_TIMEOUT:-300} BENCH_TIMEOUT=${BENCH_TIMEOUT:-400}  # the defaults, set once for fits() and the calls
params=(); flags=()
[[ ${FORCE:-0} == 1 ]] && flags+=(--force)
[[ ${ALLOW_DIRTY:-0} == 1 ]] && flags+=(--allow-dirty)
for part in "$@"; do [[ $part == param=* ]] && params+=(-p "${part#param=}"); done
rc=0
end=$(( $(date +%s) + ${DEADLINE:-1000000000} ))
left() { local s=$(( end - $(date +%s) )); (( s > 1 )) && echo $s || echo 1; }
pack() {
  # Only the files this call wrote: another lease's parts in the same folders are not overwritten on unpacking.
  # data/fla/<gpu>.json is fla's autotuned configs, written once per GPU model by the meta suite (minutes of
  # tuning the next run skips: 219 s on an H100, 2026-12-05): it comes back to be committed.
  # A part's files (records, part file, executed notebook, figures) are named after it, and two calls may run at
  # once on one machine, one GPU each (CUDA_VISIBLE_DEVICES): the other call's files are newer than this call's
  # start too, and a half-written CSV of a notebook still running there would overwrite its finished copy when
  # the archives are unpacked. So a part's files go only into the archive of the call that ran it, and only when
  # it finished (its parts/<name>.json is this call's): a part stopped by DEADLINE or failed leaves rows appended to
  # its CSV and some figures, which unpacked would sit beside another commit's (its log stays in runs/<tag>).
  local owned name finished=""
  if owned=$($py -c "$owned_py" "${args[@]}" 2>"$stamp.err"); then
    for name in $owned; do
      if [[ data/results/$slug/parts/$name.json -nt $stamp ]]; then finished+=" $name"
      else echo "pack: $name did not finish in this call: its records and figures are left out" >&2; fi
    done
    owned=$finished
    find data/results/$slug figures/$slug data/fla -type f -newer "$stamp" 2>/dev/null \
      | awk -v owned="$owned" 'BEGIN { n = split(owned, own, " ") }
          { f = $0; sub(/.*\//, "", f); keep = f !~ /^([0-9][0-9]_|bench_)/
            for (i = 1; i <= n && !keep; i++) keep = index(f, own[i]) == 1
            if (keep) print }' > "$stamp.list"
  else  # the parts' names unknown: everything this call's folders gained, as before
    echo "pack: could not name this call's parts ($(tail -1 "$stamp.err")); packing every newer file" >&2
    find data/results/$slug figures/$slug data/fla -type f -newer "$stamp" > "$stamp.list" 2>/dev/null
  fi
  tar czf "${OUT:-.}/$tag.tgz" -T "$stamp.list" runs/$tag 2>/dev/null
  rm -f "$stamp" "$stamp.list" "$stamp.err"
  echo "packed ${OUT:-.}/$tag.tgz"
}
# The names of the parts the arguments select (notebook stems, bench_<suite>): the prefixes of their files.
owned_py='
import sys
from mahia.bench import SUITES
from mahia.runner import select_notebooks
names = []
for a in sys.argv[1:]:
    if a.startswith("nb="):
        names += [p.stem for p in select_notebooks(a[3:])]
    elif a == "bench":
        names += [f"bench_{s}" for s in SUITES]
    elif a.startswith("bench="):
        names += [f"bench_{s.strip()}" for s in a[6:].split(",")]
print(" ".join(names))
'
# FIT=1: whether part $1 (nb=<stem> or bench=<suite>) starts now: 0 yes; 1 not enough time left or recorded for this commit.
fits() {
  local n=${1#*=} guess=$NB_TIMEOUT s
  [[ $1 == bench=* ]] && n=bench_$n guess=$BENCH_TIMEOUT
  s=$($py -c 'import json, sys; d = json.load(open(sys.argv[1])); done = (d["status"], d["commit"], d["profile"]) == ("ok", sys.argv[2], "full")
print("done" if done and sys.argv[3] != "1" else round(d["seconds"]))' "data/results/$slug/parts/$n.json" "$commit" "${FORCE:-0}" 2>/dev/null) || s=$guess
  if [[ $s == done ]]; then echo "$n: recorded for $commit" >&2; return 1; fi
  # + 10 s: a part's process and kernel start, 5-6 s outside its recorded seconds (H100, 2026-12-06), where two
  # parts started within 1.1 x of the deadline were stopped there, 77 s of device time for nothing
  (( s * 11 / 10 + 10 < $(left) )) && return 0
  echo "$n: $s s expected, $(left) s left: left for the next call" >&2; return 1
}
if [[ ${FIT:-0} == 1 ]]; then  # each part alone, if it fits
  fitted=()
  for part in "$@"; do
    case $part in
      nb=*|bench|bench=*) for n in $($py -c "$owned_py" "$part"); do [[ $n == bench_* ]] && fitted+=("bench=${n#bench_}") || fitted+=("nb=$n"); done ;;
      *) fitted+=("$part") ;;
    esac
  done
  set -- "${fitted[@]}"
fi
trap pack EXIT
for part in "$@"; do
  name=${part//[^A-Za-z0-9]/_}; out=runs/$tag/$name
  if [[ ${FIT:-0} == 1 && ( $part == nb=* || $part == bench=* ) ]] && ! fits "$part"; then continue; fi
  case $part in
    tests) timeout 300 $py -m pytest -m "not notebooks" -q -p no:cacheprovider 2>&1 | tail -15 | tee $logs/pytest.log ;;
    bench) timeout -s TERM $(left) $py -m mahia reference --bench all --timeout $BENCH_TIMEOUT --out $out \
             --no-progress "${flags[@]}" 2>&1 | tee $logs/$name.log | tail -40 || rc=1 ;;
    bench=*) timeout -s TERM $(left) $py -m mahia reference --bench "${part#bench=}" --timeout $BENCH_TIMEOUT \
               --out $out --no-progress "${flags[@]}" 2>&1 | tee $logs/$name.log | tail -40 || rc=1 ;;
    nb=*) timeout -s TERM $(left) $py -m mahia reference --notebooks "${part#nb=}" --timeout $NB_TIMEOUT \
            --out $out --no-progress "${flags[@]}" "${params[@]}" 2>&1 | tee $logs/$name.log | tail -20 || rc=1 ;;
    param=*) ;;
    *) echo "unknown part: $part" >&2; exit 2 ;;
  esac
done
exit $rc
