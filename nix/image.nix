# The OCI image, streamed (the multi-GB tarball never lands in the store). Timestamps stay at
# nixpkgs' fixed epoch so two builds from one lock are bit-for-bit equal. One per engine: `package` is the
# server (glm53-runtime for vLLM, glm53-exl3 for exllamav3) and `command` how the entrypoint starts it.
{
  lib,
  dockerTools,
  cacert,
  bashInteractive,
  coreutils,
  glmLib,
  package,
  name ? "glm53",
  command ? [ (lib.getExe package) ],
  labels ? { },
}:
let
  # torch inductor calls getpass.getuser(), which needs a passwd entry; the server runs as this user.
  uid = 1000;
  home = "/var/cache/glm53";
  nss = dockerTools.fakeNss.override {
    extraPasswdLines = [ "glm53:x:${toString uid}:${toString uid}:glm53 server:${home}:/bin/sh" ];
    extraGroupLines = [ "glm53:x:${toString uid}:" ];
  };
in
dockerTools.streamLayeredImage {
  inherit name;
  tag = glmLib.version;
  contents = [
    package
    nss
    cacert
    bashInteractive
    coreutils
  ];
  extraCommands = ''
    mkdir -p tmp model .${home}
    # any uid (docker run --user) may write the caches, as /tmp
    chmod 1777 tmp .${home}
  '';
  config = {
    User = "${toString uid}:${toString uid}";
    WorkingDirectory = home;
    # Inside the container 0.0.0.0 is right: publish the port on the host's loopback only
    # (docker run -p 127.0.0.1:8000:8000 ...). The address flags are part of the entrypoint, so arguments
    # given to `docker run` (say --set MAX_MODEL_LEN=131072) add to them instead of replacing them.
    Entrypoint = command ++ [
      "--model-dir"
      "/model"
      "--host"
      "0.0.0.0"
      "--listen-all"
    ];
    Cmd = [ ];
    Env = [
      # Where container toolkits put the driver's libraries (NixOS, RHEL, Debian/Ubuntu); `glm53 serve`
      # finds libcuda.so.1 on this path and points Triton at it (TRITON_LIBCUDA_PATH) at start.
      "LD_LIBRARY_PATH=/run/opengl-driver/lib:/usr/lib64:/usr/lib/x86_64-linux-gnu"
      "SSL_CERT_FILE=${cacert}/etc/ssl/certs/ca-bundle.crt"
      "HOME=${home}"
      "XDG_CACHE_HOME=${home}"
      "HF_HUB_OFFLINE=1"
      "VLLM_NO_USAGE_STATS=1"
      "DO_NOT_TRACK=1"
    ];
    ExposedPorts."${toString glmLib.lock.runtime.port}/tcp" = { };
    Volumes."/model" = { };
    Labels = {
      "org.opencontainers.image.title" = name;
      "org.opencontainers.image.version" = glmLib.version;
      "io.glm53.checkpoint.revision" = glmLib.lock.checkpoint.revision;
      "io.glm53.exllamav3.rev" = glmLib.pins.exllamav3.rev;
    }
    // labels;
  };
}
