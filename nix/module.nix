# services.glm53: one GLM-5.3-Flash server. The vLLM engine runs as the recipe runs it: in the vendor image
# (nix/vendor-image.nix) through virtualisation.oci-containers, the GPUs handed over as CDI devices by the NVIDIA
# container toolkit. The exllamav3 engine (and vLLM from source, container = false) runs as a hardened native
# unit. The module only renders settings; `glm53` validates them (at build time through the settings check,
# again before start).
{ self, glmLib }:
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.glm53;
  packages = self.packages.${pkgs.stdenv.hostPlatform.system};
  # The server of each engine: vLLM's runtime (a stub until vLLM is pinned), or TabbyAPI + ExLlamaV3.
  enginePackages = {
    vllm = "glm53-runtime";
    exllamav3 = "glm53-exl3";
  };
  # The engine the profile runs (its ENGINE line; settings.ENGINE overrides it as for any key).
  profileEngine = cfg.settings.ENGINE or (glmLib.profileEngine cfg.profile);
  unit = builtins.fromJSON (builtins.readFile ../python/src/glm53/data/systemd-unit.json);
  envFile = pkgs.writeText "glm53-${cfg.profile}.env" (glmLib.renderEnvFile cfg.settings);
  glm53 = lib.getExe' cfg.package "glm53";
  # The CLI alone (no CUDA): it checks the settings at build time.
  cli = lib.getExe packages.glm53;
  # Fails the system build when a key is unknown to the profile, a value does not parse, or the address
  # is not loopback without listenAll: glm53 resolves the launch as it will at start. The CLI alone runs
  # it: the check needs neither the CUDA runtime nor a GPU on the building machine.
  checkedEnvFile = pkgs.runCommand "glm53-settings-checked" { } ''
    ${lib.escapeShellArgs (
      [ cli ]
      ++ glmLib.checkArgs {
        inherit (cfg) profile host port listenAll;
        inherit envFile;
      }
    )}
    ln -s ${envFile} $out
  '';
  # The native unit's command lines, escaped for systemd by the rule `glm53 systemd-unit` uses (lib.nix): the
  # settings and the key are credentials, so both renderers write the same ExecStart for the same install.
  args = glmLib.serveArgs {
    inherit (cfg) profile host port listenAll;
    modelDir = cfg.modelDir;
    envFile = glmLib.specifier "%d/env-file";
    apiKeyFile = if cfg.apiKeyFile == null then null else glmLib.specifier "%d/api-key";
  };
  doctorArgs = [
    glm53
    "doctor"
    "--profile"
    cfg.profile
    "--model-dir"
    cfg.modelDir
    "--host"
    cfg.host
    "--port"
    (toString cfg.port)
  ];

  # The container: the image's entrypoint is `glm53 serve --model-dir /model --host 0.0.0.0 --listen-all`
  # (nix/vendor-image.nix); the port is published on `host` only.
  inImage = {
    settings = "/etc/glm53/settings.env";
    apiKey = "/run/secrets/glm53-api-key";
  };
  containerCmd = [
    "--profile"
    cfg.profile
    "--env-file"
    inImage.settings
    "--port"
    (toString cfg.port)
  ]
  ++ lib.optionals (cfg.apiKeyFile != null) [
    "--api-key-file"
    inImage.apiKey
  ];
  containerService = "${config.virtualisation.oci-containers.backend}-glm53";
  # podman/docker fail a missing volume source with a bare "no such file or directory": say what it is first.
  requireModelDir = pkgs.writeShellScript "glm53-require-model-dir" ''
    if [ ! -d ${lib.escapeShellArg cfg.modelDir} ]; then
      echo ${
        lib.escapeShellArg "services.glm53: the checkpoint ${cfg.modelDir} (services.glm53.modelDir) is not a directory; download, verify and install it first (glm53 model download/verify/install, docs/checkpoint.md)"
      } >&2
      exit 1
    fi
  '';
in
{
  options.services.glm53 = {
    enable = lib.mkEnableOption "a GLM-5.3-Flash server (vLLM or TabbyAPI, with ExLlamaV3; CPU expert offload)";

    engine = lib.mkOption {
      type = lib.types.enum glmLib.engines;
      default = "vllm";
      example = "exllamav3";
      description = ''
        The serving engine: `vllm` (the recipe's vendor vLLM with ExLlamaV3 kernels), or `exllamav3`
        (TabbyAPI + ExLlamaV3, layer split with CPU expert offload). It picks the default package and
        profile; the profile must be one of this engine's (its ENGINE key), which an assertion checks.
      '';
    };

    container = lib.mkOption {
      type = lib.types.bool;
      default = cfg.engine == "vllm";
      defaultText = lib.literalExpression ''engine == "vllm"'';
      description = ''
        Run the server in `image` with podman or docker (virtualisation.oci-containers), the GPUs handed over as
        CDI devices (hardware.nvidia-container-toolkit, enabled here). The vllm engine's default: the recipe's
        engine is the vendor image (CUDA 13, torch 2.13), which no nixpkgs builds. false: a native, hardened unit
        running `package` (the exllamav3 engine; for vllm the from-source build, docs/nix.md).
      '';
    };

    image = lib.mkOption {
      type = lib.types.package;
      default = packages.image;
      defaultText = lib.literalExpression "glm53.packages.\${system}.image";
      description = "The image the container runs: the vendor vLLM image with glm53, ExLlamaV3 and the overlay on top.";
    };

    package = lib.mkOption {
      type = lib.types.package;
      default = packages.${enginePackages.${cfg.engine}};
      defaultText = lib.literalExpression ''
        if engine == "exllamav3" then glm53.packages.''${system}.glm53-exl3 else glm53.packages.''${system}.glm53-runtime'';
      description = "The server: glm53 with the engine's runtime (vLLM and ExLlamaV3, or TabbyAPI and ExLlamaV3).";
    };

    profile = lib.mkOption {
      type = lib.types.enum glmLib.profileNames;
      default = glmLib.defaultProfiles.${cfg.engine};
      defaultText = lib.literalExpression ''
        if engine == "exllamav3" then "${glmLib.defaultProfiles.exllamav3}" else "${glmLib.defaultProfiles.vllm}"'';
      description = "The validated profile whose argv and environment are launched; one of the engine's.";
    };

    # Strings, not Nix paths: a path literal would be copied into the world-readable store (the whole
    # checkpoint, or the API key), and the unit would then check one copy and serve another.
    modelDir = lib.mkOption {
      type = lib.types.externalPath;
      example = "/srv/models/glm53-flash-exl3-3.05bpw";
      description = "The checkpoint, verified against its lock and index-repaired (`glm53 model install`).";
    };

    settings = lib.mkOption {
      type = lib.types.attrsOf (
        lib.types.oneOf [
          lib.types.str
          lib.types.int
          lib.types.bool
          lib.types.float
        ]
      );
      default = { };
      example = {
        MAX_MODEL_LEN = 131072;
        PREFIX_CACHING = true;
      };
      description = ''
        Profile keys to override, by the recipe's own names (see docs/serve.md). Unknown keys fail the
        build with the closest valid names.
      '';
    };

    host = lib.mkOption {
      type = lib.types.str;
      default = glmLib.defaultHost;
      description = "Address to listen on (an IP address). Anything but loopback also needs listenAll.";
    };

    listenAll = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = ''
        Accept connections from other machines. glm53 refuses a host that is not loopback without it, at
        build time (the settings check) and at start; set apiKeyFile as well.
      '';
    };

    port = lib.mkOption {
      type = lib.types.port;
      default = glmLib.lock.runtime.port;
      description = "TCP port of the OpenAI-compatible API.";
    };

    settingsFile = lib.mkOption {
      type = lib.types.package;
      readOnly = true;
      default = checkedEnvFile;
      defaultText = lib.literalMD "`settings` rendered to KEY=VALUE lines, built only if `glm53 profile check` accepts them";
      description = "The settings file the unit reads; building it is the build-time settings check.";
    };

    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = "Open the port in the firewall.";
    };

    apiKeyFile = lib.mkOption {
      type = lib.types.nullOr lib.types.externalPath;
      default = null;
      example = "/run/secrets/glm53-api-key";
      description = ''
        File holding the API key (a string, not a Nix path: a path would be copied into the store); passed
        as a systemd credential, never through the store. Required with listenAll.
      '';
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        # The driver's kernel modules and userspace (libcuda): nixpkgs' nvidia module installs them for the
        # nvidia video driver or its datacenter driver, and says which in hardware.nvidia.enabled
        # (nixos/modules/hardware/video/nvidia.nix).
        assertion = config.hardware.nvidia.enabled;
        message = ''services.glm53 needs the NVIDIA driver: set services.xserver.videoDrivers = [ "nvidia" ]; (headless hosts too; hardware.nvidia.open to match your GPU), or hardware.nvidia.datacenter.enable = true; for the datacenter driver.'';
      }
      {
        assertion = cfg.listenAll -> cfg.apiKeyFile != null;
        message = "services.glm53.listenAll opens the server to other machines: set services.glm53.apiKeyFile too.";
      }
      {
        assertion = profileEngine == cfg.engine;
        message =
          let
            theirs = glmLib.profilesFor cfg.engine;
          in
          ''services.glm53.profile "${cfg.profile}" runs the ${profileEngine} engine, but services.glm53.engine is "${cfg.engine}": ''
          + ''set engine = "${profileEngine}", or a profile of the ${cfg.engine} engine (${
            if theirs == [ ] then "none is packaged" else lib.concatStringsSep ", " theirs
          }).'';
      }
    ];

    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall [ cfg.port ];

    # The native unit: the exllamav3 engine, or vLLM from source (container = false).
    systemd.services.glm53 = lib.mkIf (!cfg.container) {
      description = "GLM-5.3-Flash server (glm53, profile ${cfg.profile})";
      wantedBy = unit.install.WantedBy;
      after = unit.unit.After;
      # Bounded restarts: an unbounded crash loop of a 120 GB loader is a sustained memory storm.
      startLimitBurst = unit.unit.StartLimitBurst;
      startLimitIntervalSec = unit.unit.StartLimitIntervalSec;
      # glm53 finds the engine (vllm, TabbyAPI's python) on PATH; a NixOS unit's PATH is coreutils, findutils,
      # grep, sed and systemd only (nixos/lib/systemd-lib.nix), so the package's bin goes first, as
      # `glm53 systemd-unit` puts the installation's bin first.
      path = [ cfg.package ];
      environment = unit.environment // {
        # Where NixOS puts the driver's libraries (libcuda, libnvidia-ml): glm53 points Triton at libcuda there.
        LD_LIBRARY_PATH = "/run/opengl-driver/lib";
      };
      # The hardening and limits, with the reason for every loosening, live once in systemd-unit.json;
      # `glm53 systemd-unit` renders the same unit for hosts without NixOS.
      serviceConfig = unit.service // {
        ExecStartPre = glmLib.escapeExecArgs doctorArgs;
        ExecStart = glmLib.escapeExecArgs ([ glm53 ] ++ args ++ [ "--skip-preflight" ]);
        LoadCredential = [
          (glmLib.credential "env-file" cfg.settingsFile)
        ]
        ++ lib.optional (cfg.apiKeyFile != null) (glmLib.credential "api-key" cfg.apiKeyFile);
        # Optional ("-"): a missing checkpoint is reported by `glm53 doctor` in ExecStartPre, not by a failed
        # namespace setup (226/NAMESPACE) that never names it.
        ReadOnlyPaths = [ (glmLib.optionalPath cfg.modelDir) ];
      };
    };

    # The vLLM engine as the recipe runs it: the vendor image, with the recipe's container flags.
    hardware.nvidia-container-toolkit.enable = lib.mkIf cfg.container true;
    virtualisation.oci-containers.containers.glm53 = lib.mkIf cfg.container {
      image = "${cfg.image.imageName}:${cfg.image.imageTag}";
      imageFile = cfg.image;
      cmd = containerCmd;
      volumes = [
        "${cfg.modelDir}:/model:ro"
        "${cfg.settingsFile}:${inImage.settings}:ro"
      ]
      ++ lib.optional (cfg.apiKeyFile != null) "${cfg.apiKeyFile}:${inImage.apiKey}:ro";
      ports = [ "${cfg.host}:${toString cfg.port}:${toString cfg.port}" ];
      # Every GPU, as the CDI devices the container toolkit declares.
      devices = [ "nvidia.com/gpu=all" ];
      # The recipe's `docker run` flags: the workers' shared memory, the pinned expert pools, their stacks,
      # and ptrace for the workers' CUDA IPC.
      extraOptions = [
        "--ipc=host"
        "--ulimit=memlock=-1:-1"
        "--ulimit=stack=67108864"
        "--cap-add=SYS_PTRACE"
      ];
    };
    systemd.services.${containerService} = lib.mkIf cfg.container {
      startLimitBurst = unit.unit.StartLimitBurst;
      startLimitIntervalSec = unit.unit.StartLimitIntervalSec;
      serviceConfig = {
        ExecStartPre = lib.mkBefore [ "${requireModelDir}" ];
        # oci-containers restarts always, at once; the 120 GB loader gets the bounded restarts above.
        Restart = lib.mkForce unit.service.Restart;
        RestartSec = unit.service.RestartSec;
      };
    };
  };
}
