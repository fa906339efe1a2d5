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
  config =
    glmLib.imageConfig {
      inherit
        name
        command
        cacert
        home
        labels
        ;
    }
    // {
      User = "${toString uid}:${toString uid}";
      WorkingDirectory = home;
      Cmd = [ ];
    };
}
