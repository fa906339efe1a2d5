# `nix run .#default -- --model-dir DIR [glm53 serve arguments]`: the vLLM engine's image loaded into podman (or
# docker) and run with the recipe's container flags, every GPU as a CDI device, the port on 127.0.0.1 only.
{
  writeShellApplication,
  image,
  glmLib,
}:
let
  port = toString glmLib.lock.runtime.port;
in
writeShellApplication {
  name = "glm53-container";
  text = ''
    runtime=$(command -v podman || command -v docker || true)
    if [ -z "$runtime" ]; then
      echo "glm53-container: podman or docker is needed, with the NVIDIA container toolkit's CDI devices" >&2
      exit 3
    fi
    model=""
    args=()
    while [ "$#" -gt 0 ]; do
      case "$1" in
        --model-dir) model=''${2:-}; shift; [ "$#" -gt 0 ] && shift ;;
        --model-dir=*) model=''${1#--model-dir=}; shift ;;
        *) args+=("$1"); shift ;;
      esac
    done
    if [ -z "$model" ] || [ ! -d "$model" ]; then
      echo "glm53-container: --model-dir DIR must name the checkpoint's directory" >&2
      exit 2
    fi
    "$runtime" load -i ${image} >&2
    exec "$runtime" run --rm --device nvidia.com/gpu=all --ipc=host --ulimit memlock=-1:-1 \
      --ulimit stack=67108864 --cap-add SYS_PTRACE -p 127.0.0.1:${port}:${port} \
      -v "$(realpath "$model"):/model:ro" ${image.imageName}:${image.imageTag} "''${args[@]}"
  '';
}
