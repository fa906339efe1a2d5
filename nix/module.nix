# services.glm53: one GLM-5.3-Flash server as a hardened systemd unit. The module only renders
# settings; `glm53` validates them (at build time through the settings check, again before start).
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
  # Fails the system build when a key is unknown to the profile, a value does not parse, or the address
  # is not loopback without listenAll: glm53 resolves the launch as it will at start. The CLI alone runs
  # it: the check needs neither the CUDA runtime nor a GPU on the building machine.
  checkedEnvFile = pkgs.runCommand "glm53-settings-checked" { } ''
    ${lib.escapeShellArgs (
      [ (lib.getExe self.packages.${pkgs.stdenv.hostPlatform.system}.glm53) ]
      ++ glmLib.checkArgs {
        inherit (cfg) profile host port listenAll;
        inherit envFile;
      }
    )}
    ln -s ${envFile} $out
  '';
  args = glmLib.serveArgs {
    inherit (cfg) profile host port listenAll;
    modelDir = cfg.modelDir;
    envFile = cfg.settingsFile;
    apiKeyFile = if cfg.apiKeyFile == null then null else "%d/api-key";
  };
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
        # The unit needs the driver's kernel modules and userspace (libcuda), which NixOS installs only for
        # the nvidia video driver, headless hosts included.
        assertion = lib.elem "nvidia" config.services.xserver.videoDrivers;
        message = ''services.glm53 needs the NVIDIA driver: set services.xserver.videoDrivers = [ "nvidia" ]; (and hardware.nvidia.open to match your GPU).'';
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

    systemd.services.glm53 = {
      description = "GLM-5.3-Flash server (glm53, profile ${cfg.profile})";
      wantedBy = unit.install.WantedBy;
      after = unit.unit.After;
      # Bounded restarts: an unbounded crash loop of a 120 GB loader is a sustained memory storm.
      startLimitBurst = unit.unit.StartLimitBurst;
      startLimitIntervalSec = unit.unit.StartLimitIntervalSec;
      inherit (unit) environment;
      # The hardening and limits, with the reason for every loosening, live once in systemd-unit.json;
      # `glm53 systemd-unit` renders the same unit for hosts without NixOS.
      serviceConfig = unit.service // {
        ExecStartPre = lib.escapeShellArgs [
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
        ExecStart = lib.escapeShellArgs ([ glm53 ] ++ args ++ [ "--skip-preflight" ]);
        LoadCredential = lib.mkIf (cfg.apiKeyFile != null) [ "api-key:${cfg.apiKeyFile}" ];
        ReadOnlyPaths = [ cfg.modelDir ];
      };
    };
  };
}
