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
      # `pkgs` without CUDA, `pkgsCuda` with it, for the engine builds only (nix/nixpkgs.nix says why).
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
      # An output built from pins that are still null: a stub that evaluates and fails when built, naming the
      # lock fields to fill, so that everything else evaluates and builds meanwhile.
      pinned =
        pkgs: fields: name: drv:
        if fields == [ ] then
          drv
        else
          glmLib.unpinnedStub {
            inherit name fields;
            inherit (pkgs.stdenv.hostPlatform) system;
          };
    in
    {
      lib = glmLib;

      overlays.default = import ./nix/overlay.nix { inherit glmLib; };

      packages = forAllSystems (
        { pkgs, pkgsCuda }:
        let
          # The vLLM engine as the recipe runs it: the vendor image with the overlay, ExLlamaV3 and glm53. Its
          # name and tag are known before it can be built (the module and the app name the image by them).
          image =
            pinned pkgs glmLib.imageUnpinned "glm53-image" (
              pkgs.callPackage ./nix/vendor-image.nix { inherit glmLib; }
            )
            // {
              imageName = "glm53";
              imageTag = glmLib.version;
              # `glm53 repro resolve` builds this to learn the vendor image's hash (a placeholder here).
              probe = pkgs.callPackage ./nix/vendor-pull.nix {
                inherit glmLib;
                hash = pkgs.lib.fakeHash;
              };
            };
          # vLLM from source (the vendor commit on nixpkgs' recipe): for a nixpkgs whose torch and CUDA match
          # the vendor build, which nixos-25.11's do not (docs/nix.md).
          fromSource = pinned pkgsCuda glmLib.vllmUnpinned;
        in
        {
          default = image;
          inherit image;
          glm53 = pkgs.glm53;
          glm53-router = pkgs.glm53-router;
          vllm-router = pkgs.python3Packages.vllm-router;
          exllamav3 = pkgsCuda.python3Packages.exllamav3-glm53;
          vllm = fromSource "vllm-glm53" pkgsCuda.python3Packages.vllm-glm53;
          glm53-runtime = fromSource "glm53-runtime" pkgsCuda.glm53-runtime;

          # The exllamav3 engine (TabbyAPI + ExLlamaV3): every pin it needs is published, so these never
          # wait for the vLLM pins above.
          tabbyapi = pkgsCuda.tabbyapi;
          glm53-exl3 = pkgsCuda.glm53-exl3;
          image-exl3 = pkgsCuda.callPackage ./nix/image.nix {
            inherit glmLib;
            package = pkgsCuda.glm53-exl3;
            name = "glm53-exl3";
            command = [
              (pkgsCuda.lib.getExe' pkgsCuda.glm53-exl3 "glm53")
              "serve"
              "--profile"
              glmLib.defaultProfiles.exllamav3
            ];
            labels."io.glm53.tabbyapi.rev" = glmLib.pins.tabbyapi.rev;
          };
        }
      );

      apps = forAllSystems (
        { pkgs, ... }:
        let
          packages = self.packages.${pkgs.stdenv.hostPlatform.system};
        in
        {
          # `nix run .#default -- --model-dir DIR`: the vLLM engine's image in podman or docker, on 127.0.0.1.
          default = {
            type = "app";
            program = pkgs.lib.getExe (
              pkgs.callPackage ./nix/container-app.nix {
                inherit glmLib;
                inherit (packages) image;
              }
            );
          };
          # `nix run .#glm53 -- doctor` (or model, plan, bench, repro ...): the CLI alone, no CUDA.
          glm53 = {
            type = "app";
            program = "${packages.glm53}/bin/glm53";
          };
          # `nix run .#serve-exl3 -- --model-dir DIR`: TabbyAPI + ExLlamaV3, profile exl3-2x3090
          # (GLM53_PROFILE=exl3-1gpu, or --profile, for another).
          serve-exl3 = {
            type = "app";
            program = "${packages.glm53-exl3}/bin/glm53-serve";
          };
        }
      );

      # `nix develop`: the CLI's dependencies, the Nix formatter and Python's linters, no CUDA.
      devShells = forAllSystems (
        { pkgs, ... }:
        {
          default = pkgs.mkShell {
            inputsFrom = [ pkgs.glm53 ];
            packages = [
              pkgs.nixfmt
              pkgs.ruff
              pkgs.python3Packages.mypy
              pkgs.python3Packages.pytest
            ];
          };
        }
      );

      nixosModules.default = import ./nix/module.nix { inherit self glmLib; };
      # services.glm53.router: vllm-router in front of several glm53 hosts (docs/router.md).
      nixosModules.router = import ./nix/router.nix { inherit self glmLib; };

      # Only what needs no CUDA: the CLI, the router, the pure layer. The engines are checked on GPU builders.
      checks = forAllSystems (
        { pkgs, ... }:
        {
          glm53 = pkgs.glm53;
          glm53-router = pkgs.glm53-router;
          settings-render = pkgs.callPackage ./nix/checks/settings-render.nix { inherit glmLib; };
        }
      );

      # `nix fmt`: nixfmt over the repository's .nix files (nix/formatter.nix says why not nixfmt alone).
      formatter = forAllSystems ({ pkgs, ... }: pkgs.callPackage ./nix/formatter.nix { });
    };
}
