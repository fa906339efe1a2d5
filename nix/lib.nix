# Pure functions over repro.lock.json and service settings. They need no nixpkgs, so they are
# evaluated and tested with a bare `nix eval` (tests/test_nix.py); flake.nix and the module only wire them.
{
  lockFile ? ../repro.lock.json,
  # The packaged profiles (glm53's python/src/glm53/data/profiles); the tests pass a folder of their own.
  profilesDir ? ../python/src/glm53/data/profiles,
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

  nullFields =
    where: pin:
    map (field: "${where}.${field}") (
      builtins.filter (field: pin.${field} == null) [
        "rev"
        "hash"
      ]
    );
  cmakeSources = lock.engine.vllm_cmake_sources.sources;
  cmakeUnpinned = builtins.concatLists (
    map (name: nullFields "engine.vllm_cmake_sources.sources.${name}" cmakeSources.${name}) (
      builtins.attrNames cmakeSources
    )
  );

  imageHashUnpinned = if lock.engine.vllm.image.hash == null then [ "engine.vllm.image.hash" ] else [ ];

  # The source pins the from-source vLLM build (packages.vllm, glm53-runtime) needs and that are still null.
  vllmUnpinned =
    nullFields "engine.vllm" lock.engine.vllm
    ++ nullFields "engine.glm53_overlay" lock.engine.glm53_overlay
    ++ cmakeUnpinned;

  # What the vLLM engine as the recipe runs it (the vendor image with the overlay on top) still needs.
  imageUnpinned = imageHashUnpinned ++ nullFields "engine.glm53_overlay" lock.engine.glm53_overlay;

  # Every pin still null, by its lock field name (the same list, in the same order, as `glm53 repro show`
  # prints and `glm53 repro check --release` refuses).
  unpinned =
    nullFields "engine.vllm" lock.engine.vllm
    ++ imageHashUnpinned
    ++ nullFields "engine.glm53_overlay" lock.engine.glm53_overlay
    ++ nullFields "engine.tabbyapi" lock.engine.tabbyapi
    ++ cmakeUnpinned;

  # What an output is until its pins are filled: a derivation that evaluates (so `nix flake check` and
  # `nix flake show` work) and fails when built, naming the fields to fill. The exllamav3 engine's outputs
  # never are: everything they need is published.
  unpinnedStub =
    {
      name,
      system,
      fields ? vllmUnpinned,
    }:
    derivation {
      inherit name system;
      builder = "/bin/sh";
      args = [
        "-c"
        "echo 'repro.lock.json: ${builtins.concatStringsSep ", " fields} not pinned yet; fill them (glm53 repro show lists them and what fills each) before building ${name}' >&2; exit 1"
      ];
    };

  # systemd's quoting, for every value a unit takes from the user. The rule is nixpkgs'
  # escapeSystemdExecArg (nixos/lib/utils.nix): a JSON string, which systemd unquotes with C escapes, with
  # `%` doubled (no specifier expansion) and `$` doubled (no variable expansion). glm53's Python renderer
  # (glm53.serve.systemd) writes the same bytes; tests/test_systemd_escaping.py holds the two equal.
  # A control character is refused, as glm53 refuses it: systemd would read a different path than the one
  # given in ReadOnlyPaths= (no C escapes there).
  checkUnitText =
    what: text:
    if builtins.match ".*[[:cntrl:]].*" text != null then
      throw "glm53 unit: ${what} ${builtins.toJSON text} contains a control character (newline, tab, ...)"
    else
      text;
  escapeSpecifiers = builtins.replaceStrings [ "%" ] [ "%%" ];
  # A word that uses a specifier on purpose (`%d/api-key`): quoted, its `%` kept.
  specifier = text: { specifier = text; };
  argWord = value: if builtins.isAttrs value && value ? specifier then value else toString value;
  escapeExecArg =
    arg:
    if builtins.isAttrs arg && arg ? specifier then
      builtins.toJSON arg.specifier
    else
      builtins.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (builtins.toJSON (checkUnitText "argument" (toString arg)));
  escapeExecArgs = args: builtins.concatStringsSep " " (map escapeExecArg args);
  # ReadOnlyPaths= and the like: quoted, `%` doubled, `-` first so that a missing path does not fail the
  # unit's namespace setup (systemd.exec(5)) before ExecStartPre (glm53 doctor) can say what is missing.
  optionalPath = path: escapeSpecifiers (builtins.toJSON "-${checkUnitText "path" (toString path)}");
  # LoadCredential=ID:PATH (the path is taken to the end of the line, specifiers expanded).
  credential = id: path: "${id}:${escapeSpecifiers (checkUnitText "credential" (toString path))}";

  # A GitHub source pin's owner and repository, from its url (what fetchFromGitHub takes).
  githubRepo =
    field: url:
    let
      parts = builtins.match "https://github[.]com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)" url;
    in
    if parts == null then
      throw "repro.lock.json: ${field} must be https://github.com/OWNER/REPO, not ${url}"
    else
      {
        owner = builtins.elemAt parts 0;
        repo = builtins.elemAt parts 1;
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
      builtins.attrNames (builtins.readDir profilesDir)
    )
  );

  # The serving engines; a profile names its own with the ENGINE key (none: vllm).
  engines = [
    "vllm"
    "exllamav3"
  ];

  # The engine a packaged profile runs: its ENGINE line, `: "${ENGINE:=name}"` as the profiles write their
  # keys (or `ENGINE=name`). glm53 reads the same file and validates it (`glm53 profile check`, at build time
  # in the module); this only tells the module which package serves the profile.
  profileEngine =
    name:
    let
      file = "${toString profilesDir}/${name}.env";
      lines = builtins.filter builtins.isString (builtins.split "\n" (builtins.readFile file));
      value =
        line:
        let
          defaulted = builtins.match ''[[:space:]]*:[[:space:]]+"[$][{]ENGINE:=([^}"]*)[}]"[[:space:]]*'' line;
          assigned = builtins.match ''[[:space:]]*(export[[:space:]]+)?ENGINE=(["']?)([^"']*)(["']?)[[:space:]]*'' line;
        in
        if defaulted != null then
          defaulted
        else if assigned != null then
          [ (builtins.elemAt assigned 2) ]
        else
          [ ];
      values = builtins.concatMap value lines;
      engine = if values == [ ] then "vllm" else builtins.head values;
    in
    if builtins.length values > 1 then
      throw "glm53 profile ${name} (${file}): ENGINE is set more than once"
    else if !(builtins.elem engine engines) then
      throw "glm53 profile ${name} (${file}): ENGINE=${engine} is not one of ${builtins.concatStringsSep ", " engines}"
    else
      engine;

  # The packaged profiles of one engine.
  profilesFor = engine: builtins.filter (name: profileEngine name == engine) profileNames;

  # The profile each engine serves unless told otherwise.
  defaultProfiles = {
    vllm = lock.runtime.default_profile;
    exllamav3 = "exl3-2x3090";
  };

  # glm53's default listen address (glm53.constants.DEFAULT_HOST; the port is the lock's runtime.port), so that
  # the module and `glm53 serve` agree; tests/test_nix.py holds them equal.
  defaultHost = "127.0.0.1";

  # The address as given: whether it may be used (loopback, or any address with listenAll) is glm53's
  # rule, applied by the build-time check below and again at start; Nix does not decide it.
  addressArgs =
    {
      host ? defaultHost,
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
      host ? defaultHost,
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
      (argWord envFile)
    ]
    ++ addressArgs { inherit host port listenAll; }
    ++ (if apiKeyFile == null then [ ] else [ "--api-key-file" (argWord apiKeyFile) ]);

  # The build-time settings check: `glm53 profile check` resolves the same launch as `serve` would
  # (profile, env file, address), without reading the build machine.
  checkArgs =
    {
      profile,
      envFile,
      host ? defaultHost,
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
      tabbyapi
      cuda
      vllm_cmake_sources
      ;
    inherit (lock.nix) nixpkgs;
    inherit (lock) checkpoint router;
  };

  # TORCH_CUDA_ARCH_LIST of an engine's kernels: the lock's capabilities as written there ("8.0;8.6+PTX").
  torchArchList = engine: builtins.concatStringsSep ";" lock.engine.cuda.${engine}.capabilities;

  # The OCI config both serving images share (nix/image.nix, nix/vendor-image.nix). Inside the container
  # 0.0.0.0 is right: publish the port on the host's loopback only (docker run -p 127.0.0.1:8000:8000 ...).
  # The address flags are part of the entrypoint, so arguments given to `docker run` (say
  # --set MAX_MODEL_LEN=131072) add to them instead of replacing them.
  imageConfig =
    {
      # The image's title label.
      name,
      # How the entrypoint starts the server; the container's model and address flags follow.
      command,
      # nixpkgs' CA bundle (SSL_CERT_FILE).
      cacert,
      # PATH, for an image that does not inherit its base image's environment.
      path ? null,
      # HOME and XDG_CACHE_HOME: where the server's caches go.
      home ? null,
      labels ? { },
    }:
    let
      homeEnv =
        if home == null then
          [ ]
        else
          [
            "HOME=${home}"
            "XDG_CACHE_HOME=${home}"
          ];
    in
    {
      Entrypoint = command ++ [
        "--model-dir"
        "/model"
        "--host"
        "0.0.0.0"
        "--listen-all"
      ];
      Env =
        (if path == null then [ ] else [ "PATH=${path}" ])
        ++ [
          # Where container toolkits put the driver's libraries (NixOS, RHEL, Debian/Ubuntu): `glm53 serve` finds
          # libcuda.so.1 on this path and points Triton at it (TRITON_LIBCUDA_PATH) at start, and glm53's own
          # NVML reads (its preflight) look there.
          "LD_LIBRARY_PATH=/run/opengl-driver/lib:/usr/lib64:/usr/lib/x86_64-linux-gnu"
          "SSL_CERT_FILE=${cacert}/etc/ssl/certs/ca-bundle.crt"
        ]
        ++ homeEnv
        ++ [
          "HF_HUB_OFFLINE=1"
          "VLLM_NO_USAGE_STATS=1"
          "DO_NOT_TRACK=1"
        ];
      ExposedPorts."${toString lock.runtime.port}/tcp" = { };
      Volumes."/model" = { };
      Labels = {
        "org.opencontainers.image.title" = name;
        "org.opencontainers.image.version" = version;
        "io.glm53.checkpoint.revision" = lock.checkpoint.revision;
        "io.glm53.exllamav3.rev" = pins.exllamav3.rev;
      }
      // labels;
    };

  # Written once, in python/pyproject.toml; the Python package reads it from its installed metadata.
  version = (builtins.fromTOML (builtins.readFile ../python/pyproject.toml)).project.version;
in
{
  inherit
    lock
    pins
    requirePin
    unpinned
    vllmUnpinned
    imageUnpinned
    unpinnedStub
    escapeSpecifiers
    specifier
    escapeExecArg
    escapeExecArgs
    optionalPath
    credential
    torchArchList
    githubRepo
    renderEnvFile
    profileNames
    engines
    profileEngine
    profilesFor
    defaultProfiles
    serveArgs
    checkArgs
    defaultHost
    imageConfig
    version
    ;
}
