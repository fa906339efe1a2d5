# services.glm53.router: vLLM's router (vllm-router) in front of a fleet of glm53 servers, as a hardened
# systemd unit. The module only renders the fleet file; `glm53 router` validates it (at build time through
# `glm53 router --dry-run`, again before start). Add it beside nix/module.nix in flake.nix's nixosModules.
{ self, glmLib }:
{
  config,
  lib,
  pkgs,
  ...
}:
let
  cfg = config.services.glm53.router;
  # The one hardening source, shared with services.glm53 and `glm53 systemd-unit`.
  unit = builtins.fromJSON (builtins.readFile ../python/src/glm53/data/systemd-unit.json);
  glm53 = lib.getExe' cfg.package "glm53";
  policies = [
    "consistent_hash"
    "sticky_least_loaded"
    "cache_aware"
    "power_of_two"
    "round_robin"
    "random"
  ];
  # The fleet file `glm53 router` reads (docs/router.md); `settings` lands on top (limits, health, retry,
  # metrics), so every field glm53 knows can be set and every unknown one fails the build.
  fleet = lib.recursiveUpdate {
    backends = map (url: { inherit url; }) cfg.backends;
    inherit (cfg) policy host port;
    listen_all = cfg.listenAll;
  } cfg.settings;
  fleetFile = pkgs.writeText "glm53-fleet.json" (builtins.toJSON fleet);
  # Fails the system build when glm53 refuses the fleet: an unknown policy or field, a duplicate or malformed
  # backend URL, a host that is not loopback without listenAll or without a key, flags the packaged
  # vllm-router does not know. It runs the unit's own package, so the vllm-router it checks the flags with is
  # the one the service starts (and a package without vllm-router fails here, not at every start). The key
  # itself is a runtime credential: the check uses a stand-in file.
  checkedFleetFile = pkgs.runCommand "glm53-fleet-checked" { } ''
    umask 077
    export XDG_CACHE_HOME="$PWD/cache" # the router's flag table is cached there, not under a HOME
    echo build-check > "$PWD/key"
    ${lib.escapeShellArgs (
      [
        glm53
        "router"
        "${fleetFile}"
        "--dry-run"
      ]
      ++ lib.optional cfg.listenAll "--listen-all"
    )} ${lib.optionalString (cfg.apiKeyFile != null) ''--api-key-file "$PWD/key"''} > /dev/null
    ln -s ${fleetFile} $out
  '';
in
{
  options.services.glm53.router = {
    enable = lib.mkEnableOption "vLLM's router in front of a fleet of glm53 servers";

    package = lib.mkOption {
      type = lib.types.package;
      default = self.packages.${pkgs.stdenv.hostPlatform.system}.glm53-router;
      defaultText = lib.literalExpression "glm53.packages.\${system}.glm53-router";
      description = ''
        glm53 with vllm-router in its Python environment (the router needs no GPU and no vLLM): glm53 starts
        the router as `python -m glm53.router.launcher`, so vllm-router must be importable by glm53's Python.
      '';
    };

    backends = lib.mkOption {
      type = lib.types.nonEmptyListOf lib.types.str;
      example = [
        "http://10.0.0.11:8000"
        "http://10.0.0.12:8000"
      ];
      description = "The glm53 servers' root URLs (scheme, host and port; no /v1).";
    };

    policy = lib.mkOption {
      type = lib.types.enum policies;
      default = "sticky_least_loaded";
      description = ''
        How a request picks its backend. sticky_least_loaded keeps every turn of a session (X-Session-ID
        header) on the box that holds its prefix in cache and puts a new session on the box with the fewest
        open ones; clients close a session with POST /finish_session (docs/scale-out.md).
      '';
    };

    host = lib.mkOption {
      type = lib.types.str;
      default = "127.0.0.1";
      description = "Address to listen on (an IP address). Anything but loopback also needs listenAll and apiKeyFile.";
    };

    port = lib.mkOption {
      type = lib.types.port;
      default = 8100;
      description = "TCP port of the router's OpenAI-compatible API.";
    };

    listenAll = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = "Accept connections from other machines (with host = \"0.0.0.0\"); needs apiKeyFile.";
    };

    apiKeyFile = lib.mkOption {
      type = lib.types.nullOr lib.types.externalPath;
      default = null;
      example = "/run/secrets/glm53-api-key";
      description = ''
        The key the backends are served with (services.glm53.apiKeyFile on each), a string, not a Nix path
        (never copied into the store); passed as a systemd credential. Required with listenAll.
      '';
    };

    openFirewall = lib.mkOption {
      type = lib.types.bool;
      default = false;
      description = "Open the router's port in the firewall.";
    };

    settings = lib.mkOption {
      type = lib.types.attrsOf lib.types.anything;
      default = { };
      example = {
        limits.queue_size = 32;
        health.interval_secs = 2;
      };
      description = "Further fleet-file fields (limits, health, retry, metrics, log_level; see docs/router.md).";
    };

    fleetFile = lib.mkOption {
      type = lib.types.package;
      readOnly = true;
      default = checkedFleetFile;
      defaultText = lib.literalMD "the rendered fleet file, built only if `glm53 router --dry-run` accepts it";
      description = "The fleet file the unit reads; building it is the build-time check.";
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = cfg.listenAll -> cfg.apiKeyFile != null;
        message = "services.glm53.router.listenAll opens the router to other machines: set services.glm53.router.apiKeyFile too.";
      }
    ];

    networking.firewall.allowedTCPPorts = lib.mkIf cfg.openFirewall [ cfg.port ];

    systemd.services.glm53-router = {
      description = "vLLM router in front of ${toString (builtins.length cfg.backends)} glm53 servers";
      wantedBy = unit.install.WantedBy;
      after = unit.unit.After ++ lib.optional config.services.glm53.enable or false "glm53.service";
      startLimitBurst = unit.unit.StartLimitBurst;
      startLimitIntervalSec = unit.unit.StartLimitIntervalSec;
      inherit (unit) environment;
      serviceConfig = unit.service // {
        # Tightened for the router, which touches no GPU: no device at all, no video/render groups. And it
        # is back in seconds, not after the 120 GB loader's RestartSec.
        DeviceAllow = [ ];
        SupplementaryGroups = [ ];
        RestartSec = 5;
        TimeoutStartSec = 120;
        # --skip-probe: at boot the backends may still be loading (minutes); the router waits for them itself.
        ExecStart = glmLib.escapeExecArgs (
          [
            glm53
            "router"
            "${cfg.fleetFile}"
            "--skip-probe"
          ]
          ++ lib.optional cfg.listenAll "--listen-all"
          ++ lib.optionals (cfg.apiKeyFile != null) [
            "--api-key-file"
            (glmLib.specifier "%d/api-key")
          ]
        );
        LoadCredential = lib.mkIf (cfg.apiKeyFile != null) [ (glmLib.credential "api-key" cfg.apiKeyFile) ];
      };
    };
  };
}
