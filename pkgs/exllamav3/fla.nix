# fla-core and flash-linear-attention 0.5.0 (ExLlamaV3 1.4.6 requires flash-linear-attention >= 0.5.0), from their
# PyPI wheels (pure Python, py3-none-any) with pinned hashes. Packaged here rather than taken from nixpkgs: fla-core has
# no nixpkgs attribute, and nixpkgs' flash-linear-attention (a source build that ships the whole `fla` tree) was not
# verifiable at the pinned revision; the split wheels are what PyPI's resolver installs next to ExLlamaV3.
{
  lib,
  buildPythonPackage,
  fetchurl,
  einops,
  torch,
  transformers,
}:
let
  version = "0.5.0";
  meta = {
    description = "Triton implementations of linear attention (fla-org)";
    homepage = "https://github.com/fla-org/flash-linear-attention";
    license = lib.licenses.mit;
  };
  # One of the two wheels: pure Python, from PyPI's py3 tree.
  wheel =
    {
      pname,
      hash,
      dependencies,
    }:
    let
      stem = builtins.replaceStrings [ "-" ] [ "_" ] pname;
    in
    buildPythonPackage {
      inherit
        pname
        version
        meta
        dependencies
        ;
      format = "wheel";
      src = fetchurl {
        url = "https://files.pythonhosted.org/packages/py3/f/${pname}/${stem}-${version}-py3-none-any.whl";
        inherit hash;
      };
      # torch propagates python ninja, whose setup hook would make ninja the build/install phase.
      dontUseNinjaBuild = true;
      dontUseNinjaInstall = true;
      dontUseNinjaCheck = true;
      # `fla` imports triton and probes the GPU at import time: checked on GPU machines, not in the sandbox.
      pythonImportsCheck = [ ];
    };
in
rec {
  fla-core = wheel {
    pname = "fla-core";
    hash = "sha256-XIJv8y2va2KWWOPk9hJdh8+MMu6pN+O+m6hfUZUdgJo=";
    dependencies = [
      torch
      einops
    ];
  };

  flash-linear-attention = wheel {
    pname = "flash-linear-attention";
    hash = "sha256-kuZOmJ7TQ1XB+DgjJZey45eD7gSUraMZm1jhVqodjrg=";
    dependencies = [
      fla-core
      transformers
    ];
  };
}
