#!/usr/bin/env python3
"""Compare ExLlamaV3 GPU-only inference with CPU expert offload on one EXL3 model, crash-safe.

Every mode runs in its own subprocess with a timeout (the offload worker is a multiprocessing-spawn
child that may die with SIGSEGV): the parent reports exit code / signal / stderr tail instead of
hanging, then prints one JSON document:
  modes.<mode>: rc, signal, timed_out, load_s, tok_s (greedy decode after warm-up), stderr_tail
  compare.<mode>: top1_agree (fraction of positions whose argmax equals GPU-only's),
                  kl_mean / kl_max (KL(P_gpu || P_mode) of next-token distributions, nats)
Modes: gpu, split:N, split:N:static, offload:N (offload has no placement variant).

--diag also captures what confirms or refutes the crash cause (docs/serve.md, "The CPU worker's SIGSEGV"):
the formatted `ifstream >> int` in physical_core_order() (cpu/moe_mul1.cpp:1329-1334), run by the
worker's first Pool::ensure, dispatching num_get<char>::do_get into codecvt<char>::do_unshift.

Needs the GPU machine with ExLlamaV3 1.4.6 and its exllamav3_ext importable. Stand-alone.
Usage: python3 tools/exl3-cpu-offload-check.py --model /tmp/fx/model [--diag] [--env K=V ...]

API used (ExLlamaV3 1.4.6 wheel): Config.from_directory (model/config.py:223), Model.from_config
(model/model.py:151), Cache(model, max_num_tokens=) and model.load() as in tools/make-exl3-fixture.py;
infer_params.moe_cpu_split / moe_cpu_offload / moe_cpu_threads (model/config.py:39-50, set the same way
by model_init.py:201-209); env EXL3_MOE_CPU_SWAP=0 = static placement (moe_cpu_host.py docs);
Model.forward(ids, {"attn_mode": "flash_attn", "cache", "past_len": 0, "batch_shape"}) as model_ls.py:96-101
does (modules/attn.py:43-47: batch max_seq_len divisible by 256); Generator/Job/ArgmaxSampler
(generator/generator.py:279,334,255; generator/job.py:47).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MARK = "RESULT_JSON "


def mode_env(mode: str) -> dict:
    """Environment for a mode. Config reads EXL3_MOE_CPU_SPLIT/OFFLOAD (model/config.py:39,46);
    the run also sets infer_params explicitly."""
    parts = mode.split(":")
    if parts[0] == "gpu":
        return {"EXL3_MOE_CPU_SPLIT": "0", "EXL3_MOE_CPU_OFFLOAD": "0"}
    n = int(parts[1])
    if parts[0] == "split":
        env = {"EXL3_MOE_CPU_SPLIT": str(n), "EXL3_MOE_CPU_OFFLOAD": "0"}
        if len(parts) > 2 and parts[2] == "static":
            env["EXL3_MOE_CPU_SWAP"] = "0"
        return env
    if parts[0] == "offload":
        return {"EXL3_MOE_CPU_OFFLOAD": str(n), "EXL3_MOE_CPU_SPLIT": "0"}
    raise SystemExit(f"unknown mode {mode!r}")


def vocab_of(model_dir: str) -> int:
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    return int(c.get("text_config", c).get("vocab_size", c.get("vocab_size", 512)))


# ---------------------------------------------------------------------------------------------
#   Child: one mode, one process
# ---------------------------------------------------------------------------------------------


def run_mode(a) -> None:
    import torch
    from exllamav3 import Cache, Config, Generator, Model, Tokenizer
    from exllamav3.generator import Job
    from exllamav3.generator.sampler import ArgmaxSampler

    res = {"mode": a._run}
    t0 = time.perf_counter()
    config = Config.from_directory(a.model)
    ip = config.infer_params
    kind, n = [*a._run.split(":"), "0"][:2]
    if kind == "split":
        ip.moe_cpu_split = int(n)
    elif kind == "offload":
        ip.moe_cpu_offload = int(n)
    if a.threads:
        ip.moe_cpu_threads = a.threads
    model = Model.from_config(config)
    cache = Cache(model, max_num_tokens=a.cache_tokens)
    model.load()
    torch.cuda.synchronize()
    res["load_s"] = round(time.perf_counter() - t0, 2)
    res["cpu_hosts"] = len(getattr(config, "moe_cpu_hosts", {}) or {})
    print(f"loaded {a._run} in {res['load_s']} s, cpu hosts {res['cpu_hosts']}", flush=True)

    vocab = vocab_of(a.model)
    g = torch.Generator().manual_seed(1234)
    prompts = torch.randint(2, max(3, vocab - 16), (a.prompts, a.positions), generator=g)
    blen = ((a.positions + 255) // 256) * 256
    logits, how = [], "flash_attn"
    for p in prompts:
        ids = p.unsqueeze(0)
        try:
            params = {"attn_mode": "flash_attn", "cache": cache, "past_len": 0, "batch_shape": (1, blen)}
            out = model.forward(ids, params)
        except Exception as e:  # report, then try the no-cache path
            how = f"flash_attn_nc ({type(e).__name__}: {e})"
            out = model.forward(ids, {"attn_mode": "flash_attn_nc"})
        logits.append(out[0, :, :vocab].float().cpu())
        print(f"forward ok ({a._run}), logits {tuple(out.shape)}", flush=True)
    res["forward_mode"] = how
    torch.save({"logits": torch.stack(logits), "prompts": prompts}, a._dump)

    gen = Generator(model=model, cache=cache, tokenizer=Tokenizer.from_config(config))  # generator.py:25
    ids = prompts[:1, :16]

    def decode(n_new):
        job = Job(
            input_ids=ids, max_new_tokens=n_new, min_new_tokens=n_new, sampler=ArgmaxSampler(), stop_conditions=[]
        )
        gen.enqueue(job)
        toks = []
        while gen.num_remaining_jobs():
            for r in gen.iterate():
                if r.get("token_ids") is not None:
                    toks += r["token_ids"].flatten().tolist()
        return toks

    decode(4)  # warm-up (first offload job, graphs, autotune)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    toks = decode(a.decode)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t1
    res.update(tok_s=round(a.decode / dt, 1), decode_tokens=toks[: a.decode])
    print(MARK + json.dumps(res), flush=True)
    # Stop the CPU worker and unlink its shared memory (MoeCpuHost.shutdown, moe_cpu_host.py:1205),
    # then skip interpreter teardown; a hung shutdown is cut off after 30 s
    import threading

    threading.Timer(30, os._exit, (0,)).start()
    for h in list((getattr(config, "moe_cpu_hosts", None) or {}).values()):
        try:
            h.shutdown()
        except Exception as e:
            print(f"worker shutdown: {e}", file=sys.stderr, flush=True)
    os._exit(0)


# ---------------------------------------------------------------------------------------------
#   Parent: subprocess per mode, comparison
# ---------------------------------------------------------------------------------------------


def run_sub(cmd, env, timeout):
    """Run cmd in its own process group; returns dict with rc/signal/timed_out/stdout/stderr."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    timed_out = False
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(p.pid, signal.SIGKILL)  # the group: the spawned CPU worker too
        out, err = p.communicate()
    rc = p.returncode
    sig = signal.Signals(-rc).name if rc is not None and rc < 0 else None
    return {
        "rc": rc,
        "signal": sig,
        "timed_out": timed_out,
        "wall_s": round(time.perf_counter() - t0, 1),
        "stdout": out or "",
        "stderr": err or "",
    }


def tail(s: str, n: int) -> str:
    return s[-n:] if len(s) > n else s


def run_modes(a, modes, extra_env, workdir):
    results = {}
    for mode in modes:
        env = dict(os.environ)
        env.update(mode_env(mode))
        if mode != "gpu":
            env.update(extra_env)
        dump = os.path.join(workdir, mode.replace(":", "_") + ".pt")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--model",
            a.model,
            "--_run",
            mode,
            "--_dump",
            dump,
            "--positions",
            str(a.positions),
            "--prompts",
            str(a.prompts),
            "--decode",
            str(a.decode),
            "--cache-tokens",
            str(a.cache_tokens),
        ] + (["--threads", str(a.threads)] if a.threads else [])
        print(
            f"== {mode} {' '.join(f'{k}={v}' for k, v in env.items() if k.startswith(('EXL3_', 'PYTHONFAULT')))}",
            file=sys.stderr,
            flush=True,
        )
        r = run_sub(cmd, env, a.timeout)
        row = {k: r[k] for k in ("rc", "signal", "timed_out", "wall_s")}
        for line in r["stdout"].splitlines():
            if line.startswith(MARK):
                row.update(json.loads(line[len(MARK) :]))
        row["ok"] = "tok_s" in row
        row["dump"] = dump if os.path.exists(dump) else None
        if not row["ok"] or a.verbose:
            row["stdout_tail"] = tail(r["stdout"], 2000)
            row["stderr_tail"] = tail(r["stderr"], a.tail)
        results[mode] = row
        print(
            f"   -> ok={row['ok']} rc={row['rc']} signal={row['signal']} timed_out={row['timed_out']}",
            file=sys.stderr,
            flush=True,
        )
    return results


def compare(base_dump, dump):
    import torch

    b, m = torch.load(base_dump)["logits"], torch.load(dump)["logits"]
    lb, lm = torch.log_softmax(b, -1), torch.log_softmax(m, -1)
    kl = (lb.exp() * (lb - lm)).sum(-1)  # KL(P_gpu || P_mode) per position
    agree = (b.argmax(-1) == m.argmax(-1)).float().mean().item()
    return {
        "positions": int(kl.numel()),
        "top1_agree": round(agree, 4),
        "kl_mean": float(kl.mean()),
        "kl_max": float(kl.max()),
        "finite": bool(torch.isfinite(m).all()),
    }


# ---------------------------------------------------------------------------------------------
#   Diagnostics
# ---------------------------------------------------------------------------------------------

# Minimal reproduction without a model: the worker's compute entry on random weights. Pool::ensure
# (moe_mul1.cpp:1462) runs physical_core_order() unless EXL3_MOE_CPU_PIN=0. argv: H I where
MICRO = r"""
import faulthandler, multiprocessing as mp, os, sys
faulthandler.enable()
def maps():
    seen = set()
    for l in open("/proc/self/maps"):
        p = l.split()[-1]
        if ("libstdc++" in p or "exllamav3_ext" in p or "libgcc_s" in p) and p not in seen:
            seen.add(p); print("  map", p, flush=True)
def work(H, I, full):
    import torch
    if full:
        import exllamav3  # noqa: F401 - the worker's import order (fla, triton, ...)
    try:
        import exllamav3_ext as ext
    except ImportError:
        from exllamav3.ext import exllamav3_ext as ext
    print("ext", ext.__file__, "vbmi", ext.exl3_moe_cpu_has_avx512_vbmi(),
          "vnni", ext.exl3_moe_cpu_has_avx512_vnni(), flush=True)
    maps()
    g = torch.Generator().manual_seed(0); E, K, topk = 16, 3, 8
    tr = lambda k, n: torch.randint(-32768, 32767, (k // 16, n // 16, 16 * K), dtype=torch.int16, generator=g)
    hv = lambda n: (torch.rand(n, generator=g) + 0.5).half()
    L = [[tr(H, I) for _ in range(E)], [hv(H) for _ in range(E)], [hv(I) for _ in range(E)],
         [tr(H, I) for _ in range(E)], [hv(H) for _ in range(E)], [hv(I) for _ in range(E)],
         [tr(I, H) for _ in range(E)], [hv(I) for _ in range(E)], [hv(H) for _ in range(E)]]
    h = ext.exl3_moe_cpu_make_layer(*L, [], [], [], 0, 0.0, 0)
    x = torch.randn(2, H, generator=g).half(); sel = torch.randint(0, E, (2, topk), generator=g)
    w = torch.rand(2, topk, generator=g).half(); out = torch.empty(2, H)
    print("calling exl3_moe_cpu_forward (first Pool::ensure)", flush=True)
    ext.exl3_moe_cpu_forward(h, x, sel, w, out, 1)
    print("MICRO_OK", float(out.abs().sum()), flush=True)
if __name__ == "__main__":
    H, I, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if how == "spawn":
        p = mp.get_context("spawn").Process(target=work, args=(H, I, True)); p.start(); p.join()
        print("spawn child exitcode", p.exitcode, flush=True); sys.exit(0 if p.exitcode == 0 else 1)
    work(H, I, how == "full")
"""


def shell(cmd, n=4000):
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=120)
        return tail((r.stdout + r.stderr).strip(), n)
    except Exception as e:
        return f"({e})"


def diag(a, workdir):
    import importlib.util

    d = {}
    spec = importlib.util.find_spec("exllamav3_ext")
    so = spec.origin if spec else None
    d["ext_so"] = so
    if so:
        # Does the module carry its own libstdc++ (locale, facets)? Hypothesis: yes.
        d["readelf_needed"] = shell(f"readelf -d '{so}' | grep -E 'NEEDED|RPATH|RUNPATH|SYMBOLIC|FLAGS'")
        d["comment"] = shell(f"readelf -p .comment '{so}'", 800)
        d["libstdcxx_defined"] = shell(
            f"nm -C --defined-only '{so}' | grep -E 'locale::id::_M_id|locale::classic"
            "|codecvt<char, char, __mbstate_t>::do_unshift"
            "|num_get<char.*>::id|basic_ios<char.*>::_M_cache_locale|ios_base::Init::Init' | head -40"
        )
        d["std_symbols_defined"] = shell(f"nm -C --defined-only '{so}' | grep -c ' [TtWw] std::'")
        d["do_unshift_disasm"] = shell(
            f"objdump -d --no-show-raw-insn '{so}' | grep -A4 '<_ZNKSt7codecvtIcc11__mbstate_tE10do_unshift' | head -12"
        )
    d["toolchain"] = shell(
        "g++ --version | head -1; f=$(g++ -print-file-name=libstdc++.so); echo $f; "
        # a linker script naming libstdc++_nonshared.a links libstdc++ code statically
        "head -c 300 $f | grep -a INPUT; g++ -dumpspecs | grep -n static-libstdc | head -3"
    )
    d["dmesg"] = shell("dmesg 2>/dev/null | grep -iE 'segfault|exllamav3_ext' | tail -5")
    micro = os.path.join(workdir, "micro.py")
    with open(micro, "w") as f:
        f.write(MICRO)
    hid, inter = a.diag_dims
    runs = {}
    gdb = shutil.which("gdb")
    variants = [
        ("pin1_bare", {"EXL3_MOE_CPU_PIN": "1"}, "bare"),
        ("pin0_bare", {"EXL3_MOE_CPU_PIN": "0"}, "bare"),
        ("pin1_avx2_bare", {"EXL3_MOE_CPU_PIN": "1", "EXL3_MOE_CPU_MAX_ISA": "avx2"}, "bare"),
        ("pin1_full_import", {"EXL3_MOE_CPU_PIN": "1"}, "full"),
        ("pin1_spawn", {"EXL3_MOE_CPU_PIN": "1"}, "spawn"),
        ("pin0_spawn", {"EXL3_MOE_CPU_PIN": "0"}, "spawn"),
    ]
    for name, env_over, how in variants:
        env = dict(os.environ, PYTHONFAULTHANDLER="1", **env_over)
        r = run_sub([sys.executable, micro, str(hid), str(inter), how], env, 300)
        runs[name] = {
            "rc": r["rc"],
            "signal": r["signal"],
            "timed_out": r["timed_out"],
            "ok": "MICRO_OK" in r["stdout"],
            "out": tail(r["stdout"] + r["stderr"], 1500),
        }
        print(f"   diag {name}: rc={r['rc']} signal={r['signal']} ok={runs[name]['ok']}", file=sys.stderr, flush=True)
    d["micro"] = runs
    if gdb:
        # Backtrace + registers at the fault; vtable symbol of `this` says which facet object it is
        cmd = (
            f"EXL3_MOE_CPU_PIN=1 {gdb} -q -batch -iex 'set auto-load safe-path /' -ex 'set pagination off' "
            "-ex run -ex bt -ex 'x/4i $pc' -ex 'info symbol $pc' "
            f"-ex 'info registers rdi rsi rdx rcx r8' -ex 'info symbol *(void**)$rdi' -ex 'info sharedlibrary' "
            f"--args {sys.executable} {micro} {hid} {inter} bare"
        )
        d["gdb"] = shell(cmd, 6000)
    else:
        d["gdb"] = "gdb not installed: apt-get install gdb, then rerun --diag for the backtrace"
    # Full-model confirmation: same offload mode with and without thread pinning
    if not a.no_model:
        m = a.modes.split(",")[0]
        for pin in ("1", "0"):
            r = run_modes(a, [m], {**a.extra_env, "EXL3_MOE_CPU_PIN": pin, "PYTHONFAULTHANDLER": "1"}, workdir)[m]
            d[f"model_{m}_pin{pin}"] = {
                k: r.get(k) for k in ("ok", "rc", "signal", "timed_out", "tok_s", "stderr_tail")
            }
    segv = {k: v["signal"] == "SIGSEGV" for k, v in runs.items()}
    pin1, pin0 = [any(v for k, v in segv.items() if k.startswith(p)) for p in ("pin1", "pin0")]
    if pin1 and not pin0:
        d["verdict"] = "CONFIRMED: SIGSEGV only with thread pinning (physical_core_order's ifstream >> int)"
    elif not pin1 and not pin0:
        d["verdict"] = "NOT REPRODUCED by the micro runs: read model_* runs (pin 1 vs 0) and the gdb backtrace"
    else:
        d["verdict"] = "REFUTED: SIGSEGV also without pinning; read gdb backtrace and micro.*.out"
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="converted EXL3 model directory")
    ap.add_argument(
        "--modes",
        default="split:8,split:8:static,offload:4",
        help="comma list of split:N[:static] / offload:N (gpu-only always runs first)",
    )
    ap.add_argument("--positions", type=int, default=64, help="tokens per prompt (next-token logits at each)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--decode", type=int, default=64, help="greedy tokens timed for tok/s")
    ap.add_argument("--cache-tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0, help="infer_params.moe_cpu_threads (0: engine default)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", help="extra env for offload modes")
    ap.add_argument("--stats", help="EXL3_MOE_CPU_SPLIT_STATS file for :static modes")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per mode")
    ap.add_argument("--tail", type=int, default=4000, help="stderr characters kept per failed mode")
    ap.add_argument("--diag", action="store_true", help="crash diagnostics (micro repro, ELF, gdb, pin 1 vs 0)")
    ap.add_argument("--diag-dims", type=int, nargs=2, default=[256, 128], metavar=("HIDDEN", "INTERM"))
    ap.add_argument("--no-model", action="store_true", help="with --diag: skip the model runs")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logit dumps)")
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--_run", help=argparse.SUPPRESS)
    ap.add_argument("--_dump", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._run:
        run_mode(a)
        return
    a.extra_env = dict(kv.split("=", 1) for kv in a.env)
    if a.stats:
        a.extra_env["EXL3_MOE_CPU_SPLIT_STATS"] = os.path.abspath(a.stats)
    workdir = tempfile.mkdtemp(prefix="exl3-offload-check-")
    report = {"model": a.model, "extra_env": a.extra_env, "workdir": workdir}
    if a.diag:
        report["diag"] = diag(a, workdir)
    else:
        modes = ["gpu"] + [m for m in a.modes.split(",") if m and m != "gpu"]
        res = run_modes(a, modes, a.extra_env, workdir)
        report["modes"] = res
        base = res["gpu"].get("dump")
        report["compare"] = {
            m: (compare(base, r["dump"]) if base and r.get("dump") else None) for m, r in res.items() if m != "gpu"
        }
        ref = res["gpu"].get("decode_tokens") or []
        for m, r in res.items():
            toks = r.get("decode_tokens") if a.verbose else r.pop("decode_tokens", None)
            if m != "gpu" and report["compare"].get(m) is not None and toks is not None and ref:
                same = sum(x == y for x, y in zip(ref, toks, strict=False))
                report["compare"][m]["greedy_decode_agree"] = round(same / max(1, len(ref)), 4)
    print(json.dumps(report, indent=1))
    if not a.keep:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
