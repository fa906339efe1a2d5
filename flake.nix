{
  description = "glm53: serve GLM-5.3-Flash (EXL3 3.05bpw) on consumer GPUs with CPU expert offload, reproducibly";

  # Must equal nix.nixpkgs in repro.lock.json; `glm53 repro check` fails when they drift apart.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-25.11";

  # cache.nixos.org builds nothing unfree, so nothing CUDA: the NixOS CUDA team's cache has nixpkgs' CUDA
  # packages for its default capabilities (this flake's sm_86 torch and vLLM still build locally).
  nixConfig = {
    extra-substituters = [ "https://cache.nixos-cuda.org" ];
    extra-trusted-public-keys = [ "cache.nixos-cuda.org:74DUi4Ye579gUqzH4ziL9IyiJBlDpMRn9MBN8oNan9M=" ];
  };

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

      packages = forAllSystems (
        pkgs:
        let
          # Outputs built from the vendor vLLM commit: stubs that fail with the lock fields to fill
          # while those pins are null, so that everything else evaluates and builds meanwhile.
          engine =
            name: drv:
            if glmLib.vllmUnpinned == [ ] then
              drv
            else
              glmLib.unpinnedStub {
                inherit name;
                inherit (pkgs.stdenv.hostPlatform) system;
              };
          runtime = engine "glm53-runtime" pkgs.glm53-runtime;
        in
        {
          default = runtime;
          glm53 = pkgs.glm53;
          glm53-runtime = runtime;
          exllamav3 = pkgs.python3Packages.exllamav3-glm53;
          vllm = engine "vllm-glm53" pkgs.python3Packages.vllm-glm53;
          image = engine "glm53-image" (
            pkgs.callPackage ./nix/image.nix {
              inherit glmLib;
              package = pkgs.glm53-runtime;
            }
          );

          # The exllamav3 engine (TabbyAPI + ExLlamaV3): every pin it needs is published, so these never
          # wait for the vLLM pins above.
          tabbyapi = pkgs.tabbyapi;
          glm53-exl3 = pkgs.glm53-exl3;
          image-exl3 = pkgs.callPackage ./nix/image.nix {
            inherit glmLib;
            package = pkgs.glm53-exl3;
            name = "glm53-exl3";
            command = [
              (pkgs.lib.getExe' pkgs.glm53-exl3 "glm53")
              "serve"
              "--profile"
              glmLib.defaultProfiles.exllamav3
            ];
            labels."io.glm53.tabbyapi.rev" = glmLib.pins.tabbyapi.rev;
          };
        }
      );

      # `nix run github:...#default -- --model-dir /path/to/checkpoint`: a one-shot server on 127.0.0.1.
      # `nix run .#glm53 -- doctor` (or model, plan, bench, repro ...): the CLI alone, no CUDA runtime.
      apps = forAllSystems (pkgs: {
        default = {
          type = "app";
          program = "${self.packages.${pkgs.stdenv.hostPlatform.system}.glm53-runtime}/bin/glm53-serve";
        };
        glm53 = {
          type = "app";
          program = "${pkgs.glm53}/bin/glm53";
        };
        # `nix run .#serve-exl3 -- --model-dir DIR`: TabbyAPI + ExLlamaV3, profile exl3-2x3090
        # (GLM53_PROFILE=exl3-1gpu, or --profile, for another).
        serve-exl3 = {
          type = "app";
          program = "${self.packages.${pkgs.stdenv.hostPlatform.system}.glm53-exl3}/bin/glm53-serve";
        };
      });

      # `nix develop`: the CLI's dependencies, the Nix formatter and Python's linters, no CUDA.
      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          inputsFrom = [ pkgs.glm53 ];
          packages = [
            pkgs.nixfmt
            pkgs.ruff
            pkgs.python3Packages.mypy
            pkgs.python3Packages.pytest
          ];
        };
      });

      nixosModules.default = import ./nix/module.nix { inherit self glmLib; };
      # services.glm53.router: vllm-router in front of several glm53 hosts (docs/router.md).
      nixosModules.router = import ./nix/router.nix { inherit self glmLib; };

      checks = forAllSystems (pkgs: {
        # Only the pure layer and the CLI; the CUDA outputs are checked on GPU builders.
        glm53 = pkgs.glm53;
        settings-render = pkgs.callPackage ./nix/checks/settings-render.nix { inherit glmLib; };
      });

      # nixfmt is the RFC 166 style since nixpkgs 25.11 (nixfmt-rfc-style is its deprecated alias).
      formatter = forAllSystems (pkgs: pkgs.nixfmt);
    };
}
