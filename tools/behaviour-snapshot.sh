#!/usr/bin/env bash
# What a refactor must not change, written to files: every packaged profile's dry run (text and --json), the
# ExLlamaV3 dry runs and plans on the packaged rigs, the vLLM plans on the rigs and on the recipe's host flags,
# and the CLI reference. Run it on two source trees and diff the folders:
#
#   git worktree add /tmp/before <commit>
#   tools/behaviour-snapshot.sh /tmp/before/python/src /tmp/snap-before
#   tools/behaviour-snapshot.sh python/src /tmp/snap-after
#   diff -r /tmp/snap-before /tmp/snap-after
#
# SRC is put first on PYTHONPATH (the venv's glm53 is editable, so SRC wins); the source path is replaced by
# "SRC" in the output, so two trees compare. Run the two one after the other, not at once: the dry runs note
# whether vLLM's flag check came from its cache, which the first run fills. Needs .venv (make setup).
set -u
src=$(cd "${1:?usage: behaviour-snapshot.sh SRC OUT}" && pwd); out=${2:?usage: behaviour-snapshot.sh SRC OUT}
root=$(cd "$(dirname "$0")/.." && pwd); python=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"; out=$(cd "$out" && pwd)
g() { (cd /tmp && PYTHONPATH=$src COLUMNS=100 "$python" -c \
  "import sys; from glm53.cli.main import main; sys.argv[0] = 'glm53'; sys.exit(main())" "$@"); }
snap() { local name=$1; shift; g "$@" >"$out/$name" 2>&1; echo "rc=$?" >>"$out/$name"; }
for p in agent-256k cpu-tiny exl3-1gpu exl3-2x3090 prefill-256k; do
  snap "dry-$p.txt" serve --profile "$p" --dry-run
  snap "dry-$p.json" serve --profile "$p" --dry-run --json
done
for p in exl3-1gpu exl3-2x3090; do
  for r in recipe-2x3090 one-3090; do
    snap "dry-$p-$r.txt" serve --profile "$p" --rig "$r" --dry-run
    snap "plan-$p-$r.txt" plan host --profile "$p" --rig "$r"
    snap "plan-$p-$r.json" plan host --profile "$p" --rig "$r" --json
    snap "plan-$p-$r.env" plan host --profile "$p" --rig "$r" --env
  done
done
for r in recipe-2x3090 one-3090; do
  snap "plan-$r.txt" plan host --rig "$r"
  snap "plan-$r.json" plan host --rig "$r" --json
  snap "plan-$r.env" plan host --rig "$r" --env
done
snap plan-flags.txt plan host --gpu-memory 24GiB,24GiB --ram 128GiB --cpus 32cx2t/8
snap plan-flags.json plan host --gpu-memory 24GiB,24GiB --ram 128GiB --cpus 32cx2t/8 --json
(cd /tmp && PYTHONPATH=$src "$python" -c "import sys; from glm53.cli.main import app; from glm53.cli.reference import render_reference; sys.stdout.write(render_reference(app))") \
  >"$out/cli.md" 2>&1 || echo "rc=$?" >>"$out/cli.md"
sed -i "s#$src#SRC#g" "$out"/*
