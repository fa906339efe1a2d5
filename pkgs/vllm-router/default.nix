# vllm-router, vLLM's Rust request router, which nixpkgs does not package: the PyPI wheel repro.lock.json pins
# (router.python), by sha256. Its Rust extension is patched to nixpkgs' C runtime; the OpenSSL and PCRE2 it was
# linked with ship inside the wheel (vllm_router.libs) and are found there through its RPATH.
{
  lib,
  stdenv,
  buildPythonPackage,
  fetchurl,
  autoPatchelfHook,
  setproctitle,
  aiohttp,
  orjson,
  uvicorn,
  fastapi,
  requests,
  glmLib,
}:
let
  pin = glmLib.pins.router.python.vllm-router;
in
buildPythonPackage {
  pname = "vllm-router";
  inherit (pin) version;
  format = "wheel";
  src = fetchurl { inherit (pin) url sha256; };

  nativeBuildInputs = [ autoPatchelfHook ];
  buildInputs = [ (lib.getLib stdenv.cc.cc) ];
  # The wheel's Requires-Dist.
  dependencies = [
    setproctitle
    aiohttp
    orjson
    uvicorn
    fastapi
    requests
  ];

  # Importing the package loads the Rust extension: a library autoPatchelfHook could not resolve fails here.
  pythonImportsCheck = [
    "vllm_router"
    "vllm_router_rs"
  ];

  meta = {
    description = "vllm-router ${pin.version}, the PyPI wheel pinned in repro.lock.json";
    homepage = "https://github.com/vllm-project/router";
    license = lib.licenses.asl20;
    sourceProvenance = [ lib.sourceTypes.binaryNativeCode ];
    mainProgram = "vllm-router";
    platforms = [ "x86_64-linux" ];
  };
}
