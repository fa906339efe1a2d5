{
  description = "glm53: serve GLM-5.3-Flash (EXL3 3.05bpw) on consumer GPUs with CPU expert offload, reproducibly";

  # Must equal nix.nixpkgs in repro.lock.json; `glm53 repro check` fails when they drift apart.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  outputs =
    { self, nixpkgs }:
    let
      glmLib = import ./nix/lib.nix { lockFile = ./repro.lock.json; };
      systems = [ "x86_64-linux" ];
      forAllSystems =
        f:
        nixpkgs.lib.genAttrs systems (
          system:
          f (
            import ./nix/nixpkgs.nix {
              inherit nixpkgs system;
              overlay = self.overlays.default;
            }
          )
        );
    in
    {
      lib = glmLib;

      overlays.default = import ./nix/overlay.nix { inherit glmLib; };

      packages = forAllSystems (pkgs: {
        default = pkgs.glm53-runtime;
        glm53 = pkgs.glm53;
        glm53-runtime = pkgs.glm53-runtime;
        exllamav3 = pkgs.python3Packages.exllamav3-glm53;
        vllm = pkgs.python3Packages.vllm-glm53;
        image = pkgs.callPackage ./nix/image.nix { inherit glmLib; };
      });

      # `nix run github:...#default -- --model /path/to/checkpoint`: a one-shot server on 127.0.0.1.
      apps = forAllSystems (pkgs: {
        default = {
          type = "app";
          program = "${pkgs.glm53-runtime}/bin/glm53-serve";
        };
      });

      nixosModules.default = import ./nix/module.nix { inherit self glmLib; };

      checks = forAllSystems (pkgs: {
        # Only the pure layer and the CLI; the CUDA outputs are checked on GPU builders.
        glm53 = pkgs.glm53;
        settings-render = pkgs.callPackage ./nix/checks/settings-render.nix { inherit glmLib; };
      });

      formatter = forAllSystems (pkgs: pkgs.nixfmt-rfc-style);
    };
}
