# Adds the pinned engine and the glm53 tool to nixpkgs; users can override any of them through the overlay.
{ glmLib }:
final: prev: {
  pythonPackagesExtensions = prev.pythonPackagesExtensions ++ [
    (pyFinal: pyPrev: {
      glm53 = pyFinal.callPackage ../pkgs/glm53 { inherit glmLib; };
      exllamav3-glm53 = pyFinal.callPackage ../pkgs/exllamav3 { inherit glmLib; };
      vllm-glm53 = pyFinal.callPackage ../pkgs/vllm-glm53 { inherit glmLib; };
    })
  ];
  glm53 = final.python3Packages.toPythonApplication final.python3Packages.glm53;
  glm53-runtime = final.callPackage ../pkgs/glm53-runtime { inherit glmLib; };
}
