# Pure functions over repro.lock.json and service settings. They need no nixpkgs, so they are
# evaluated and tested with a bare `nix eval` (tests/test_nix.py); flake.nix and the module only wire them.
{
  lockFile ? ../repro.lock.json,
}:
let
  lock = builtins.fromJSON (builtins.readFile lockFile);

  # A pin the upstream project never published stays null in the lock; building from it must stop
  # with the lock field to fill in, not with a hash mismatch three hours into a CUDA build.
  requirePin =
    field: value:
    if value == null then
      throw "repro.lock.json: ${field} is not pinned yet; set it (full 40-hex commit or SRI hash) before building this output"
    else
      value;

  # The source pins still null, by their lock field names (the same list `glm53 repro show` prints).
  unpinned =
    let
      nullFields =
        where: pin:
        map (field: "${where}.${field}") (
          builtins.filter (field: pin.${field} == null) [
            "rev"
            "hash"
          ]
        );
      cmakeSources = lock.engine.vllm_cmake_sources.sources;
    in
    builtins.concatLists (
      map (name: nullFields "engine.${name}" lock.engine.${name}) [
        "vllm"
        "glm53_overlay"
      ]
      ++ map (
        name: nullFields "engine.vllm_cmake_sources.sources.${name}" cmakeSources.${name}
      ) (builtins.attrNames cmakeSources)
    );

  # What an output that needs an unpinned source is until the pins are filled: a derivation that evaluates
  # (so `nix flake check` and `nix flake show` work) and fails when built, naming the fields to fill.
  unpinnedStub =
    { name, system }:
    derivation {
      inherit name system;
      builder = "/bin/sh";
      args = [
        "-c"
        "echo 'repro.lock.json: ${builtins.concatStringsSep ", " unpinned} not pinned yet; fill them (glm53 repro show lists them) before building ${name}' >&2; exit 1"
      ];
    };

  isEnvKey = key: builtins.match "[A-Z][A-Z0-9_]*" key != null;

  renderValue =
    key: value:
    let
      text =
        if builtins.isBool value then
          (if value then "1" else "0")
        # toJSON, not toString: toString renders 0.94 as "0.940000".
        else if builtins.isFloat value then
          builtins.toJSON value
        else if builtins.isInt value || builtins.isString value then
          toString value
        else
          throw "glm53 settings: ${key} must be a string, number or boolean";
    in
    if builtins.match ".*[\n\r].*" text != null then
      throw "glm53 settings: ${key} must not contain a newline"
    else
      text;

  # `KEY=VALUE` lines, sorted by key: the format `glm53 serve --env-file` reads and validates
  # (unknown keys are an error there, so a typo in a NixOS config fails the build, not the start).
  renderEnvFile =
    settings:
    let
      keys = builtins.attrNames settings;
      bad = builtins.filter (key: !(isEnvKey key)) keys;
    in
    if bad != [ ] then
      throw "glm53 settings: invalid key(s) ${builtins.concatStringsSep ", " bad}; keys are the profile's upper-case names"
    else
      builtins.concatStringsSep "" (map (key: "${key}=${renderValue key settings.${key}}\n") keys);

  # The packaged profiles are the .env files glm53 ships: the module offers exactly those.
  profileNames = map (name: builtins.head (builtins.match "(.*)[.]env" name)) (
    builtins.filter (name: builtins.match ".*[.]env" name != null) (
      builtins.attrNames (builtins.readDir ../python/src/glm53/data/profiles)
    )
  );

  # The address as given: whether it may be used (loopback, or any address with listenAll) is glm53's
  # rule, applied by the build-time check below and again at start; Nix does not decide it.
  addressArgs =
    {
      host ? "127.0.0.1",
      port ? lock.runtime.port,
      listenAll ? false,
    }:
    [
      "--host"
      host
      "--port"
      (toString port)
    ]
    ++ (if listenAll then [ "--listen-all" ] else [ ]);

  # The command line a service runs; everything about the engine comes from the profile and env file.
  serveArgs =
    {
      profile,
      modelDir,
      envFile,
      host ? "127.0.0.1",
      port ? lock.runtime.port,
      listenAll ? false,
      apiKeyFile ? null,
    }:
    [
      "serve"
      "--profile"
      profile
      "--model-dir"
      (toString modelDir)
      "--env-file"
      (toString envFile)
    ]
    ++ addressArgs { inherit host port listenAll; }
    ++ (if apiKeyFile == null then [ ] else [ "--api-key-file" (toString apiKeyFile) ]);

  # The build-time settings check: `glm53 profile check` resolves the same launch as `serve` would
  # (profile, env file, address), without reading the build machine.
  checkArgs =
    {
      profile,
      envFile,
      host ? "127.0.0.1",
      port ? lock.runtime.port,
      listenAll ? false,
    }:
    [
      "profile"
      "check"
      "--profile"
      profile
      "--env-file"
      (toString envFile)
    ]
    ++ addressArgs { inherit host port listenAll; };

  pins = {
    inherit (lock.engine)
      vllm
      glm53_overlay
      exllamav3
      cuda
      vllm_cmake_sources
      ;
    inherit (lock.nix) nixpkgs;
    inherit (lock) checkpoint;
  };
in
{
  inherit
    lock
    pins
    requirePin
    unpinned
    unpinnedStub
    renderEnvFile
    profileNames
    serveArgs
    checkArgs
    ;
  version = "0.1.0";
}
