# The PyPI wheels that the exllamav3 engine's Python environment adds to the pinned nixpkgs: packages it lacks,
# or has too old (llguidance: nixos-25.11 has 1.2, ExLlamaV3 1.4.6 requires >= 1.7.0). They are
# repro.lock.json's engine.tabbyapi.python, each fetched by the sha256 recorded there and installed as it is;
# compiled ones are patched to nixpkgs' libraries. Each is imported at build time by its name with "-" as "_".
{
  lib,
  stdenv,
  buildPythonPackage,
  fetchurl,
  autoPatchelfHook,
  glmLib,
}:
lib.mapAttrs (
  name: pin:
  buildPythonPackage {
    pname = name;
    inherit (pin) version;
    format = "wheel";
    src = fetchurl { inherit (pin) url sha256; };
    nativeBuildInputs = lib.optionals (!lib.hasSuffix "-none-any.whl" pin.url) [ autoPatchelfHook ];
    buildInputs = [ (lib.getLib stdenv.cc.cc) ];
    pythonImportsCheck = [ (builtins.replaceStrings [ "-" ] [ "_" ] name) ];
    meta = {
      description = "${name} ${pin.version}, the PyPI wheel pinned in repro.lock.json";
      homepage = "https://pypi.org/project/${name}/${pin.version}/";
      sourceProvenance = lib.optionals (!lib.hasSuffix "-none-any.whl" pin.url) [
        lib.sourceTypes.binaryNativeCode
      ];
      platforms = [ "x86_64-linux" ];
    };
  }
) glmLib.pins.tabbyapi.python
