# Renders an example settings set and has glm53 validate it: what the NixOS module does at build time.
{
  runCommand,
  writeText,
  glm53,
  glmLib,
}:
let
  envFile = writeText "example.env" (
    glmLib.renderEnvFile {
      MAX_MODEL_LEN = 131072;
      PREFIX_CACHING = true;
    }
  );
in
runCommand "glm53-settings-render-check" { nativeBuildInputs = [ glm53 ]; } ''
  glm53 profile check --profile agent-256k --env-file ${envFile}
  touch $out
''
