#!/usr/bin/env bash
# Packs extensions built on another machine for tools/exl3-gpu-run.sh's stage `prebuilt`, which unpacks them on the
# GPU machine instead of building there (the builds take minutes of its time: 1.4.6's about 4, 1.6.5's about 8.5).
#
#   tools/pack-prebuilt.sh OUT SITE_146 SITE_165 PYTHON
#
# SITE_146 holds exllamav3_ext and glm53_expert_cache built by pkgs/exllamav3/build_ext.py from ExLlamaV3 1.4.6's
# wheel and pkgs/exllamav3/expert-cache; SITE_165 exllamav3_ext from 1.6.5's ("-": none); PYTHON is the interpreter (and
# torch) they were built with. OUT gets site/ and site165/ (each module xz-compressed), SHA256SUMS of the modules
# as built, and build.json: the torch, CUDA and nvcc they were built against, and the sources' hashes, which the
# stage compares with the GPU machine's torch before it uses them.
set -euo pipefail
out=${1:?usage: pack-prebuilt.sh OUT SITE_146 SITE_165 PYTHON}; site146=${2:?}; site165=${3:?}; python=${4:?}
root=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$out.partial" && mkdir -p "$out.partial/site" "$out.partial/site165"
sums=()
pairs=("site:$site146/exllamav3_ext" "site:$site146/glm53_expert_cache")
[ "$site165" != - ] && pairs+=("site165:$site165/exllamav3_ext")
for pair in "${pairs[@]}"; do
  dir=${pair%%:*}; module=$(ls "${pair#*:}".cpython-*.so)
  xz -T2 -9 -c "$module" >"$out.partial/$dir/$(basename "$module").xz"
  sums+=("$(sha256sum "$module" | cut -d' ' -f1)  $dir/$(basename "$module")")
done
printf '%s\n' "${sums[@]}" >"$out.partial/SHA256SUMS"
"$python" - "$out.partial/build.json" "$root" <<'PY'
import hashlib, json, subprocess, sys, torch
from pathlib import Path
from torch.utils.cpp_extension import CUDA_HOME
root = Path(sys.argv[2])
def tree_hash(path: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        digest.update(file.relative_to(path).as_posix().encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()
wheels = {w.name: hashlib.sha256(w.read_bytes()).hexdigest() for w in (*root.glob(".whl/exllamav3-*.whl"), *root.glob(".whl165/exllamav3-*.whl"))}
nvcc = subprocess.run([CUDA_HOME + "/bin/nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
json.dump({"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda, "nvcc": nvcc,
           "arch": "9.0", "wheels": wheels, "expert_cache_sources": tree_hash(root / "pkgs/exllamav3/expert-cache"),
           "build_ext": hashlib.sha256((root / "pkgs/exllamav3/build_ext.py").read_bytes()).hexdigest()},
          open(sys.argv[1], "w"), indent=1)
PY
rm -rf "$out" && mv "$out.partial" "$out"
du -sh "$out"/*
