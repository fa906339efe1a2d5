# The exllamav3 engine's server: glm53's CLI told where TabbyAPI is (GLM53_TABBYAPI_DIR, the folder holding its
# main.py) and which Python runs it (GLM53_TABBYAPI_PYTHON, TabbyAPI's environment with ExLlamaV3), with that
# environment's bin on PATH, and `glm53-serve` (the app behind `nix run .#serve-exl3`). glm53 writes
# TabbyAPI's config.yml itself and runs it in a private working directory. No vLLM anywhere in its closure.
{
  lib,
  symlinkJoin,
  makeWrapper,
  writeShellApplication,
  glm53,
  tabbyapi,
  glmLib,
}:
let
  profile = glmLib.defaultProfiles.exllamav3;
  wrapped = symlinkJoin {
    name = "glm53-exl3-cli-${glmLib.version}";
    paths = [ glm53 ];
    nativeBuildInputs = [ makeWrapper ];
    postBuild = ''
      wrapProgram $out/bin/glm53 \
        --set GLM53_TABBYAPI_DIR ${tabbyapi}/${tabbyapi.dir} \
        --set GLM53_TABBYAPI_PYTHON ${tabbyapi.python.interpreter} \
        --prefix PATH : ${lib.makeBinPath [ tabbyapi.python ]} \
        --suffix LD_LIBRARY_PATH : /run/opengl-driver/lib
    '';
    meta.mainProgram = "glm53";
  };
  serve = writeShellApplication {
    name = "glm53-serve";
    runtimeInputs = [ wrapped ];
    text = ''
      exec glm53 serve --profile "''${GLM53_PROFILE:-${profile}}" "$@"
    '';
  };
in
symlinkJoin {
  name = "glm53-exl3-${glmLib.version}";
  paths = [
    wrapped
    serve
  ];
  passthru = {
    inherit tabbyapi;
    engine = "exllamav3";
  };
  meta = {
    description = "glm53 serving GLM-5.3-Flash with TabbyAPI and ExLlamaV3 (profile ${profile} by default)";
    mainProgram = "glm53";
    platforms = [ "x86_64-linux" ];
  };
}
