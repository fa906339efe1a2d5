# Adds the pinned engine and the glm53 tool to nixpkgs; users can override any of them through the overlay.
{ glmLib }:
final: prev: {
  pythonPackagesExtensions = prev.pythonPackagesExtensions ++ [
    (pyFinal: pyPrev: {
      glm53 = pyFinal.callPackage ../pkgs/glm53 { inherit glmLib; };
      # The PyPI wheels repro.lock.json pins for what nixpkgs lacks or has too old (engine.tabbyapi.python).
      glm53-pypi-wheels = pyFinal.callPackage ../pkgs/tabbyapi/python-wheels.nix { inherit glmLib; };
      # ExLlamaV3 1.4.6 requires llguidance >= 1.7.0; nixos-25.11 has 1.2. vLLM gets the same one, so that
      # the vLLM runtime's environment (which holds both) has one llguidance.
      glm53-llguidance = pyFinal.glm53-pypi-wheels.llguidance or pyPrev.llguidance;
      exllamav3-glm53 = pyFinal.callPackage ../pkgs/exllamav3 {
        inherit glmLib;
        llguidance = pyFinal.glm53-llguidance;
      };
      vllm-glm53 = pyFinal.callPackage ../pkgs/vllm-glm53 {
        inherit glmLib;
        vllm = pyPrev.vllm.override { llguidance = pyFinal.glm53-llguidance; };
      };
      # vLLM's router, from the PyPI wheel the lock pins (nixpkgs has none).
      vllm-router = pyFinal.callPackage ../pkgs/vllm-router { inherit glmLib; };
    })
  ];
  glm53 = final.python3Packages.toPythonApplication final.python3Packages.glm53;
  glm53-router = final.callPackage ../pkgs/glm53-router { inherit glmLib; };
  glm53-runtime = final.callPackage ../pkgs/glm53-runtime { inherit glmLib; };
  # The exllamav3 engine: TabbyAPI and glm53 wrapped to run it.
  tabbyapi = final.callPackage ../pkgs/tabbyapi { inherit glmLib; };
  glm53-exl3 = final.callPackage ../pkgs/glm53-exl3 { inherit glmLib; };
}
