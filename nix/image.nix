# The OCI image, streamed (the multi-GB tarball never lands in the store). Timestamps stay at
# nixpkgs' fixed epoch so two builds from one lock are bit-for-bit equal.
{
  lib,
  dockerTools,
  cacert,
  bashInteractive,
  coreutils,
  glm53-runtime,
  glmLib,
}:
dockerTools.streamLayeredImage {
  name = "glm53";
  tag = glmLib.version;
  contents = [
    glm53-runtime
    cacert
    bashInteractive
    coreutils
  ];
  extraCommands = ''
    mkdir -p tmp model
    chmod 1777 tmp
  '';
  config = {
    # Inside the container 0.0.0.0 is right: publish the port on the host's loopback only
    # (docker run -p 127.0.0.1:8000:8000 ...), so the image passes the listen-all flag explicitly.
    Entrypoint = [ (lib.getExe glm53-runtime) ];
    Cmd = [
      "--model-dir"
      "/model"
      "--host"
      "0.0.0.0"
      "--listen-all"
    ];
    Env = [
      "LD_LIBRARY_PATH=/run/opengl-driver/lib:/usr/lib64:/usr/lib/x86_64-linux-gnu"
      "TRITON_LIBCUDA_PATH=/usr/lib64"
      "SSL_CERT_FILE=${cacert}/etc/ssl/certs/ca-bundle.crt"
      "HF_HUB_OFFLINE=1"
      "VLLM_NO_USAGE_STATS=1"
      "DO_NOT_TRACK=1"
    ];
    ExposedPorts."${toString glmLib.lock.runtime.port}/tcp" = { };
    Volumes."/model" = { };
    Labels = {
      "org.opencontainers.image.title" = "glm53";
      "org.opencontainers.image.version" = glmLib.version;
      "io.glm53.checkpoint.revision" = glmLib.lock.checkpoint.revision;
      "io.glm53.exllamav3.rev" = glmLib.pins.exllamav3.rev;
    };
  };
}
