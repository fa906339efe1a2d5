#!/usr/bin/env bash
# The exllamav3 engine on a CUDA machine, end to end: build ExLlamaV3's extension, convert the tiny GLM-5.3
# fixture, diagnose the CPU worker, compare GPU-only with CPU offload, then `glm53 serve` it through TabbyAPI
# and measure it with `glm53 bench run`. Each stage writes its log and results under OUT.
#
#   tools/exl3-gpu-run.sh OUT STAGE...     stages: setup build build-cache fixture diag check serve routing sweep-cost
#                                                 cache-bench cache-generate build165 version-check engine-wheels
#                                                 install-engine prebuilt host-check
#
# Needs: python3 with torch (CUDA) and transformers >= 5.17; WHEELS (default .whl) holding ExLlamaV3 1.4.6 and
# the packages the machine lacks; TABBY (default .gpu/tabby) holding TabbyAPI's source at the pinned commit.
# ARCH (default 9.0) is the CUDA architecture to build for; WORK (default /root/glm53-gpu) keeps the build and
# the model; FIXTURE_TGZ (stage fixture-tgz) is a converted fixture from an earlier fixture stage. STYLE is the
# bench's prompt style (random by default); SPLIT (default 8) the routed experts per layer served on the CPU.
# Stage routing records ExLlamaV3's routing while it generates (OUT/routing/routing.npz, a glm53 trace) and
# compares the placement its dynamic split reaches with glm53's replay of the same rule (OUT/routing/compare.json);
# ROUTING_ARGS passes options to tools/exl3-routing-capture.py. CAPTURE=1 makes stage serve record the routing
# while TabbyAPI serves (`glm53 serve --capture-routing OUT/capture`) and compare it with glm53's replay; CACHE=1
# serves through glm53's GPU expert cache (EXPERT_CACHE=1, WINDOW slots a layer) and, with CAPTURE=1, checks its
# hit counts against the simulator on the routing it served (`glm53 plan expert-cache-check`); POLICY=frequency
# (with HALF_LIFE, RECENT) serves the cache's decayed-frequency policy instead of LRU; EXPERTS=host keeps the routed
# experts in host memory only (EXPERT_CACHE_EXPERTS=host). Stage host-check (after fixture) compares host-resident
# experts with the stock engine pass by pass and measures the VRAM they save (tools/exl3-host-experts-check.py).
# Stage sweep-cost times the engine's own sweep over 1 to 42 layers of 16 to 256 experts (OUT/sweep-cost.json);
# it needs only setup and build. Stage build-cache compiles glm53's GPU expert cache (pkgs/exllamav3/expert-cache)
# into glm53_expert_cache beside exllamav3_ext; stage cache-bench (setup, build, build-cache) runs
# tools/exl3-expert-cache-bench.py at GLM-5.3-Flash's dimensions into OUT/expert-cache.json (CACHE_ARGS: its options);
# stage cache-generate (after fixture) generates with the cache inside ExLlamaV3's forward (OUT/cache-generate.json).
# Stage version-check (after fixture) runs tools/exl3-version-check.py on the installed ExLlamaV3, then on the
# release in WHEELS165 (default .whl165: its wheel only; built into its own site by stage build165 or, when that
# has not run, by version-check itself), into OUT/version.jsonl.
# The no-Nix install as the README gives it: stage engine-wheels gathers ENGINE_WHEELS (a folder of the lock's
# wheels for this Python; carried in parts, one call each) into WORK/engine-wheels; stage install-engine runs
# `glm53 repro install-engine WORK/engine` from nothing, offline from those wheels, with no PYTHONPATH. ENGINE=DIR
# makes stages serve and version-check use that install (GLM53_TABBYAPI_DIR/PYTHON, its Python for 1.4.6).
# Stage prebuilt (after setup) unpacks tools/pack-prebuilt.sh's extensions instead of stages build, build-cache
# and build165.
set -uo pipefail
out=${1:?usage: exl3-gpu-run.sh OUT STAGE...}; shift
mkdir -p "$out"
root=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-/root/glm53-gpu}; wheels=${WHEELS:-$root/.whl}; tabby=${TABBY:-$root/.gpu/tabby}
site=$work/site; model=$work/fx/exl3
export PYTHONUNBUFFERED=1 PYTHONPATH=$site:$root/python/src
# glm53 finds its own packages without PYTHONPATH, so that a stage can run it with none (ENGINE below)
glm53_main="import sys; sys.path[:0] = ['$site', '$root/python/src']; from glm53.cli.main import main; sys.argv[0] = 'glm53'; main()"
glm53() { python3 -c "$glm53_main" "$@"; }
stamp() { echo "== $(date +%T) $*"; }
wheels165=${WHEELS165:-$root/.whl165}; site165=$work/site165
# ExLlamaV3 from WHEELS165 into its own site, its extension built there (stage build165, or version-check's first)
build_165() {
  mkdir -p "$site165" "$work/build165"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site165" "$wheels165"/*.whl
  (cd "$work/build165" && TORCH_CUDA_ARCH_LIST=${ARCH:-9.0} MAX_JOBS=${MAX_JOBS:-16} \
    python3 "$root/pkgs/exllamav3/build_ext.py" "$site165/exllamav3/exllamav3_ext" "$site165" >"$out/build165.log" 2>&1)
  echo "build165 rc=$? $(ls "$site165"/exllamav3_ext*.so 2>/dev/null)"; tail -2 "$out/build165.log" | cut -c1-300
}

for stage in "$@"; do
  case $stage in
  setup)
    stamp setup
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$wheels"/*.whl
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    nproc; python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
    ;;
  build)
    stamp build
    mkdir -p "$work/build" && cd "$work/build" || exit 1
    # symbols and no identical-code folding: a crash inside the extension names the real function
    TORCH_CUDA_ARCH_LIST=${ARCH:-9.0} MAX_JOBS=${MAX_JOBS:-16} EXL3_EXTRA_CXXFLAGS="-g -fno-ipa-icf" \
      python3 "$root/pkgs/exllamav3/build_ext.py" "$site/exllamav3/exllamav3_ext" "$site" >"$out/build.log" 2>&1
    echo "build rc=$? $(ls "$site"/exllamav3_ext*.so 2>/dev/null)"; tail -1 "$out/build.log" | cut -c1-300; cd "$root" || exit 1
    # which libstdc++ the module carries: defined std::locale symbols mean a private copy of libstdc++
    echo "std::locale symbols defined in the module: $(nm -C --defined-only "$site"/exllamav3_ext*.so | grep -c 'std::locale')"
    grep -o '^[^ ]*g++ ' "$out/build.log" | sort | uniq -c
    for cxx in /opt/gcc/bin/g++ g++; do command -v $cxx >/dev/null && echo "$cxx: $($cxx -dumpversion) links $($cxx -print-file-name=libstdc++.so) / $($cxx -print-file-name=libstdc++.a)"; done
    ;;
  prebuilt)
    # PREBUILT (default .prebuilt, tools/pack-prebuilt.sh): the extensions built elsewhere for this torch, unpacked
    # into the sites that stages build, build-cache and build165 would fill, after their hashes and torch are checked;
    # carry build.json and SHA256SUMS with each part
    stamp prebuilt
    prebuilt=${PREBUILT:-$root/.prebuilt}
    want=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["torch"])' "$prebuilt/build.json")
    have=$(python3 -c 'import torch; print(torch.__version__)')
    if [ "$want" != "$have" ]; then echo "prebuilt for torch $want, this machine has $have: build instead"; exit 1; fi
    mkdir -p "$site165"
    for packed in "$prebuilt"/site/*.xz "$prebuilt"/site165/*.xz; do
      [ -f "$packed" ] || continue  # site165/ is empty when 1.6.5 was not packed
      dir=$(basename "$(dirname "$packed")"); name=$(basename "$packed" .xz)
      python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$packed" "$work/$dir/$name"
    done
    # the parts carried so far (site/ and site165/ may come in separate calls: a call carries at most 64 MiB)
    (cd "$work" && sha256sum -c --ignore-missing "$prebuilt/SHA256SUMS") || exit 1
    ls "$site165"/exllamav3_ext*.so >/dev/null 2>&1 &&
      python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site165" "$wheels165"/*.whl
    cat "$prebuilt/build.json"
    ;;
  build-cache)
    stamp build-cache
    mkdir -p "$work/build-cache" && cd "$work/build-cache" || exit 1
    EXL3_EXTENSION_NAME=glm53_expert_cache TORCH_CUDA_ARCH_LIST=${ARCH:-9.0} \
      python3 "$root/pkgs/exllamav3/build_ext.py" "$root/pkgs/exllamav3/expert-cache" "$site" >"$out/build-cache.log" 2>&1
    echo "build-cache rc=$? $(ls "$site"/glm53_expert_cache*.so 2>/dev/null)"; grep -iE "error|warning" "$out/build-cache.log" | head -20
    cd "$root" || exit 1
    ;;
  cache-bench)
    stamp cache-bench
    timeout ${CACHE_TIMEOUT:-420} python3 "$root/tools/exl3-expert-cache-bench.py" --out "$out/expert-cache.json" ${CACHE_ARGS:-} 2>&1 |
      tee "$out/cache-bench.log" | cut -c1-400
    echo "cache-bench rc=${PIPESTATUS[0]}"
    ;;
  cache-generate)
    stamp cache-generate
    timeout ${CACHE_TIMEOUT:-300} python3 "$root/tools/exl3-cache-generate.py" --model "$model" --out "$out/cache-generate.json" \
      ${CACHE_ARGS:-} 2>&1 | tee "$out/cache-generate.log" | tail -30 | cut -c1-1500
    echo "cache-generate rc=${PIPESTATUS[0]}"
    ;;
  host-check)
    stamp host-check
    timeout ${CACHE_TIMEOUT:-300} python3 "$root/tools/exl3-host-experts-check.py" --model "$model" \
      --out "$out/host-experts.json" ${CACHE_ARGS:-} 2>&1 | tee "$out/host-check.log" | tail -12 | cut -c1-2000
    echo "host-check rc=${PIPESTATUS[0]}"
    ;;
  fixture)
    stamp fixture
    python3 "$root/tools/make-exl3-fixture.py" --work "$work/fx" --export "$work/fx-export" >"$out/fixture.log" 2>&1
    echo "fixture rc=$?"; grep -E "^(BUILD|CONVERT rc|RUN|load|gen)" "$out/fixture.log" | tail -6
    tar -C "$work/fx" -czf "$out/fixture-exl3.tgz" exl3 && ls -la "$out/fixture-exl3.tgz"
    ;;
  fixture-tgz)
    stamp fixture-tgz
    mkdir -p "$work/fx" && tar -C "$work/fx" -xzf "${FIXTURE_TGZ:-$root/.gpu/fixture-exl3.tgz}" && ls "$model"
    ;;
  diag)
    stamp diag
    timeout 280 python3 "$root/tools/exl3-cpu-offload-check.py" --model "$model" --diag --timeout 120 \
      >"$out/diag.json" 2>"$out/diag.err"; echo "diag rc=$?"
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d.get("diag",{}).get("verdict")))' "$out/diag.json"
    ;;
  check)
    stamp check
    timeout ${CHECK_TIMEOUT:-420} python3 "$root/tools/exl3-cpu-offload-check.py" --model "$model" \
      --modes "${MODES:-split:8,split:8:static,offload:4}" ${CHECK_ARGS:-} --timeout 150 >"$out/check.json" 2>"$out/check.err"
    echo "check rc=$?"; python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({"modes": {k: {x: v.get(x) for x in ("ok","rc","signal","tok_s")} for k, v in d["modes"].items()}, "compare": d.get("compare")}, indent=1))' "$out/check.json"
    ;;
  engine-wheels)
    stamp engine-wheels
    mkdir -p "$work/engine-wheels" && cp "${ENGINE_WHEELS:?}"/*.whl "$work/engine-wheels/"
    echo "$(ls "$work/engine-wheels" | wc -l) wheels in $work/engine-wheels"
    ;;
  install-engine)
    stamp install-engine
    start=$(date +%s)
    env -u PYTHONPATH python3 -c "$glm53_main" repro install-engine "$work/engine" --python "$(command -v python3)" \
      --cuda-arch "${ARCH:-9.0}" --wheels "$work/engine-wheels" --tabbyapi "$tabby" --max-jobs "${MAX_JOBS:-16}" \
      >"$out/install-engine.log" 2>&1
    echo "install-engine rc=$? after $(( $(date +%s) - start )) s"; tail -25 "$out/install-engine.log" | cut -c1-400
    ls "$work"/engine.*-failed.log 2>/dev/null && tail -40 "$work"/engine.*-failed.log | cut -c1-300
    ;;
  serve)
    stamp serve
    if [ -n "${ENGINE:-}" ]; then
      # the installed engine alone: nothing of this script's site reaches TabbyAPI or glm53
      unset PYTHONPATH; export GLM53_TABBYAPI_DIR=$ENGINE/tabbyapi GLM53_TABBYAPI_PYTHON=$ENGINE/venv/bin/python
      tabby=$ENGINE/tabbyapi
      glm53 doctor --profile exl3-1gpu --model-dir "$model" >"$out/doctor.txt" 2>&1; echo "doctor rc=$?"; cat "$out/doctor.txt"
    fi
    glm53 model lock local/glm53-tiny-exl3 --model-dir "$model" --force >"$out/lock.log" 2>&1; echo "lock rc=$?"
    export GLM53_TABBYAPI_DIR=$tabby
    # CACHE=1: glm53's GPU expert cache instead of the CPU split, WINDOW LRU slots a layer (default 4)
    cache_args=(); split=${SPLIT:-8}
    [ -n "${CACHE:-}" ] && cache_args=(--set EXPERT_CACHE=1 --set EXPERT_CACHE_WINDOW=${WINDOW:-4}) && split=${SPLIT:-0}
    # POLICY=frequency: the decayed-frequency policy (HALF_LIFE, RECENT: its settings, when given)
    [ -n "${CACHE:-}" ] && [ -n "${POLICY:-}" ] && cache_args+=(--set EXPERT_CACHE_POLICY=$POLICY \
      ${HALF_LIFE:+--set EXPERT_CACHE_HALF_LIFE=$HALF_LIFE} ${RECENT:+--set EXPERT_CACHE_RECENT=$RECENT})
    # EXPERTS=host: the routed experts in host memory only (EXPERT_CACHE_EXPERTS)
    [ -n "${CACHE:-}" ] && [ -n "${EXPERTS:-}" ] && cache_args+=(--set EXPERT_CACHE_EXPERTS=$EXPERTS)
    args=(serve --profile exl3-1gpu --model-dir "$model" --port 8011 --set MAX_MODEL_LEN=4096 --set CHUNK_SIZE=2048
      --set EXL3_MOE_CPU_SPLIT=$split --set EXL3_MOE_CPU_THREADS=8 "${cache_args[@]}"
      ${CAPTURE:+--capture-routing "$out/capture"} ${SERVE_ARGS:-})
    glm53 "${args[@]}" --dry-run >"$out/serve-dry-run.txt" 2>&1; echo "dry-run rc=$?"; tail -3 "$out/serve-dry-run.txt"
    # started directly, not through the shell function, so that $! is glm53 itself (which execs TabbyAPI)
    python3 -c "$glm53_main" "${args[@]}" >"$out/serve.log" 2>&1 &
    server=$!
    sleep 8
    if ! kill -0 $server 2>/dev/null; then echo "serve stopped at once:"; tail -12 "$out/serve.log"; continue; fi
    for _ in $(seq ${HEALTH_WAIT:-150}); do curl -sf http://127.0.0.1:8011/health >/dev/null && break; kill -0 $server 2>/dev/null || break; sleep 1; done
    stamp "health: $(curl -s http://127.0.0.1:8011/health)"
    body='{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":32,"temperature":0}'
    curl -s http://127.0.0.1:8011/v1/chat/completions -H 'content-type: application/json' -d "$body" >"$out/chat.json"
    echo; head -c 600 "$out/chat.json"; echo
    curl -sN http://127.0.0.1:8011/v1/chat/completions -H 'content-type: application/json' \
      -d "${body%\}},\"stream\":true}" >"$out/chat-stream.txt"
    echo "stream: $(grep -c '^data:' "$out/chat-stream.txt") events, last: $(tail -c 200 "$out/chat-stream.txt" | tr '\n' ' ')"
    timeout ${BENCH_TIMEOUT:-240} python3 -c "$glm53_main" bench run \
      --base-url http://127.0.0.1:8011 --shapes "${SHAPES:-512:128,2048:128}" --style "${STYLE:-random}" --runs 2 --out "$out/bench" --no-plots \
      --json >"$out/bench.json" 2>"$out/bench.err"
    echo "bench rc=$?"; tail -5 "$out/bench.err"
    grep -iE "moe|cpu|worker|split|offload|avx|loaded|error" "$out/serve.log" | head -20; tail -5 "$out/serve.log"
    # SIGTERM, what systemd and Docker send (a background job of this non-interactive shell ignores SIGINT)
    stop=$(date +%s); kill -TERM $server
    for _ in $(seq 60); do kill -0 $server 2>/dev/null || break; sleep 1; done
    if kill -0 $server 2>/dev/null; then echo "server still running 60 s after SIGTERM"; kill -KILL $server; fi
    wait $server; echo "server rc=$? after $(( $(date +%s) - stop )) s"
    pgrep -af "tabby/main.py|exllamav3" || echo "no process left"
    if [ -n "${CACHE:-}" ]; then
      run_dir=$(sed -n 's/^# working directory //p' "$out/serve-dry-run.txt")
      cp "$run_dir/expert-cache.json" "$out/expert-cache-serve.json"; cat "$out/expert-cache-serve.json" | head -c 400; echo
      grep "glm53 expert cache" "$out/serve.log" | tail -3
      [ -n "${CAPTURE:-}" ] && glm53 plan expert-cache-check "$run_dir/expert-cache.json" "$out/capture/routing.npz" \
        >"$out/cache-check.txt" 2>&1; echo "cache-check rc=$?"; cat "$out/cache-check.txt"
    fi
    if [ -n "${CAPTURE:-}" ]; then
      ls -la "$out/capture"
      # the split's sweeps, recorded only when the CPU split ran (not with CACHE=1)
      [ -f "$out/capture/capture.npz" ] && python3 -c 'import sys; from pathlib import Path; from glm53.plan.exllamav3.capture import load_capture, compare_capture
print(compare_capture(load_capture(Path(sys.argv[1]))).model_dump_json(exclude={"predicted_sweeps", "recorded_sweeps"}))' \
        "$out/capture/capture.npz"; echo "compare rc=$?"
      glm53 plan simulate "$out/capture/routing.npz" --budgets 0.5,0.75 --learn-fraction 0.3 --drift none \
        --out "$out/capture/simulate.json" --force >"$out/capture/simulate.txt" 2>&1; echo "simulate rc=$?"
    fi
    ;;
  routing)
    stamp routing
    timeout ${ROUTING_TIMEOUT:-420} python3 "$root/tools/exl3-routing-capture.py" --model "$model" --out "$out/routing" \
      --split "${SPLIT:-8}" ${ROUTING_ARGS:-} >"$out/routing.log" 2>&1
    echo "routing rc=$?"; tail -4 "$out/routing.log"
    if [ -f "$out/routing/routing.npz" ]; then
      glm53 plan simulate "$out/routing/routing.npz" --budgets 0.5,0.75 --learn-fraction 0.3 --drift none \
        --out "$out/routing/simulate.json" --force >"$out/routing/simulate.txt" 2>&1; echo "simulate rc=$?"
      tail -25 "$out/routing/simulate.txt"
    fi
    ;;
  sweep-cost)
    stamp sweep-cost
    timeout 300 python3 "$root/tools/exl3-sweep-cost.py" --out "$out/sweep-cost.json" ${SWEEP_ARGS:-} 2>&1 | tail -20
    echo "sweep-cost rc=${PIPESTATUS[0]}"
    ;;
  build165)
    stamp build165; build_165
    ;;
  version-check)
    # the fixture on the installed ExLlamaV3, then on the one in WHEELS165 (its own site and extension build)
    stamp version-check
    # ENGINE: 1.4.6 as installed there, and 1.6.5 in front of the same environment
    check_python=python3; [ -n "${ENGINE:-}" ] && check_python=$ENGINE/venv/bin/python && unset PYTHONPATH
    timeout 240 $check_python "$root/tools/exl3-version-check.py" --model "$model" 2>"$out/version-1.err" | tee "$out/version.jsonl"
    if [ -d "$wheels165" ]; then
      ls "$site165"/exllamav3_ext*.so >/dev/null 2>&1 || build_165
      path165=$site165:$site:$root/python/src; [ -n "${ENGINE:-}" ] && path165=$site165
      PYTHONPATH=$path165 timeout 240 $check_python "$root/tools/exl3-version-check.py" --model "$model" \
        2>"$out/version-2.err" | tee -a "$out/version.jsonl"
      tail -3 "$out/version-2.err"
    fi
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
